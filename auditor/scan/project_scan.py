"""Scanning many files as one project: each file analysed on its own (in worker processes), the
project's facts derived from their summaries, and the files whose facts changed analysed again, in
rounds, until the facts settle (analysis/derivation.py); the cache keeps outcomes and derived facts
between runs."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import cast

from loopaudit.analysis.config_files import read_config_values
from loopaudit.analysis.cross_module import ModuleSummary, ProjectFacts
from loopaudit.analysis.derivation import MAX_ROUNDS, derive_facts
from loopaudit.analysis.layout import ProjectLayout, TextFacts, marked_folders
from loopaudit.digests import digest
from loopaudit.findings.finding import Finding
from loopaudit.scan import collector
from loopaudit.scan.cache import ResultCache
from loopaudit.scan.engine import (
    NOT_ANALYSED,
    analyze_bytes,
    analyze_file,
    deep_recursion,
    describe_error,
    file_problem,
)
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.plain_data import from_plain, to_plain
from loopaudit.scan.reach_lines import LineResolver
from loopaudit.scan.workers import DEFAULT_CPU_SECONDS, FileFailure, WorkerPool


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
        return file_problem(NOT_ANALYSED, name, options, message), [], None, _no_summary(facts)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _analyze_item(item: tuple[str, str, bool, ScanOptions, ProjectFacts | None]) -> Outcome:
    path, name, explicit, options, facts = item
    with deep_recursion():
        try:
            analysis = analyze_file(path, name, options, explicit=explicit, facts=facts)
            summary = analysis.summary
            if summary is None:
                return analysis.findings, [], None, _no_summary(facts)
            return analysis.findings, [], _summary_text(summary), digest(summary)
        except Exception as error:  # a bug in loopaudit must not hide the other files' findings
            return [], [describe_error(name, error)], None, _no_summary(facts)


def _no_summary(facts: ProjectFacts | None) -> str | None:
    """None for a file the prefilter ruled out (a later round may ask for it); UNANALYSABLE where it
    was asked for."""
    return UNANALYSABLE if facts is not None and facts.demand_analysis() else None


def analyze_stdin(data: bytes, name: str, options: ScanOptions) -> ScanResult:
    with deep_recursion():
        try:
            return ScanResult(analyze_bytes(data, name, options, explicit=True))
        except Exception as error:
            return ScanResult(problems=[describe_error(name, error)])
