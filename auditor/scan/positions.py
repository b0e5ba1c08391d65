"""Line and column of the few nodes a file reports, without printing the whole module.

libcst knows where a node is only by printing code: its PositionProvider prints the whole module
(and MetadataWrapper walks the whole tree once more before), which on a large model file costs more
than the analysis that found the one line to report. Here each reported node is placed by printing,
with positions recorded, only the smallest statement around it whose text occurs exactly once in the
file. A statement printed with the indentation of the blocks it sits in gives exactly its text in the
file, so a text that occurs once can only occur there; the positions inside follow from where it
starts. When no enclosing statement's text is unique, the whole module is printed, as libcst's own
provider does. Either way the positions are libcst's: a test compares them with PositionProvider's.

Fixes are turned into text edits the same way: the statement around the rewritten node is printed
with the rewrite, in place of its text (report_to_finding.py).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from loopaudit.analysis.lines import line_starts
from loopaudit.analysis.walk import parent_map


@dataclass(frozen=True)
class Placed:
    """A statement found in the text: where its printed text starts, the text, and the indentation
    of the blocks it sits in (what printing it again, rewritten, needs)."""

    statement: cst.CSTNode
    offset: int
    code: str
    indent: tuple[str, ...]


def _header_end(statement: cst.CSTNode | None) -> cst.CSTNode | None:
    """The last node of a compound statement's header (before its colon), where it has one."""
    if isinstance(statement, (cst.If, cst.While)):
        return statement.test
    if isinstance(statement, cst.For):
        return statement.iter
    if isinstance(statement, cst.With) and statement.items:
        return statement.items[-1]
    return None


class Positions:
    """CodeRange (PositionProvider's kind: syntax, without the whitespace around it) of any node of
    one module, computed for the nodes asked about."""

    def __init__(self, module: cst.Module, text: str) -> None:
        self.module = module
        self.source = text
        # The last statement prints its newline even when the file has none (Module drops it at the
        # end), so it is looked for in the text with that newline.
        self._searched = text if module.has_trailing_newline or not module.body else text + module.default_newline
        self._known: dict[cst.CSTNode, CodeRange] = {}
        self._parents: dict[cst.CSTNode, cst.CSTNode] | None = None
        self._starts: list[int] | None = None
        self._attempts: dict[cst.CSTNode, Placed | None] = {}  # statements printed, placed or not

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        found = self._known.get(node)
        if found is None:
            if self.place(node) is None or node not in self._known:
                self._print_whole()
            found = self._known[node]
        return found

    def line_of(self, node: cst.CSTNode) -> int:
        return self[node].start.line

    def place(self, node: cst.CSTNode, *, above: cst.CSTNode | None = None) -> Placed | None:
        """The smallest statement holding `node` whose text occurs once in the file, printed with
        positions; None if there is none. `above`: a statement holding `node` that the one placed
        must hold too, and not be."""
        passed = above is None
        for statement, indent in self._statements_around(node):
            if not passed:
                passed = statement is above
                continue
            if statement not in self._attempts:
                self._attempts[statement] = self._print_in_place(statement, indent)
            placed = self._attempts[statement]
            if placed is not None:
                return placed
        return None

    def innermost_statement(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The smallest statement of a block that holds `node` (or is it)."""
        return next((statement for statement, _ in self._statements_around(node)), None)

    def suppression_rows(self, node: cst.CSTNode) -> range:
        """The lines whose `# noqa` applies to a finding at `node`: those of the simple statement
        holding it (a comment after the closing parenthesis of a call spread over lines counts), or
        of the header of the `if`/`while`/`for`/`with` whose condition or iterable holds it; else the
        node's own lines."""
        span = self[node]
        first, last = span.start.line, span.end.line
        statement = self.innermost_statement(node)
        if isinstance(statement, cst.SimpleStatementLine):
            around = self[statement]
            return range(min(first, around.start.line), max(last, around.end.line) + 1)
        header = _header_end(statement)
        if header is not None and last <= self[header].end.line:
            # The header ends on the colon's line, which a parenthesized condition can push below its
            # last token (the parentheses are not part of the expression's range): the line before
            # the body's first statement and the comments above it.
            block = cast(cst.If, statement).body
            header_end = self[header].end.line
            if isinstance(block, cst.IndentedBlock) and block.body:
                opening = block.body[0]
                comments = len(getattr(opening, "leading_lines", ()))  # every statement kind has them
                header_end = max(header_end, self[opening].start.line - 1 - comments)
            return range(min(first, self[cast(cst.CSTNode, statement)].start.line), header_end + 1)
        return range(first, last + 1)

    def _statements_around(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, tuple[str, ...]]]:
        """The statements of a block that hold `node`, innermost first, each with the indentation
        its lines are printed with. An `elif` is not one: printed alone it would read `if`."""
        parents = self._parent_map()
        chain = []
        current: cst.CSTNode | None = node
        while current is not None:
            chain.append(current)
            current = parents.get(current)
        chain.reverse()  # module first
        indent: list[str] = []
        found = []
        for position, ancestor in enumerate(chain):
            parent = chain[position - 1] if position else None
            if isinstance(ancestor, cst.IndentedBlock):
                indent.append(self.module.default_indent if ancestor.indent is None else ancestor.indent)
            elif isinstance(ancestor, cst.BaseStatement) and isinstance(parent, (cst.Module, cst.IndentedBlock)):
                found.append((ancestor, tuple(indent)))
        return reversed(found)

    def _print_in_place(self, statement: cst.CSTNode, indent: tuple[str, ...]) -> Placed | None:
        recorder = _Recorder()
        try:
            state = PositionProvidingCodegenState(
                default_indent=self.module.default_indent,
                default_newline=self.module.default_newline,
                provider=cast(PositionProvider, recorder),  # it writes only `_computed`
                indent_tokens=list(indent),
            )
            code = _print(statement, state)
        except Exception:  # libcst's code generation changed: the whole module is printed instead
            return None
        offset = self._searched.find(code)
        if not code or offset < 0 or self._searched.find(code, offset + 1) >= 0:
            return None
        if offset and self._searched[offset - 1] not in "\r\n":
            return None  # a statement's text starts a line
        shift = self._line_of_offset(offset) - 1
        for each, where in recorder._computed.items():
            if each not in self._known:
                self._known[each] = CodeRange(
                    CodePosition(where.start.line + shift, where.start.column),
                    CodePosition(where.end.line + shift, where.end.column),
                )
        return Placed(statement, offset, code, indent)

    def _print_whole(self) -> None:
        try:
            recorder = _Recorder()
            state = PositionProvidingCodegenState(
                default_indent=self.module.default_indent,
                default_newline=self.module.default_newline,
                provider=cast(PositionProvider, recorder),  # it writes only `_computed`
            )
            self.module._codegen(state)
            self._known.update(recorder._computed)
        except Exception:  # libcst's code generation changed: its public provider still works
            self._known.update(MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider))

    @property
    def line_starts(self) -> list[int]:
        """Offset of each line's first character in the file's text (also what fix edits locate)."""
        if self._starts is None:
            self._starts = line_starts(self.source)
        return self._starts

    def _line_of_offset(self, offset: int) -> int:
        return bisect.bisect_right(self.line_starts, offset)

    def _parent_map(self) -> dict[cst.CSTNode, cst.CSTNode]:
        if self._parents is None:
            self._parents = _parents_of(self.module)
        return self._parents


# The parent maps of the modules placed last: a project scan analyses a module again in later rounds
# with the same tree (engine.py keeps recent parses), and builds its map once.
_RECENT_PARENTS: OrderedDict[int, tuple[cst.Module, dict[cst.CSTNode, cst.CSTNode]]] = OrderedDict()


def _parents_of(module: cst.Module) -> dict[cst.CSTNode, cst.CSTNode]:
    recent = _RECENT_PARENTS.get(id(module))
    if recent is not None and recent[0] is module:
        _RECENT_PARENTS.move_to_end(id(module))
        return recent[1]
    parents = parent_map(module)
    _RECENT_PARENTS[id(module)] = (module, parents)
    while len(_RECENT_PARENTS) > 4:
        _RECENT_PARENTS.popitem(last=False)
    return parents


class _Recorder:
    """What PositionProvidingCodegenState writes positions into (a provider's `_computed`)."""

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}


def _print(statement: cst.CSTNode, state: CodegenState) -> str:
    statement._codegen(state)
    return "".join(state.tokens)


def print_rewritten(placed: Placed, rewritten: cst.CSTNode | cst.RemovalSentinel, module: cst.Module) -> str:
    """The text of a placed statement after a rewrite, printed as it would be in the module."""
    if isinstance(rewritten, cst.RemovalSentinel):
        return ""
    state = CodegenState(
        default_indent=module.default_indent, default_newline=module.default_newline, indent_tokens=list(placed.indent)
    )
    return _print(rewritten, state)
