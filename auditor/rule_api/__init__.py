"""The rule API: everything a rule may use, in one place. A file under `rules/` imports from
`loopaudit.rule_api` and from other rule files, nothing else of loopaudit (tests/test_rule_api.py).

- The contract (rule.py): `Rule` and its kinds (`FileRule`, `RuntimeRule`), what a check yields
  (`Report`, `Fix`, `Group`) and what a runtime rule observes (`Observation`).
- What a check may ask (context.py): `RuleContext`, whose members `index`, `steps` and `tensors` are
  the analysis model's `ModuleIndex`, `StepModel` and `TensorInference`, asked through their public
  methods only.
- The analysis vocabulary (`loopaudit.analysis`): names, node walks, patterns, tensor kinds.
- Building fixes (edits.py): rewriting a call's arguments, keeping the user's formatting.
- For the measured rules, what a run or a trace says (`RunEvidence`, `TraceAnalysis`, `describe_site`,
  `steps_phrase`). These load on first use: every scan loads every rule class, and the evidence
  modules would cost each scan 30 ms for rules it never runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loopaudit.analysis import (
    BATCH_FETCH,
    CPU_COUNT,
    EVALUATION_FUNCTION,
    FORWARD_CALLEE,
    UNKNOWN,
    FrameKind,
    Kind,
    LoopInfo,
    ModuleIndex,
    Scope,
    StepModel,
    TensorInference,
    argument_for,
    command_line_default,
    constant,
    counts_cpus,
    dotted_name,
    drawn_from,
    holds,
    is_inference_method,
    is_training_call,
    iter_subtree,
    next_of,
    runs_a_model,
    target_names,
    terminal_name,
    type_test,
    unwrap_iterable,
)
from loopaudit.rule_api.context import RuleContext
from loopaudit.rule_api.edits import TRUE, keyword_value, with_first_argument, with_keyword, without_argument
from loopaudit.rule_api.rule import FileRule, Fix, Group, Observation, Report, Rule, RuntimeRule

if TYPE_CHECKING:
    from loopaudit.profiling.in_loopaudit.evidence import RunEvidence, describe_site
    from loopaudit.profiling.in_loopaudit.timing import steps_phrase
    from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis

_MEASURED = {
    "RunEvidence": "loopaudit.profiling.in_loopaudit.evidence",
    "describe_site": "loopaudit.profiling.in_loopaudit.evidence",
    "steps_phrase": "loopaudit.profiling.in_loopaudit.timing",
    "TraceAnalysis": "loopaudit.profiling.in_loopaudit.trace_analysis",
}


def __getattr__(name: str) -> Any:
    """The measured rules' names, imported when a rule first asks for one (PEP 562)."""
    if name in _MEASURED:
        return getattr(importlib.import_module(_MEASURED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # the analysis model
    "BATCH_FETCH",
    "CPU_COUNT",
    "EVALUATION_FUNCTION",
    "FORWARD_CALLEE",
    # building fixes
    "TRUE",
    "UNKNOWN",
    # the contract
    "FileRule",
    "Fix",
    "FrameKind",
    "Group",
    "Kind",
    "LoopInfo",
    "ModuleIndex",
    "Observation",
    "Report",
    "Rule",
    "RuleContext",
    # the measured rules
    "RunEvidence",
    "RuntimeRule",
    "Scope",
    "StepModel",
    "TensorInference",
    "TraceAnalysis",
    "argument_for",
    "command_line_default",
    "constant",
    "counts_cpus",
    "describe_site",
    "dotted_name",
    "drawn_from",
    "holds",
    "is_inference_method",
    "is_training_call",
    "iter_subtree",
    "keyword_value",
    "next_of",
    "runs_a_model",
    "steps_phrase",
    "target_names",
    "terminal_name",
    "type_test",
    "unwrap_iterable",
    "with_first_argument",
    "with_keyword",
    "without_argument",
]
