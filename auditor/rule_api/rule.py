"""What a rule is: a code, its documentation, its examples, and a check over nodes it asked for.

A rule never walks the tree. It names the node types it wants (`node_types`); the engine's one
traversal collects them, and calls `check` for each one that sits on the per-step path of a module
that targets CUDA (unless the rule says it does not need either). `check` yields the nodes to report.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import libcst as cst

if TYPE_CHECKING:
    from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
    from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
    from loopaudit.rule_api.context import RuleContext


@dataclass(frozen=True)
class Fix:
    """How to rewrite the reported code: each (node in the tree, node to write in its place)."""

    description: str  # "add `pin_memory=True`", shown in the summary and the JSON
    replacements: tuple[tuple[cst.CSTNode, cst.CSTNode], ...]
    # Safe: what the code computes stays the same (applied by --fix). Unsafe: it changes behaviour
    # in a way the user must accept (applied only with --unsafe-fixes).
    safe: bool = True


@dataclass(frozen=True)
class Group:
    """Reports that are one problem, fixed together: the `.item()` reads of one step (stack them and
    read once), the uses of one boolean mask. The engine reports the reports of one rule in one file
    whose groups have equal keys as one finding, at the earliest line; the other lines become the
    finding's `related` places, and its message ends with what the group says of them: "...; and 3
    more reads in this step, lines 58, 61, 64: stack them and read once". A report suppressed on its
    line (`# noqa`) is dropped before grouping, so it is neither the finding nor one of its lines."""

    key: Hashable  # equal keys are one problem; compared within one file's analysis (a Frame will do)
    noun: str  # one of the places, in the singular: "read" ("and 3 more reads")
    where: str  # what the places share: "in this step", "of this mask in this step"
    advice: str  # how to fix them together: "stack them and read once"


@dataclass(frozen=True)
class Report:
    node: cst.CSTNode
    message: str | None = None  # overrides the rule's message when the trigger deserves naming
    # A grouped report carries no fix: its finding keeps the first report's fix alone.
    fix: Fix | None = None
    group: Group | None = None  # None: a problem of its own
    suggestion: str | None = None  # replaces the rule's `suggestion` when the shape reported calls for other advice
    # Other places of the same problem, each with what it is ("the tensor is built here"): shown as the
    # finding's related places (a tensor built on one line and moved on another is one problem, and the
    # fix goes where it is built). A place on the reported line itself is left out.
    places: tuple[tuple[cst.CSTNode, str], ...] = ()


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]  # kebab-case, stable: used by `loopaudit rule` and the docs
    summary: ClassVar[str]  # one line for `loopaudit rules` and the README table
    message: ClassVar[str]  # what the finding says
    suggestion: ClassVar[str]  # what to write instead, one or two lines

    # Documentation, in the order `loopaudit rule CODE` prints it.
    what_it_flags: ClassVar[str]
    why_it_costs: ClassVar[str]
    example: ClassVar[str]
    use_instead: ClassVar[str]
    fix_safety: ClassVar[str]

    # Examples that the test suite runs: each VALID must produce no finding of this rule; each
    # INVALID must produce exactly the findings marked on its lines with `# expect: CODE`.
    valid: ClassVar[tuple[str, ...]] = ()
    invalid: ClassVar[tuple[str, ...]] = ()

    node_types: ClassVar[tuple[type[cst.CSTNode], ...]] = ()
    needs_step: ClassVar[bool] = True  # report only on the per-step path
    needs_cuda: ClassVar[bool] = True  # report only in modules that target CUDA
    # For a rule that can report outside any training loop (needs_step = False and no step loop
    # needed at all, like a deprecated API): a regular expression that every file it can report on
    # matches. Files found in folders are then parsed when they match it, step loop or not. Rules
    # without a hint are prefiltered like the rest: the file must look like it has a step loop.
    text_hint: ClassVar[str | None] = None
    # Runtime rules (LA6xx) that confirm this rule's finding when `loopaudit run` reports one of
    # them at a line of the finding, and whether that can happen on a machine without CUDA.
    confirmed_by: ClassVar[tuple[str, ...]] = ()
    confirmable_on_cpu: ClassVar[bool] = True

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        raise NotImplementedError
        yield  # pragma: no cover


class FileRule(Rule):
    """A rule the engine itself reports, not a check of nodes: about a whole file (cannot read it,
    cannot parse it) or about its suppression comments."""

    needs_step = False
    needs_cuda = False
    # Said whatever --select says (a file that was not checked must never pass as clean); only
    # --ignore silences it.
    always_selected: ClassVar[bool] = True


@dataclass(frozen=True)
class Observation:
    """What a runtime rule measured at one place, before it becomes a Finding."""

    file: str  # as the script's process saw it (absolute), or as a trace recorded it
    line: int | None  # None: the finding is about the whole run or trace
    message: str
    # What was measured: count per measured step, total count, time in milliseconds (None where it
    # cannot be known, as the stall of a sync on a machine without a GPU), plus rule-specific keys.
    observed: dict[str, Any]
    suggestion: str | None = None  # replaces the rule's generic one when the measurement says more
    details: dict[str, Any] = field(default_factory=dict)  # extra JSON keys: the live DataLoader settings, ...


@dataclass
class Undecided:
    """A runtime rule's verdict that the measurement could not settle: the estimate's interval
    straddles the rule's threshold. Shown with the run's report, never a finding: a gate must not
    fail on noise, nor pass it off as clean."""

    message: str  # what was measured, with its interval, and what would settle it


class RuntimeRule(Rule):
    """A rule checked by measuring rather than reading: `loopaudit run` runs the script and hands
    the rule its evidence; `loopaudit analyze` hands it an existing profiler trace.

    VALID and INVALID examples are whole scripts, which the test suite runs under `loopaudit run`
    on the machine it has (INVALID lines are marked `# expect: CODE`). A rule that can only be seen
    on a GPU also carries trace examples (kineto JSON), which `loopaudit analyze` reads anywhere.
    """

    needs_step = False
    needs_cuda = False
    requires_cuda: ClassVar[bool] = False  # its script examples show only on a CUDA machine
    needs_trace: ClassVar[bool] = False  # it reads the profiler trace: its script examples run with --profile
    valid_traces: ClassVar[tuple[str, ...]] = ()
    invalid_traces: ClassVar[tuple[str, ...]] = ()
    # The share of the step spent waiting for batches above which the rule reports: `loopaudit run`
    # measures on (up to --max-steps) until that share's interval lies on one side of it.
    data_wait_threshold: ClassVar[float | None] = None

    def from_run(self, run: RunEvidence) -> Iterator[Observation | Undecided]:
        return iter(())

    def from_trace(self, trace: TraceAnalysis) -> Iterator[Observation]:
        return iter(())
