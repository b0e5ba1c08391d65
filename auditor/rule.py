"""What a rule is: a code, its documentation, its examples, and a check over nodes it asked for.

A rule never walks the tree. It names the node types it wants (`node_types`); the engine's one
traversal collects them, and calls `check` for each one that sits on the per-step path of a module
that targets CUDA (unless the rule says it does not need either). `check` yields the nodes to report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import libcst as cst

if TYPE_CHECKING:
    from .context import RuleContext


@dataclass(frozen=True)
class Report:
    node: cst.CSTNode
    message: str | None = None  # overrides the rule's message when the trigger deserves naming


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

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        raise NotImplementedError
        yield  # pragma: no cover


class FileRule(Rule):
    """A rule the engine itself reports about a whole file (cannot read it, cannot parse it)."""

    needs_step = False
    needs_cuda = False
