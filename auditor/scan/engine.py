"""Analyse one file: read, (maybe) parse once, walk once, apply every enabled rule, report.

Positions are the one expensive piece of metadata (libcst computes them for the whole tree at once),
so they are computed only for files that have something to report, after the rules have run.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import json
import os
import stat
import sys
import tokenize
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import libcst as cst

from loopaudit.analysis.config_files import read_config_values
from loopaudit.analysis.cross_module import ModuleSummary, ProjectFacts
from loopaudit.analysis.derivation import MAX_ROUNDS, derive_facts
from loopaudit.analysis.device import targets_cuda
from loopaudit.analysis.layout import ProjectLayout, TextFacts, marked_folders
from loopaudit.analysis.lines import source_lines
from loopaudit.analysis.module_index import ModuleIndex, build_index
from loopaudit.analysis.stepmodel import StepModel, StepReason
from loopaudit.analysis.summarize import summarize
from loopaudit.analysis.tensors import TensorInference
from loopaudit.digests import digest
from loopaudit.findings.finding import Edit, Finding, FixInfo, Location, Related, rule_url
from loopaudit.rule_api.context import RuleContext
from loopaudit.rule_api.registry import rule_by_code
from loopaudit.rule_api.rule import Fix, Group, Report, Rule
from loopaudit.scan import collector
from loopaudit.scan.cache import ResultCache
from loopaudit.scan.form_feeds import without_leading_form_feeds
from loopaudit.scan.grouping import one_finding_per_problem
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.plain_data import from_plain, to_plain
from loopaudit.scan.positions import Positions, print_rewritten
from loopaudit.scan.prefilter import may_contain_findings
from loopaudit.scan.python_check import Refusal, python_refusal, too_complex_for_python
from loopaudit.scan.reach_lines import LineMarks, LineResolver
from loopaudit.scan.suppression import is_suppressed, suppressions
from loopaudit.scan.workers import DEFAULT_CPU_SECONDS, FileFailure, WorkerPool

# The rules the engine itself reports about whole files (rules/files/), by code: the engine finds
# them through the registry, as the docs do, and imports no rule module.
UNREADABLE_FILE, SYNTAX_ERROR, NOT_ANALYSED = "LA002", "LA001", "LA003"


@dataclass
class FileAnalysis:
    findings: list[Finding]
    # In a project-wide scan (facts given): what the module tells the other modules (project.py).
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
            return FileAnalysis(_file_problem(UNREADABLE_FILE, display_name, options, "not a regular file"))
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        return FileAnalysis(
            _file_problem(UNREADABLE_FILE, display_name, options, f"cannot read the file: {error.strerror or error}")
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
    if b"\0" in data:
        problem = "binary file (it contains NUL bytes), not Python source"
        return FileAnalysis(_file_problem(UNREADABLE_FILE, display_name, options, problem))
    try:
        # Python's own rule: UTF-8 unless a PEP 263 `# -*- coding: ... -*-` line says otherwise.
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError) as error:
        reason = str(error).split(" for ")[0] or "invalid encoding"  # drop the temporary file name
        return FileAnalysis(
            _file_problem(UNREADABLE_FILE, display_name, options, f"not readable as Python source: {reason}")
        )
    except UnicodeDecodeError as error:
        problem = f"not {error.encoding} text (byte {error.start} cannot be decoded)"
        return FileAnalysis(_file_problem(UNREADABLE_FILE, display_name, options, problem))
    return analyze_source(text, display_name, options, explicit=explicit, facts=facts, path=path)


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
        return FileAnalysis(_file_problem(NOT_ANALYSED, display_name, options, message))
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
    return _file_problem(NOT_ANALYSED, display_name, options, message, row, column, text)


def _syntax_error(refused: Refusal, display_name: str, options: ScanOptions, text: str) -> list[Finding]:
    """LA001 where CPython refuses the text, in its words and at its place."""
    message = f"syntax error, the file cannot be parsed: {refused.reason}"
    return _file_problem(SYNTAX_ERROR, display_name, options, message, refused.line, refused.column, text)


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
        summary = summarize(index, steps, tensors, own_cuda, _call_describer(module, display_name, marks.line_of))
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
    for rule_class in rules:
        if rule_class.needs_cuda and not cuda:
            continue
        rule = rule_class()
        for node_type in rule_class.node_types:
            for site in index.sites.get(node_type, ()):
                reason = steps.reason(site.frame) if rule_class.needs_step else None
                if rule_class.needs_step and reason is None:
                    continue
                ctx.scope, ctx.frame = site.scope, site.frame
                for report in rule.check(site.node, ctx):
                    raw.append((rule_class, report, reason))
    if not raw:
        return FileAnalysis([], summary)
    return FileAnalysis(_to_findings(module, text, display_name, raw, positions), summary)


def _call_describer(module: cst.Module, display_name: str, line_of):
    """Why a call runs once per step, for the module it enters: "step loop `for x in loader`
    (main.py:120) → `engine.step()` (main.py:124)", with the lines as marks (origins.py)."""

    def describe(reason: StepReason, call: cst.Call) -> str:
        where = _describe(reason, line_of, module, display_name)
        callee = " ".join(module.code_for_node(call.func).split())
        return f"{where} → `{callee}()` ({display_name}:{line_of(call)})"

    return describe


def _fix_info(fix: Fix, module: cst.Module, text: str, starts: list[int], positions: Positions) -> FixInfo | None:
    """The fix as text edits: the span where the text with the rewrite differs from the text. None
    when libcst cannot print the module back as the text (then no edit can be trusted)."""
    edits = []
    for old, new in fix.replacements:
        rewrite = _rewrite(old, new, module, text, positions)
        if rewrite is None:
            return None
        rewritten, same_before, same_after = rewrite
        start = same_before
        limit = min(len(text), len(rewritten))
        while start < limit and text[start] == rewritten[start]:
            start += 1
        tail = min(len(text) - same_after, limit - start)
        while tail < limit - start and text[len(text) - 1 - tail] == rewritten[len(rewritten) - 1 - tail]:
            tail += 1
        end = len(text) - tail
        edits.append(
            Edit(start, end, rewritten[start : len(rewritten) - tail], _location(start, starts), _location(end, starts))
        )
    return FixInfo("safe" if fix.safe else "unsafe", fix.description, tuple(sorted(edits, key=lambda e: e.start)))


def _rewrite(old: cst.CSTNode, new, module: cst.Module, text: str, positions: Positions) -> tuple[str, int, int] | None:
    """The module's text with `old` rewritten, and the offsets before and from which it is the same
    as `text`. Only the statement around the rewrite is printed again (positions.py), in the text's
    place, unless no statement around it can be placed: then the whole module is (a node printed
    alone would lose the indentation of its blocks' continuation lines)."""
    removing = new is cst.RemovalSentinel.REMOVE
    placed = None
    if module.has_trailing_newline:
        # A removal can empty the statement it is in, which its parent then drops: print the parent.
        placed = positions.place(old, above=positions.innermost_statement(old) if removing else None)
    if placed is None:
        rewritten = cast(cst.Module, module.deep_remove(old) if removing else module.deep_replace(old, new)).code
        # libcst drops what a module cannot hold, such as the last `\r` of a file with classic-Mac
        # line ends: that tail of the text stays as it was. Any other difference: no safe edit.
        printed = module.code
        if not text.startswith(printed):
            return None
        return rewritten + text[len(printed) :], 0, len(text)
    statement = placed.statement
    changed = statement.deep_remove(old) if removing else statement.deep_replace(old, new)
    end = placed.offset + len(placed.code)
    return text[: placed.offset] + print_rewritten(placed, changed, module) + text[end:], placed.offset, end


def _location(offset: int, starts: list[int]) -> Location:
    line = bisect.bisect_right(starts, offset)
    return Location(line, offset - starts[line - 1] + 1)


def _to_findings(module: cst.Module, text: str, display_name: str, raw, positions: Positions) -> list[Finding]:
    starts = positions.line_starts
    lines = source_lines(text)
    suppressed = suppressions(text)
    # One per rule and line, with the group it is part of; suppressed line by line, then grouped.
    findings: dict[tuple[str, int], tuple[Finding, Group | None]] = {}
    for rule_class, report, reason in raw:
        span = positions[report.node]
        row = span.start.line
        key = (rule_class.code, row)
        if key in findings or is_suppressed(rule_class.code, range(row, span.end.line + 1), suppressed):
            continue
        related = _places(report, row, positions, lines)
        findings[key] = (
            Finding(
                code=rule_class.code,
                message=(report.message or rule_class.message)
                + "".join(f"; {place.message} at line {place.location.row}" for place in related),
                filename=display_name,
                location=Location(row, span.start.column + 1),
                end_location=Location(span.end.line, span.end.column + 1),
                context=_describe(reason, positions.line_of, module) if reason else None,
                suggestion=report.suggestion or rule_class.suggestion,
                source_line=lines[row - 1] if row - 1 < len(lines) else None,
                url=rule_url(rule_class.code, rule_class.name),
                fix=_fix_info(report.fix, module, text, starts, positions) if report.fix else None,
                related=related,
            ),
            report.group,
        )
    return sorted(one_finding_per_problem(findings.values()), key=Finding.sort_key)


def _places(report: Report, row: int, positions: Positions, lines: list[str]) -> tuple[Related, ...]:
    """A report's other places (Report.places) as the finding's related places, in line order."""
    found = []
    for node, what in report.places:
        span = positions[node]
        if span.start.line != row:
            source = lines[span.start.line - 1] if span.start.line - 1 < len(lines) else None
            found.append(
                Related(
                    Location(span.start.line, span.start.column + 1),
                    Location(span.end.line, span.end.column + 1),
                    what,
                    source,
                    kind="place",
                )
            )
    return tuple(sorted(found, key=lambda place: place.location))


def _describe(reason: StepReason, line_of, module: cst.Module, file: str | None = None) -> str:
    """Why a line runs per step. `file` names the module when the text is read in another one."""
    if reason.kind == "external":
        where = reason.origin or "called once per step from another module"
    else:
        line = line_of(reason.node)
        at = f"{file}:{line}" if file else f"line {line}"
        if reason.kind == "hook":
            where = f"step hook `{reason.hook}` ({at})"
        else:
            header = _loop_header(reason.node, module)
            where = f"step loop `{header}` ({at})"
    if reason.via:
        where += ", through " + " -> ".join(f"`{name}()`" for name in reason.via)
    return where


def _loop_header(node: cst.CSTNode, module: cst.Module) -> str:
    if isinstance(node, cst.For):
        header = f"for {module.code_for_node(node.target)} in {module.code_for_node(node.iter)}"
    elif isinstance(node, cst.While):
        header = f"while {module.code_for_node(node.test)}"
    else:
        return "?"
    header = " ".join(header.split())
    return header if len(header) <= 60 else header[:57] + "..."


def _file_problem(
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


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    # Internal errors ("file: what went wrong"): a bug of ours, never a problem with the user's file.
    problems: list[str] = field(default_factory=list)
    # Project-wide scans: the facts from the other files of each file with findings (by display
    # name), which a fix pass must analyse the file with again to find the same findings.
    facts: dict[str, ProjectFacts] = field(default_factory=dict)


Item = tuple[str, str, bool, ScanOptions]  # (path, display name, named explicitly, options)


def analyze_many(
    items: Iterable[Item],
    jobs: int,
    progress: Callable[[int, int], None] | None = None,
    cache: ResultCache | None = None,
    *,
    isolated: bool = False,
    cpu_seconds: float = DEFAULT_CPU_SECONDS,
) -> ScanResult:
    """Analyse (path, display name, explicit, options) items, in worker processes when there are
    many, or always if `isolated` (as the command does: workers.py). A file whose worker crashes or
    runs past `cpu_seconds` of CPU time is reported as not analysed (LA003), and costs no other
    file its findings. Each file has its own options: the configuration closest to it decides them.

    Several files are one project (project.py): each is analysed, then analysed again with what the
    others say about it, until nothing changes. A single file is analysed alone.

    `progress(done, total)` hears of each file of the first round as its analysis ends (the later
    rounds re-analyse few files).

    `cache`: analyses already stored there are read instead of done again (cache.py); a scan of
    exactly the same files as an earlier one reads its whole result back."""
    work = list(items)
    workers = _Workers(jobs if len(work) >= 16 else 1, progress, cache, isolated, cpu_seconds)
    if cache is None:
        return _analyze_many(work, workers, None)
    whole = cache.scan_key(work, marked_folders(os.path.abspath(item[0]) for item in work))
    stored = cache.get(whole, ScanResult)
    if stored is not None:
        if progress is not None:
            progress(len(work), len(work))
        return stored
    result = _analyze_many(work, workers, cache)
    if not result.problems and not workers.failed:  # the next run tries those files again
        cache.put(whole, result, ScanResult)
    return result


def _analyze_many(work: list[Item], workers: _Workers, cache: ResultCache | None) -> ScanResult:
    path_of = [os.path.abspath(item[0]) for item in work]
    with workers:
        # The project: the scanned files outside any library's own sources (project.py).
        scanned = ProjectLayout(path_of)
        project = [i for i in range(len(work)) if not scanned.is_library(path_of[i])]
        if len(project) < 2:
            return _total(workers.run([(*item, None) for item in work]), {})
        layout = scanned if len(project) == len(work) else ProjectLayout(path_of[i] for i in project)
        initial = ProjectFacts(roots=layout.roots)  # one object: the cache writes its key text once
        facts = {path_of[i]: initial for i in project}
        outcomes = workers.run([(*item, facts.get(path_of[i])) for i, item in enumerate(work)])
        for _ in range(MAX_ROUNDS):
            derived = _derived_facts(layout, {path_of[i]: outcomes[i] for i in project}, cache)
            new = {path: facts[path].grown(derived[path]) for path in facts}
            changed = [i for i in project if new[path_of[i]].analysis_key() != facts[path_of[i]].analysis_key()]
            facts = new
            if not changed:
                break
            for i, outcome in zip(changed, workers.run([(*work[i], facts[path_of[i]]) for i in changed])):
                outcomes[i] = outcome
    return _with_lines(_total(outcomes, {work[i][1]: facts[path_of[i]] for i in project}), cache)


def _derived_facts(
    layout: ProjectLayout, outcomes: dict[str, Outcome], cache: ResultCache | None
) -> dict[str, ProjectFacts]:
    """derive_facts over the files' summaries, or what it gave an earlier scan for the same ones (by
    their digests). A touched file whose summary stays the same (an edited comment, a changed line
    inside a function) leaves the project's facts as they were, and no summary is even decoded.
    derive_facts also reads the text of files (their imports, classes and top-level names): the
    entry keeps what it read, which must read the same now (the same bytes, or, where they
    changed, the same facts read from them)."""
    key = stored = None
    if cache is not None:
        key = cache.facts_key(layout.signature, {path: outcome[3] for path, outcome in outcomes.items()})
        stored = cache.get(key, _DerivedFacts)
    if stored is not None:
        derived, texts, configs = stored
        if all(
            cast(ResultCache, cache).content_digest(path) == read_from or layout.text_facts(path) == read
            for path, (read_from, read) in texts.items()
        ) and all(read_config_values(folder) == values for folder, values in configs.items()):
            return _sharing_roots(derived, layout.roots)
    summaries = {
        path: from_plain(ModuleSummary, json.loads(outcome[2]))
        for path, outcome in outcomes.items()
        if outcome[2] is not None
    }
    derived = derive_facts(
        layout, summaries, [path for path, outcome in outcomes.items() if outcome[3] == UNANALYSABLE]
    )
    if cache is not None:
        cache.put(key, (derived, layout.texts_read(), layout.configs_read()), _DerivedFacts)
    return derived


def _sharing_roots(derived: dict[str, ProjectFacts], roots: frozenset[str]) -> dict[str, ProjectFacts]:
    """Facts read back hold their own copy of the project's root names, the one large set in them;
    pointed at the layout's, as derive_facts' are, comparing facts compares it by identity."""
    copies = {id(facts.roots): facts.roots for facts in derived.values()}
    for copy in copies.values():
        if copy == roots:
            for facts in derived.values():
                if facts.roots is copy:
                    object.__setattr__(facts, "roots", roots)  # frozen, and not yet seen by anyone
    return derived


def _with_lines(result: ScanResult, cache: ResultCache | None = None) -> ScanResult:
    """Fill in the line numbers the findings show of how their lines are reached (origins.py), and in
    the facts of the files with findings, which a fix pass analyses again."""
    resolve = LineResolver(cache)
    result.findings = [
        replace(f, context=resolve(f.context)) if f.context and "⟦" in f.context else f for f in result.findings
    ]
    with_findings = {f.filename for f in result.findings}
    # Only the files with findings are analysed again (by a fix pass): the others' facts are dropped,
    # which keeps a whole scan's cache entry small.
    result.facts = {name: facts for name, facts in result.facts.items() if name in with_findings}
    for name, facts in result.facts.items():
        if facts.entered:
            result.facts[name] = replace(
                facts, entered=tuple((q, cast(str, resolve(origin))) for q, origin in facts.entered)
            )
    return result


# What one file's analysis sends back: its findings, internal errors, its project summary (as JSON
# text: a scan that reads the project's facts back from the cache never needs to decode it) and the
# summary's digest (what the project facts are derived from: see _derived_facts).
Outcome = tuple[list[Finding], list[str], str | None, str | None]
# A cache entry of derived project facts: the facts by path, what was read from the text of files
# (by path: the digest of the bytes read, and what they said), and the settings read from YAML
# configuration files (by folder: read again to check them, as they are no file of the scan).
_DerivedFacts = tuple[
    dict[str, ProjectFacts], dict[str, tuple[str, TextFacts]], dict[str, tuple[tuple[str, object], ...]]
]

# The digest of a file the project asked for that gave no summary (a syntax error, no rules to run):
# the project must not wait for it.
UNANALYSABLE = "unanalysable"


def _summary_text(summary: ModuleSummary) -> str:
    return json.dumps(to_plain(summary, ModuleSummary), ensure_ascii=False, separators=(",", ":"))


def _total(outcomes: list[Outcome], facts: dict[str, ProjectFacts]) -> ScanResult:
    total = ScanResult(facts=facts)
    for findings, problems, *_ in outcomes:
        total.findings.extend(findings)
        total.problems.extend(problems)
    total.findings.sort(key=Finding.sort_key)
    return total


class _Workers:
    """Runs analyses in this process, or in one pool of worker processes kept for every round
    (workers.py), and reads from and stores into the cache, when there is one."""

    def __init__(
        self,
        jobs: int,
        progress: Callable[[int, int], None] | None = None,
        cache: ResultCache | None = None,
        isolated: bool = False,
        cpu_seconds: float = DEFAULT_CPU_SECONDS,
    ) -> None:
        self.jobs = jobs
        self.isolated = isolated
        self.cpu_seconds = cpu_seconds
        self.failed: set[str] = set()  # display names of files whose worker crashed or ran out of time
        self._pool: WorkerPool | None = None
        self._progress = progress  # told of the first round only
        self._cache = cache

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.close()

    def run(self, work: list[tuple[str, str, bool, ScanOptions, ProjectFacts | None]]) -> list[Outcome]:
        progress, self._progress = self._progress or (lambda done, total: None), None
        cache = self._cache
        if cache is None:
            return self._analyze(work, progress)
        keys = [cache.key(*item) for item in work]
        stored = [cache.get(key, Outcome) for key in keys]
        missing = [i for i, outcome in enumerate(stored) if outcome is None]
        hits = len(work) - len(missing)
        if hits:
            progress(hits, len(work))
        analysed = self._analyze([work[i] for i in missing], lambda done, total: progress(hits + done, len(work)))
        outcomes: list[Outcome] = list(stored)
        for i, outcome in zip(missing, analysed):
            outcomes[i] = outcome
            # Internal errors and failed workers are not kept: the next run tries again.
            if not outcome[1] and work[i][1] not in self.failed and cache.still_current(*work[i], key=keys[i]):
                cache.put(keys[i], outcome, Outcome)
        return outcomes

    def _analyze(self, work, progress: Callable[[int, int], None]) -> list[Outcome]:
        if not self.isolated and (self.jobs <= 1 or len(work) < 2):
            outcomes: list[Outcome] = []
            for item in work:
                outcomes.append(_analyze_item(item))
                progress(len(outcomes), len(work))
            return outcomes
        if self._pool is None:
            # The workers run loopaudit alone: they may keep their trees out of the collector's way.
            self._pool = WorkerPool(self.jobs, _analyze_item, collector.own_worker_collector, self.cpu_seconds)
        # Largest files first, handed out one by one: a few huge modules (torch has 25,000-line
        # test files) must not end up in one worker's batch while the others sit idle.
        order = sorted(range(len(work)), key=lambda i: _size(work[i][0]), reverse=True)
        outcomes = [([], [], None, None)] * len(work)
        for done, (position, outcome) in enumerate(self._pool.run([work[i] for i in order], self._not_analysed), 1):
            outcomes[order[position]] = cast(Outcome, outcome)  # what _analyze_item and _not_analysed return
            progress(done, len(work))
        return outcomes

    def _not_analysed(self, item, why: FileFailure) -> Outcome:
        _, name, _, options, facts = item
        self.failed.add(name)
        message = f"loopaudit could not analyse the file: {why}"
        return _file_problem(NOT_ANALYSED, name, options, message), [], None, _no_summary(facts)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _analyze_item(item: tuple[str, str, bool, ScanOptions, ProjectFacts | None]) -> Outcome:
    path, name, explicit, options, facts = item
    with _deep_recursion():
        try:
            analysis = analyze_file(path, name, options, explicit=explicit, facts=facts)
            summary = analysis.summary
            if summary is None:
                return analysis.findings, [], None, _no_summary(facts)
            return analysis.findings, [], _summary_text(summary), digest(summary)
        except Exception as error:  # a bug in loopaudit must not hide the other files' findings
            return [], [_describe_error(name, error)], None, _no_summary(facts)


def _no_summary(facts: ProjectFacts | None) -> str | None:
    """None for a file the prefilter ruled out (a later round may ask for it); UNANALYSABLE where it
    was asked for."""
    return UNANALYSABLE if facts is not None and facts.demand_analysis() else None


def analyze_stdin(data: bytes, name: str, options: ScanOptions) -> ScanResult:
    with _deep_recursion():
        try:
            return ScanResult(analyze_bytes(data, name, options, explicit=True))
        except Exception as error:
            return ScanResult(problems=[_describe_error(name, error)])


def _describe_error(name: str, error: Exception) -> str:
    try:
        detail = str(error)[:200]
    except Exception:  # str() of an error about a deep syntax tree can itself overflow
        detail = ""
    return f"{name}: {type(error).__name__}: {detail}"


@contextlib.contextmanager
def _deep_recursion(limit: int = 20_000):
    """libcst's code generation (behind position metadata) recurses once per nesting level, and
    generated or machine-written files nest deeper than Python's default limit of 1,000. Python
    functions do not use the C stack on 3.11+, so a higher limit is safe for them."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)
