"""The rule API: everything a rule may use, in one place. A file under `rules/` imports from
`loopaudit.rule_api` and from other rule files, nothing else of loopaudit (tests/test_rule_api.py).

- The contract (rule.py): `Rule` and its kinds (`FileRule`, `RuntimeRule`), what a check yields
  (`Report`, `Fix`, `Group`) and what a runtime rule observes (`Observation`) or cannot decide
  (`Undecided`).
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

import loopaudit.analysis as _analysis
from loopaudit.analysis import *  # noqa: F403 (the analysis model's public names, as analysis/__init__.py declares them)
from loopaudit.rule_api.context import RuleContext
from loopaudit.rule_api.edits import TRUE, is_true, keyword_value, with_first_argument, with_keyword, without_argument
from loopaudit.rule_api.rule import FileRule, Fix, Group, Observation, Report, Rule, RuntimeRule, Undecided

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


# the contract
__all__ = ["FileRule", "Fix", "Group", "Observation", "Report", "Rule", "RuleContext", "RuntimeRule", "Undecided"]
# building fixes
__all__ += ["TRUE", "is_true", "keyword_value", "with_first_argument", "with_keyword", "without_argument"]
# the measured rules
__all__ += ["RunEvidence", "TraceAnalysis", "describe_site", "steps_phrase"]
# the analysis model
__all__ += _analysis.__all__
