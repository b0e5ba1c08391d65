"""Analyse one file: read, (maybe) parse once, walk once, apply every enabled rule, report.

Positions are the one expensive piece of metadata (libcst computes them for the whole tree at once),
so they are computed only for files that have something to report, after the rules have run
(report_to_finding.py). Many files, as one project, are scanned by project_scan.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import sys
import tokenize
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import libcst as cst

from loopaudit.analysis.cross_module import ModuleSummary, ProjectFacts
from loopaudit.analysis.device import targets_cuda
from loopaudit.analysis.lines import source_lines
from loopaudit.analysis.module_index import ModuleIndex, build_index
from loopaudit.analysis.stepmodel import StepModel, StepReason
from loopaudit.analysis.summarize import summarize
from loopaudit.analysis.tensors import TensorInference
from loopaudit.findings.finding import Finding, Location, rule_url
from loopaudit.rule_api.context import RuleContext
from loopaudit.rule_api.registry import rule_by_code
from loopaudit.rule_api.rule import Report, Rule
from loopaudit.scan import collector
from loopaudit.scan.form_feeds import without_leading_form_feeds
from loopaudit.scan.notebooks import NotebookError, is_notebook, located, read_notebook
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.positions import Positions
from loopaudit.scan.prefilter import may_contain_findings
from loopaudit.scan.python_check import Refusal, python_refusal, too_complex_for_python
from loopaudit.scan.reach_lines import LineMarks
from loopaudit.scan.report_to_finding import call_describer, to_findings
from loopaudit.scan.suppression import suppressions, unused

# The rules the engine itself reports about whole files (rules/files/), by code: the engine finds
# them through the registry, as the docs do, and imports no rule module.
UNREADABLE_FILE, SYNTAX_ERROR, NOT_ANALYSED = "LA002", "LA001", "LA003"
UNUSED_SUPPRESSION = "LA004"  # a line, not a whole file: reported with the findings
FILE_CODES = frozenset({UNREADABLE_FILE, SYNTAX_ERROR, NOT_ANALYSED})  # about a whole file: no line to comment


@dataclass
class FileAnalysis:
    findings: list[Finding]
    # In a project-wide scan (facts given): what the module tells the other modules (cross_module.py).
    summary: ModuleSummary | None = None


def analyze_path(
    path: str, display_name: str, options: ScanOptions, *, explicit: bool, facts: ProjectFacts | None = None
) -> list[Finding]:
    """Read and analyse one file; never raises for anything in the file itself."""
    return analyze_file(path, display_name, options, explicit=explicit, facts=facts).findings


def analyze_file(
    path: str, display_name: str, options: ScanOptions, *, explicit: bool, facts: ProjectFacts | None = None
) -> FileAnalysis:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            # A FIFO or device named *.py would block or never end: only regular files are read.
            return FileAnalysis(file_problem(UNREADABLE_FILE, display_name, options, "not a regular file"))
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        return FileAnalysis(
            file_problem(UNREADABLE_FILE, display_name, options, f"cannot read the file: {error.strerror or error}")
        )
    return _analyze_bytes(data, display_name, options, explicit, facts, path)


def analyze_bytes(data: bytes, display_name: str, options: ScanOptions, *, explicit: bool) -> list[Finding]:
    return _analyze_bytes(data, display_name, options, explicit, None).findings


def _analyze_bytes(
    data: bytes,
    display_name: str,
    options: ScanOptions,
    explicit: bool,
    facts: ProjectFacts | None,
    path: str | None = None,
) -> FileAnalysis:
    if is_notebook(path or display_name):
        return _analyze_notebook(data, display_name, options, explicit, facts, path)
    if b"\0" in data:
        problem = "binary file (it contains NUL bytes), not Python source"
        return FileAnalysis(file_problem(UNREADABLE_FILE, display_name, options, problem))
    try:
        # Python's own rule: UTF-8 unless a PEP 263 `# -*- coding: ... -*-` line says otherwise.
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError) as error:
        reason = str(error).split(" for ")[0] or "invalid encoding"  # drop the temporary file name
        return FileAnalysis(
            file_problem(UNREADABLE_FILE, display_name, options, f"not readable as Python source: {reason}")
        )
    except UnicodeDecodeError as error:
        problem = f"not {error.encoding} text (byte {error.start} cannot be decoded)"
        return FileAnalysis(file_problem(UNREADABLE_FILE, display_name, options, problem))
    return analyze_source(text, display_name, options, explicit=explicit, facts=facts, path=path)


def _analyze_notebook(
    data: bytes,
    display_name: str,
    options: ScanOptions,
    explicit: bool,
    facts: ProjectFacts | None,
    path: str | None,
) -> FileAnalysis:
    """A notebook's code cells as one module (notebooks.py), the findings at their cells."""
    try:
        notebook = read_notebook(data)
    except NotebookError as error:
        return FileAnalysis(file_problem(UNREADABLE_FILE, display_name, options, str(error)))
    analysis = analyze_source(notebook.text, display_name, options, explicit=explicit, facts=facts, path=path)
    return FileAnalysis(located(analysis.findings, notebook), analysis.summary)


def passes_prefilter(text: str, options: ScanOptions, in_project: bool = False) -> bool:
    """Could any of the enabled rules report something in `text`? (See prefilter.py.)"""
    source_rules = [rule for rule in options.rules if rule.node_types]
    return may_contain_findings(
        text,
        only_cuda_rules=all(rule.needs_cuda for rule in source_rules),
        extra_hooks=options.extra_hooks,
        stepless_hints=tuple(rule.text_hint for rule in source_rules if rule.text_hint),
        in_project=in_project,
    )


def analyze_text(
    text: str, display_name: str, options: ScanOptions, *, explicit: bool = True, facts: ProjectFacts | None = None
) -> list[Finding]:
    return analyze_source(text, display_name, options, explicit=explicit, facts=facts).findings


def analyze_source(
    text: str,
    display_name: str,
    options: ScanOptions,
    *,
    explicit: bool = True,
    facts: ProjectFacts | None = None,
    path: str | None = None,
) -> FileAnalysis:
    """`path`: where the text was read from, for the line numbers of what the summary says (origins.py)."""
    source_rules = [rule for rule in options.rules if rule.node_types]
    driven = facts is not None and facts.demand_analysis()
    if not explicit and not driven and not passes_prefilter(text, options, in_project=facts is not None):
        return FileAnalysis([])
    # libcst misreads a form feed before code; CPython's reading of the line is analysed (form_feeds.py).
    parsed_text, shifted = without_leading_form_feeds(text)
    try:
        # Only a project's files are analysed again in later rounds: a library's are not kept.
        module = _RECENT_MODULES.parse(parsed_text, keep=facts is not None)
    except _RefusedByPython as refused:
        return FileAnalysis(_syntax_error(refused.why, display_name, options, text))
    except (cst.ParserSyntaxError, RecursionError, MemoryError, ValueError) as error:
        return FileAnalysis(_parse_failure(text, display_name, options, error))
    if not source_rules or ("torch" not in text and facts is None):
        return FileAnalysis([])
    try:
        analysis = _apply_rules(module, parsed_text, display_name, source_rules, options, facts, path)
    except RecursionError:
        message = "loopaudit could not analyse the file: it nests too deeply for the analysis"
        return FileAnalysis(file_problem(NOT_ANALYSED, display_name, options, message))
    return _restore_form_feeds(analysis, text, shifted) if shifted else analysis


class _RefusedByPython(Exception):
    """CPython's own parser refuses the text for its size or nesting (python_check.py)."""

    def __init__(self, why: Refusal) -> None:
        self.why = why


def _restore_form_feeds(analysis: FileAnalysis, text: str, shifted: dict[int, int]) -> FileAnalysis:
    """Findings of a text analysed without the form feeds at its lines' starts, placed in the text
    itself: the columns of those lines move back, and the source lines are the file's. Fixes are
    dropped, since their edits are offsets in the other text (the finding stays, to fix by hand)."""
    lines = source_lines(text)

    def placed(location: Location) -> Location:
        return Location(location.row, location.column + shifted.get(location.row, 0))

    def in_text(where):  # a finding or one of its related places
        row = where.location.row
        return replace(
            where,
            location=placed(where.location),
            end_location=placed(where.end_location),
            source_line=lines[row - 1] if row <= len(lines) else None,
        )

    findings = [replace(in_text(f), fix=None, related=tuple(map(in_text, f.related))) for f in analysis.findings]
    return FileAnalysis(findings, analysis.summary)


class _RecentModules:
    """The modules of a project this process parsed last, by their text. A project scan analyses a
    file again in later rounds, with new facts but the same text: its parse, half of an analysis, is
    kept (in a one-file re-scan, where the file is analysed in this process every round, it always
    is). A library's files are analysed once, and not kept. Bounded by the size of the texts: a tree
    costs about 2 KB per line of source."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # characters
        self._modules: OrderedDict[str, cst.Module] = OrderedDict()
        self._size = 0
        # text -> (what it was indexed for, its index), for the texts kept: the index depends on the
        # tree and the rules alone, not on the facts, so a later round reuses it too.
        self._indexes: dict[str, tuple[tuple, ModuleIndex]] = {}

    def index(
        self, text: str, module: cst.Module, site_types: tuple[type, ...], periodic_names: frozenset[str]
    ) -> ModuleIndex:
        """The index of `module`, parsed from `text` by parse()."""
        known = self._indexes.get(text)
        if known is not None and known[0] == (site_types, periodic_names):
            index = known[1]
            for function in index.functions:
                function.call_sites.clear()  # the one thing an analysis adds (StepModel fills it in)
            return index
        index = build_index(module, site_types, periodic_names)
        if text in self._modules:
            self._indexes[text] = ((site_types, periodic_names), index)
        return index

    def parse(self, text: str, keep: bool = True) -> cst.Module:
        module = self._modules.get(text)
        if module is not None:
            self._modules.move_to_end(text)
            return module
        # libcst has no guard against what overflows its stack or runs for minutes: CPython's limits
        # are checked first (python_check.py), once per text, as the tree is kept once parsed.
        refused = too_complex_for_python(text)
        if refused is not None:
            raise _RefusedByPython(refused)
        # An index kept across a parse would be frozen with the new tree and, holding cycles,
        # never freed once dropped (collector.py): indexes serve re-analyses with no parse between.
        self._indexes.clear()
        module = collector.parse_module(text)  # trees are immutable: one can serve every analysis
        if keep and len(text) <= self.limit:
            self._modules[text] = module
            self._size += len(text)
            while self._size > self.limit:
                dropped, _ = self._modules.popitem(last=False)
                self._size -= len(dropped)
                self._indexes.pop(dropped, None)
        return module


_RECENT_MODULES = _RecentModules(limit=1_000_000)  # about 25,000 lines: 50 MB of trees per process


def _parse_failure(text: str, display_name: str, options: ScanOptions, error: Exception) -> list[Finding]:
    """What to report when libcst cannot parse the text: a syntax error where Python agrees, in
    Python's own words and position (CPython's parser runs only for files that already failed);
    where Python accepts the text, that loopaudit could not analyse it (libcst lags a grammar, or
    gives up on what CPython takes)."""
    refused = python_refusal(text)
    if refused is not None:
        return _syntax_error(refused, display_name, options, text)
    if isinstance(error, cst.ParserSyntaxError):
        row, column, reason = error.raw_line, error.raw_column + 1, error.message
    else:
        row, column, reason = 1, 1, type(error).__name__
    message = f"loopaudit could not analyse the file: libcst's parser cannot read it, though Python can ({reason})"
    return file_problem(NOT_ANALYSED, display_name, options, message, row, column, text)


def _syntax_error(refused: Refusal, display_name: str, options: ScanOptions, text: str) -> list[Finding]:
    """LA001 where CPython refuses the text, in its words and at its place."""
    message = f"syntax error, the file cannot be parsed: {refused.reason}"
    return file_problem(SYNTAX_ERROR, display_name, options, message, refused.line, refused.column, text)


def _apply_rules(
    module: cst.Module,
    text: str,
    display_name: str,
    rules: Sequence[type[Rule]],
    options: ScanOptions,
    facts: ProjectFacts | None,
    path: str | None = None,
) -> FileAnalysis:
    # A list, not a set: the order in which questions are asked must not depend on the hash seed.
    site_types = tuple(dict.fromkeys(node_type for rule in rules for node_type in rule.node_types))
    index = _RECENT_MODULES.index(text, module, site_types, options.periodic_names)
    if facts is None and not index.imports.imports_module("torch"):
        return FileAnalysis([])  # a file that never imports torch has no tensors (unless a caller passes some)
    steps = StepModel(index, options.extra_hooks, facts)
    tensors = TensorInference(index, steps)
    positions = Positions(module, text)
    summary = None
    if facts is not None:
        own_cuda = targets_cuda(index, steps)
        marks = LineMarks(index, os.path.abspath(path or display_name))
        summary = summarize(index, steps, tensors, own_cuda, call_describer(module, display_name, marks.line_of))
        if not (facts.entered or facts.cuda) and not index.imports.imports_module("torch"):
            return FileAnalysis([], summary)  # nothing hands this module tensors
    ctx = RuleContext(index, steps, tensors)
    if options.device != "auto":
        cuda = options.device == "cuda"
    else:
        cuda = (summary.cuda if summary is not None else targets_cuda(index, steps)) or (
            facts is not None and facts.cuda
        )
    raw: list[tuple[type[Rule], Report, StepReason | None]] = []
    ran = []
    for rule_class in rules:
        if rule_class.needs_cuda and not cuda:
            continue
        ran.append(rule_class.code)
        rule = rule_class()
        for node_type in rule_class.node_types:
            for site in index.sites.get(node_type, ()):
                reason = steps.reason(site.frame) if rule_class.needs_step else None
                if rule_class.needs_step and reason is None:
                    continue
                ctx.scope, ctx.frame = site.scope, site.frame
                for report in rule.check(site.node, ctx):
                    raw.append((rule_class, report, reason))
    used: set[tuple[int, str]] = set()
    checks_unused = UNUSED_SUPPRESSION in options.enabled_codes
    table = suppressions(text) if raw or checks_unused else {}  # read once, for suppressing and for LA004
    findings = to_findings(module, text, display_name, raw, positions, used, table) if raw else []
    if checks_unused and table:
        findings += _unused_suppressions(text, table, used, frozenset(ran), display_name)
    return FileAnalysis(findings, summary)


def _unused_suppressions(
    text: str, table: dict[int, frozenset[str]], used: set[tuple[int, str]], ran: frozenset[str], display_name: str
) -> list[Finding]:
    """LA004 for each code a suppression comment names that silenced nothing this scan (of a rule
    that ran on the file)."""
    rule = rule_by_code(UNUSED_SUPPRESSION)
    assert rule is not None  # rules/files/ declares it
    lines = source_lines(text)
    return [
        Finding(
            code=rule.code,
            message=f"`{code}` is suppressed here, but this line has no {code} finding to suppress",
            filename=display_name,
            location=Location(row, column),
            end_location=Location(row, len(lines[row - 1]) + 1 if row <= len(lines) else column),
            suggestion=rule.suggestion,
            source_line=lines[row - 1] if row <= len(lines) else None,
            url=rule_url(rule.code, rule.name),
        )
        for row, column, code in unused(table, used, ran, lines)
    ]


def file_problem(
    code: str,
    display_name: str,
    options: ScanOptions,
    message: str,
    row: int = 1,
    column: int = 1,
    text: str | None = None,
) -> list[Finding]:
    if code not in options.enabled_codes:
        return []
    rule = rule_by_code(code)
    assert rule is not None, code  # rules/files/ declares every code above
    source_line = None
    if text is not None:
        lines = source_lines(text)
        source_line = lines[row - 1] if 0 < row <= len(lines) else None
    return [
        Finding(
            code=rule.code,
            message=message,
            filename=display_name,
            location=Location(row, column),
            end_location=Location(row, column),
            severity="error",
            suggestion=rule.suggestion,
            source_line=source_line,
            url=rule_url(rule.code, rule.name),
        )
    ]


def describe_error(name: str, error: Exception) -> str:
    try:
        detail = str(error)[:200]
    except Exception:  # str() of an error about a deep syntax tree can itself overflow
        detail = ""
    return f"{name}: {type(error).__name__}: {detail}"


@contextlib.contextmanager
def deep_recursion(limit: int = 20_000):
    """libcst's code generation (behind position metadata) recurses once per nesting level, and
    generated or machine-written files nest deeper than Python's default limit of 1,000. Python
    functions do not use the C stack on 3.11+, so a higher limit is safe for them."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)
