"""A text check that rules a file out before it is parsed.

Parsing is most of a scan's cost (libcst builds a full syntax tree), and in a large repository most
Python files cannot contain a finding: they never mention torch, or contain no loop and no step hook.
This check runs in microseconds and errs on the side of parsing. It applies to files found by walking
folders; files named on the command line are always parsed, so their syntax errors are reported.
"""

from __future__ import annotations

import re

# What a step loop or step hook needs to exist (see stepmodel.py): a training call, a loader, a
# framework hook, a `for` whose variable or bound counts steps, or a `while` whose test does.
_STEP_HINT = re.compile(
    r"\.backward\(|\.step\(|[lL]oader\b|\b(?:training_step|validation_step|test_step|predict_step|"
    r"compute_loss|prediction_step)\b|"
    r"^[ \t]*for\b[^\n:]*?\b(?:step|steps|it|iter|iteration|itr|global_step|batch_?idx|\w+_step|i_iter)\b[^\n:]*?\bin\b|"
    r"\brange\([^\n]*?(?:steps|iters|iterations|batches|iter_num)|"
    r"^[ \t]*while\b[^\n]*?(?:step|iter)",
    re.M,
)
_WHILE_TRUE_WITH_NEXT = re.compile(r"^[ \t]*while\s+True\b", re.M)
_CUDA_HINT = re.compile(r"cuda|nccl|Accelerator|Fabric|Lightning|Trainer")


def may_contain_findings(text: str, *, only_cuda_rules: bool, extra_hooks: frozenset[str] = frozenset()) -> bool:
    if "torch" not in text:
        return False
    if only_cuda_rules and not _CUDA_HINT.search(text):
        return False
    if any(hook in text for hook in extra_hooks):
        return True
    if _STEP_HINT.search(text) is not None:
        return True
    return "next(" in text and _WHILE_TRUE_WITH_NEXT.search(text) is not None
