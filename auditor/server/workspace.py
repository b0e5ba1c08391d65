"""What the server knows: the configuration (as `loopaudit scan` reads it), each open document's
text and findings, and each project's facts.

When a document is opened or saved, its project is scanned as `loopaudit scan FILE` scans it (the
file inside the project around it, through the same cache), so that the editor shows what the command
shows, per-step reach across modules included; the other open documents of that project are
re-analysed with the new facts (a change in a helper can change what is per-step in the script that
calls it). While a document is edited and not saved, its text is analysed alone, with the facts of
its project's last scan: a few milliseconds to a few hundred for a long script.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from loopaudit.analysis.cross_module import ProjectFacts
from loopaudit.configuration.config_file import ConfigError, ConfigFinder
from loopaudit.configuration.discovery import SourceFile
from loopaudit.configuration.project_context import context_files
from loopaudit.configuration.settings import Settings
from loopaudit.findings.finding import Finding
from loopaudit.scan.cache import ResultCache, default_folder
from loopaudit.scan.engine import analyze_source
from loopaudit.scan.notebooks import is_notebook, located, notebook_from_cells
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.project_scan import analyze_many


@dataclass
class Document:
    path: str
    text: str
    findings: list[Finding] = field(default_factory=list)


class Workspace:
    def __init__(self) -> None:
        self.settings = Settings(ConfigFinder(None, isolated=False))
        self.documents: dict[str, Document] = {}  # by URI
        self.facts: dict[str, ProjectFacts] = {}  # by path, from the last project scan
        self.problem: str | None = None  # a configuration that cannot be read, said once
        # A notebook's cells, by cell URI: their lines and findings (rows in the cell), for quick
        # fixes and hovers.
        self.cells: dict[str, tuple[list[str], list[Finding]]] = {}

    def shown(self, uri: str) -> tuple[list[str], list[Finding]] | None:
        """The lines and findings of a document or a notebook cell the editor shows."""
        document = self.documents.get(uri)
        if document is not None:
            return document.text.split("\n"), document.findings
        return self.cells.get(uri)

    def analysable(self, path: str) -> bool:
        """A Python file opened as text (a notebook comes as a notebook document, cell by cell)."""
        return path.endswith(".py") and not is_notebook(path)

    def open(self, uri: str, path: str, text: str) -> list[str]:
        """A document was opened or saved: its project scanned, and the URIs whose findings changed."""
        self.documents[uri] = Document(path, text)
        self._scan_project(path)
        return self._reanalyse_project_of(path)

    def change(self, uri: str, text: str) -> None:
        document = self.documents.get(uri)
        if document is not None:
            document.text = text
            document.findings = self._analyse(document)

    def close(self, uri: str) -> None:
        self.documents.pop(uri, None)

    def notebook(self, path: str, cells: list[tuple[str, bool, str]]) -> dict[str, list[Finding]]:
        """A notebook the editor holds, as (cell URI, is code, text) in order: its code cells analysed
        as `loopaudit scan` analyses a notebook file, the findings by cell URI (rows in the cell)."""
        notebook = notebook_from_cells([(code, text) for _, code, text in cells])
        options = self._options(path)
        if options is None:
            return {}
        analysis = analyze_source(notebook.text, path, options, explicit=True, facts=self.facts.get(path), path=path)
        by_cell: dict[str, list[Finding]] = {uri: [] for uri, code, _ in cells if code}
        for finding in located(analysis.findings, notebook):
            if finding.cell is not None:
                by_cell.setdefault(cells[finding.cell - 1][0], []).append(finding)
        return by_cell

    def _options(self, path: str) -> ScanOptions | None:
        """The file's scan options from its configuration; None (and the problem noted) when that
        configuration cannot be read."""
        try:
            return self.settings.options_for(Path(path))
        except ConfigError as error:
            self.problem = str(error)
            return None

    def _analyse(self, document: Document) -> list[Finding]:
        options = self._options(document.path)
        if options is None:
            return []
        analysis = analyze_source(
            document.text,
            document.path,
            options,
            explicit=True,
            facts=self.facts.get(document.path),
            path=document.path,
        )
        return analysis.findings

    def _scan_project(self, path: str) -> None:
        """The facts `loopaudit scan PATH` would use: PATH inside its project, through the cache."""
        named = [SourceFile(path, path, True)]
        try:
            context = context_files([path], named, lambda candidate: self.settings.excluded(candidate))
            items = [
                (source.path, source.path, source.explicit, self.settings.options_for(Path(source.path)))
                for source in named + context
            ]
        except ConfigError as error:
            self.problem = str(error)
            return
        cache: ResultCache | None = ResultCache(default_folder(self.settings.finder.for_folder(Path(path).parent).root))
        if cache is not None and cache.prepare() is not None:
            cache = None  # a folder it may not write: scanned without a cache
        results = analyze_many(items, os.cpu_count() or 1, None, cache)
        self.facts.update(results.facts)

    def _reanalyse_project_of(self, path: str) -> list[str]:
        """Every open document that the last scan has facts for (its project's), analysed again."""
        changed = []
        for uri, document in self.documents.items():
            if document.path == path or document.path in self.facts:
                document.findings = self._analyse(document)
                changed.append(uri)
        return changed
