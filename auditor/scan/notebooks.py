"""Jupyter notebooks scanned like scripts: their code cells joined into one module, the findings put
back at their cell and line (`train.ipynb:cell 3:2:5`), and fixes written into the cells they change.

Reading. nbformat reads and validates the notebook (a file that is not one is LA002). The code
cells, in order, become one text, each preceded by a separator comment, so that a fix cannot merge
two cells and the text can be split back. IPython syntax that is not Python is neutralized line for
line, so that line numbers hold: a cell magic (`%%time` first) blanks its whole cell; a line magic or
shell line (`%matplotlib inline`, `!pip install x`) becomes `pass` at its indentation, marked with
its index so that a rewritten cell gets it back.

Cells are numbered from 1 in the order the notebook holds them, markdown and raw cells included, so
that the number is the one an editor's cell counter shows (and ruff's).

Writing. A fixed notebook is written only if the file reads back the same when re-serialized
untouched (its indentation, key order and non-ASCII text are then reproducible): the changed cells'
sources are replaced, in the notebook's own line form, and every other byte (outputs, metadata,
other cells) stays. A notebook whose layout would not survive is left alone, and says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from loopaudit.findings.finding import Edit, Finding, Location, Related

_SEPARATOR = "# loopaudit-cell {number}"
_SEPARATOR_LINE = re.compile(r"^# loopaudit-cell (\d+)$")
_PLACEHOLDER = "pass  # loopaudit-ipython {index}"
_PLACEHOLDER_LINE = re.compile(r"^(\s*)pass  # loopaudit-ipython (\d+)$")
# A cell magic's lines: comments, so that the cell analyses as empty; each restored by its index.
_MAGIC_CELL_LINE = "# loopaudit-cell-magic {index}"
_MAGIC_CELL_LINE_MATCH = re.compile(r"^# loopaudit-cell-magic (\d+)$")


class NotebookError(ValueError):
    """Not a notebook that can be read: the message says why (shown as LA002)."""


@dataclass
class Notebook:
    text: str  # the code cells as one module
    # For each line of `text` (index 0 is line 1): (cell number, line in the cell); (0, 0) for the
    # separator lines, which belong to no cell.
    places: list[tuple[int, int]]
    document: dict[str, Any]  # the notebook's JSON, keys in the file's order
    raw: str  # the file's text
    ipython_lines: list[str]  # the lines neutralized, by their placeholder's index

    def cell_of(self, row: int) -> tuple[int, int]:
        return self.places[row - 1] if 0 < row <= len(self.places) else (0, row)


def is_notebook(path: str) -> bool:
    return path.endswith(".ipynb")


def notebook_from_cells(cells: list[tuple[bool, str]]) -> Notebook:
    """A notebook an editor holds, as (is a code cell, its text) in order: joined as a file's are."""
    document = {
        "cells": [{"cell_type": "code" if code else "markdown", "source": text} for code, text in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 4,
    }
    return _joined(document, json.dumps(document))


def read_notebook(data: bytes) -> Notebook:
    try:
        raw = data.decode("utf-8")
        document = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as error:
        raise NotebookError(f"not a notebook: not JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("cells"), list):
        raise NotebookError("not a notebook: no list of cells")
    import warnings

    import nbformat  # here: a scan of scripts alone never loads it

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbformat's notes on missing cell ids and the like
            nbformat.validate(nbformat.from_dict(document))
    except (nbformat.ValidationError, KeyError, TypeError, AttributeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise NotebookError(f"not a valid notebook (nbformat: {first})") from None
    return _joined(document, raw)


def _joined(document: dict[str, Any], raw: str) -> Notebook:
    """The code cells of a validated notebook as one module, with the map back to the cells."""
    lines: list[str] = []
    places: list[tuple[int, int]] = []
    ipython: list[str] = []
    for number, cell in enumerate(document["cells"], 1):
        if cell.get("cell_type") != "code":
            continue
        lines.append(_SEPARATOR.format(number=number))
        places.append((0, 0))
        source = _source_text(cell)
        cell_lines = source.split("\n")
        if source.endswith("\n"):
            cell_lines.pop()
        magic_cell = bool(cell_lines) and cell_lines[0].lstrip().startswith("%%")
        for index, line in enumerate(cell_lines, 1):
            stripped = line.lstrip()
            if magic_cell:
                ipython.append(line)
                line = _MAGIC_CELL_LINE.format(index=len(ipython) - 1)
            elif stripped.startswith(("%", "!")) or (stripped.endswith("?") and not stripped.startswith("#")):
                indent = line[: len(line) - len(stripped)]
                line = indent + _PLACEHOLDER.format(index=len(ipython))
                ipython.append(stripped)
            lines.append(line)
            places.append((number, index))
    return Notebook("\n".join(lines) + "\n" if lines else "", places, document, raw, ipython)


def code_cells(notebook: Notebook) -> list[tuple[int, str]]:
    """(cell number, source) of the notebook's code cells."""
    cells = notebook.document["cells"]
    return [(number, _source_text(cell)) for number, cell in enumerate(cells, 1) if cell.get("cell_type") == "code"]


def _source_text(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def located(findings: list[Finding], notebook: Notebook) -> list[Finding]:
    """The findings of the joined text, at their cells and lines."""
    return [_located(finding, notebook) for finding in findings]


def _in_cell(notebook: Notebook, start: Location, end: Location) -> tuple[int, Location, Location, bool]:
    """A span of the joined text in its cell: (cell, start, end, whether it ends in that cell). A span
    running into the next cell is cut at its start."""
    cell, row = notebook.cell_of(start.row)
    end_cell, end_row = notebook.cell_of(end.row)
    start = Location(row, start.column)
    inside = end_cell == cell
    return cell, start, Location(end_row, end.column) if inside else start, inside


def _located(finding: Finding, notebook: Notebook) -> Finding:
    cell, start, end, _ = _in_cell(notebook, finding.location, finding.end_location)
    fix = finding.fix
    if fix is not None:
        # The edits' places in the cell (their offsets stay the joined text's, which --fix applies);
        # a fix that would reach into another cell is not offered.
        edits: list[Edit] = []
        for edit in fix.edits:
            edit_cell, edit_start, edit_end, inside = _in_cell(notebook, edit.location, edit.end_location)
            if edit_cell != cell or not inside:
                edits = []
                break
            edits.append(replace(edit, location=edit_start, end_location=edit_end))
        fix = replace(fix, edits=tuple(edits)) if edits else None
    return replace(
        finding,
        fix=fix,
        cell=cell or None,
        location=start,
        end_location=end,
        related=tuple(_located_place(place, notebook) for place in finding.related),
        context=_cells_in(finding.context, notebook),
    )


def _located_place(place: Related, notebook: Notebook) -> Related:
    cell, start, end, _ = _in_cell(notebook, place.location, place.end_location)
    return replace(place, cell=cell or None, location=start, end_location=end)


_LINE_MENTION = re.compile(r"\((?P<file>[^()]*?):(?P<row>\d+)\)|\bline (?P<bare>\d+)\b")


def _cells_in(context: str | None, notebook: Notebook) -> str | None:
    """ "step loop `for x in loader` (train.ipynb:42)" -> "(train.ipynb:cell 3:7)": the lines a
    finding's chain names, in cells too."""
    if not context:
        return context

    def moved(match: re.Match) -> str:
        if match.group("bare") is not None:
            cell, row = notebook.cell_of(int(match.group("bare")))
            return f"cell {cell}, line {row}" if cell else match.group(0)
        cell, row = notebook.cell_of(int(match.group("row")))
        return f"({match.group('file')}:cell {cell}:{row})" if cell else match.group(0)

    return _LINE_MENTION.sub(moved, context)


def with_new_text(notebook: Notebook, text: str) -> bytes:
    """The notebook's file with its code cells' sources taken from `text` (the joined text after
    fixes), every other byte as it was. NotebookError when the cells cannot be told apart in `text` or
    the file's layout cannot be reproduced."""
    indent = _indent_of(notebook.raw)
    untouched = _dumps(notebook.document, indent, notebook.raw)
    if untouched != notebook.raw:
        raise NotebookError("its JSON layout cannot be written back unchanged; fix it by hand")
    sources = _split_cells(notebook, text)
    for number, cell_text in sources.items():
        cell = notebook.document["cells"][number - 1]
        if cell_text == _source_text(cell):
            continue
        cell["source"] = cell_text.splitlines(keepends=True) if isinstance(cell["source"], list) else cell_text
    return _dumps(notebook.document, indent, notebook.raw).encode("utf-8")


def _split_cells(notebook: Notebook, text: str) -> dict[int, str]:
    """Cell number -> its source, from the joined text, IPython lines restored."""
    cells: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in (text[:-1] if text.endswith("\n") else text).split("\n"):
        separator = _SEPARATOR_LINE.match(line)
        if separator:
            current = cells.setdefault(int(separator.group(1)), [])
            continue
        if current is None:
            if line.strip():
                raise NotebookError("a fix moved code out of its cell; fix it by hand")
            continue
        current.append(line)
    expected = [number for number, (cell, _) in enumerate(notebook.places) if cell == 0]
    if len(cells) != len(expected):
        raise NotebookError("a fix merged two cells; fix it by hand")
    restored: dict[int, str] = {}
    for number, lines in sorted(cells.items()):
        out = []
        for line in lines:
            placeholder = _PLACEHOLDER_LINE.match(line)
            magic = _MAGIC_CELL_LINE_MATCH.match(line)
            if placeholder:
                out.append(placeholder.group(1) + notebook.ipython_lines[int(placeholder.group(2))])
            elif magic:
                out.append(notebook.ipython_lines[int(magic.group(1))])
            else:
                out.append(line)
        original = _source_text(notebook.document["cells"][number - 1])
        restored[number] = "\n".join(out) + ("\n" if original.endswith("\n") else "")
    return restored


def _indent_of(raw: str) -> int | None:
    match = re.search(r"\n( +)\S", raw)
    return len(match.group(1)) if match else None


def _dumps(document: dict, indent: int | None, raw: str) -> str:
    ascii_only = "\\u" in raw and not any(ord(c) > 127 for c in raw)
    text = json.dumps(document, indent=indent, ensure_ascii=ascii_only)
    return text + "\n" if raw.endswith("\n") else text
