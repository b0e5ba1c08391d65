"""A text check that rules a file out before it is parsed.

Parsing is most of a scan's cost (libcst builds a full syntax tree), and in a large repository most
Python files cannot contain a finding: they never mention torch, or contain no loop and no step hook.
This check runs in microseconds and errs on the side of parsing. It applies to files found by walking
folders; files named on the command line are always parsed, so their syntax errors are reported.
"""

from __future__ import annotations

import re

_STEP_HINT = re.compile(
    r"\.backward\(|zero_grad\(|\.step\(|[lL]oader|\b(?:training_step|validation_step|test_step|"
    r"predict_step|compute_loss|prediction_step)\b|^[ \t]*for\b[^\n]*(?:step|iter|batch)[^\n]*\bin\b|"
    r"^[ \t]*while\b",
    re.M,
)
_CUDA_HINT = re.compile(r"cuda|nccl|Accelerator|Fabric|Lightning|Trainer")


def may_contain_findings(text: str, *, only_cuda_rules: bool, extra_hooks: frozenset[str] = frozenset()) -> bool:
    if "torch" not in text:
        return False
    if only_cuda_rules and not _CUDA_HINT.search(text):
        return False
    if any(hook in text for hook in extra_hooks):
        return True
    return _STEP_HINT.search(text) is not None
