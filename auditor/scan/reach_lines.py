"""Line numbers in "how this line is reached" texts, filled in only where a finding shows them.

A module's summary says, for each call it makes into another module once per step, why that call
runs per step: "step loop `for x, y in loader` (train.py:120) → `train_step()` (train.py:124)". Line
numbers cost a position pass over the whole syntax tree (as much as half a parse), and most such
texts never reach a finding. So the summary writes a mark where each line number goes (the file
and the node's place in the module's walk, which a new parse of the same text reproduces), and the
marks are resolved at the end, only in the texts that findings show.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from contextlib import contextmanager

import libcst as cst
from libcst._nodes.internal import CodegenState  # the base libcst's own PositionProvider extends
from libcst.metadata import MetadataWrapper, PositionProvider

from loopaudit.analysis.module_index import ModuleIndex, build_index
from loopaudit.scan.form_feeds import without_leading_form_feeds
from loopaudit.scan.python_check import too_complex_for_python

_MARK = re.compile(r"⟦([^⟦⟧|]+)\|(loop|function|call)\|(\d+)⟧")
# A path may hold the mark's own delimiters (`tr|ai⟧n.py` is a legal name): written escaped in it.
_IN_MARK = {"%": "%25", "|": "%7C", "⟦": "%5B", "⟧": "%5D"}
_FROM_MARK = {escaped: character for character, escaped in _IN_MARK.items()}
_ESCAPED = re.compile("|".join(_FROM_MARK))


class LineMarks:
    """Marks for the line numbers of one module's loops, functions and calls."""

    def __init__(self, index: ModuleIndex, path: str) -> None:
        self.index = index
        self.path = path
        self._places: dict[int, tuple[str, int]] | None = None
        self._marked_path = "".join(_IN_MARK.get(character, character) for character in path)

    def line_of(self, node: cst.CSTNode) -> str:
        if self._places is None:
            self._places = {id(each): (kind, ordinal) for kind, ordinal, each in _places(self.index)}
        place = self._places.get(id(node))
        if place is None:
            return "?"
        return f"⟦{self._marked_path}|{place[0]}|{place[1]}⟧"


# A file's line numbers by place in its walk: (kind, ordinal) -> line.
FileLines = dict[tuple[str, int], int]


class LineResolver:
    """Replaces marks with line numbers, parsing each file they point into once (or reading its
    line numbers from `cache`, a ResultCache, by the file's contents)."""

    def __init__(self, cache=None) -> None:
        self._lines: dict[str, FileLines | None] = {}
        self._cache = cache

    def __call__(self, text: str | None) -> str | None:
        if text is None or "⟦" not in text:
            return text
        return _MARK.sub(self._line, text)

    def _line(self, match: re.Match) -> str:
        lines = self._file_lines(_ESCAPED.sub(lambda escaped: _FROM_MARK[escaped.group()], match.group(1)))
        line = lines.get((match.group(2), int(match.group(3)))) if lines is not None else None
        return str(line) if line is not None else "?"

    def _file_lines(self, path: str) -> FileLines | None:
        if path not in self._lines:
            key = self._cache.lines_key(path) if self._cache is not None else None
            lines = self._cache.get(key, FileLines) if key is not None else None
            if lines is None:
                lines = _lines_of(path)
                if key is not None and lines is not None:
                    self._cache.put(key, lines, FileLines)
            self._lines[path] = lines
        return self._lines[path]


def _lines_of(path: str) -> FileLines | None:
    """Parsed as the analysis parsed it (engine.py): its encoding, CPython's limits, form feeds."""
    try:
        with open(path, "rb") as stream:
            data = stream.read()
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text, _ = without_leading_form_feeds(data.decode(encoding))
        if too_complex_for_python(text) is not None:
            return None
        module = cst.parse_module(text)
    except Exception:  # the file changed or vanished since it was scanned: no line, no crash
        return None
    places = list(_places(build_index(module, ())))
    lines = start_lines(module)
    return {(kind, ordinal): lines[id(node)] for kind, ordinal, node in places if id(node) in lines}


class _LineCountingState(CodegenState):
    """Code generation that only counts lines, and notes the line where each node's syntax starts
    (what PositionProvider reports as `start.line`, without its columns and ranges)."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = 1
        self.starts: dict[int, int] = {}

    def add_token(self, value: str) -> None:
        self.line += value.count("\n")  # the tokens themselves are not kept: only the count is needed

    def pop_trailing_newline(self) -> None:
        pass

    @contextmanager
    def record_syntactic_position(self, node, *, start_node=None, end_node=None) -> Iterator[None]:
        start = self.line
        yield
        self.starts[id(node)] = self.starts.get(id(start_node), start) if start_node is not None else start


def start_lines(module: cst.Module) -> dict[int, int]:
    """id(node) -> the line its syntax starts on, for every node of the module: as PositionProvider's
    `start.line`, about eight times faster (measured on torch's 9,000-line distributed_test.py)."""
    try:
        state = _LineCountingState(module)
        module._codegen(state)
        return state.starts
    except Exception:  # libcst's code generation changed: fall back to its public provider
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        return {id(node): code_range.start.line for node, code_range in positions.items()}


def _places(index: ModuleIndex):
    """(kind, ordinal, node) for the nodes a mark can point at, in the walk's order."""
    for kind, nodes in (
        ("loop", [loop.node for loop in index.loops]),
        ("function", [function.node for function in index.functions]),
        ("call", [site.call for site in index.calls]),
    ):
        for ordinal, node in enumerate(nodes):
            yield kind, ordinal, node
