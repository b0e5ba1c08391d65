"""One report for a job of several ranks: each rank measured as `loopaudit run` measures one script,
then put side by side: how each rank ended, its step time, data wait and time in collectives, which
rank the others wait for (the straggler) and why, how far apart the ranks are, and the collectives
each step makes.

Naming a straggler. Under DDP every step ends with an all-reduce, so every rank's step takes as long
as the slowest rank's: step times alone cannot tell which rank holds the others back. What differs is
where each rank's time goes. A rank whose DataLoader is slow waits for its batches while the others
wait for it, inside DDP's all-reduce (in `backward()`, out of the probe's sight) or inside the
script's own collectives (timed: comm wait). So the straggler is named, in this order:

1. by data wait: the rank that waits longest for batches that were not loaded yet;
2. by comm wait: the rank that waits least inside collectives while the others wait;
3. by step time, where the ranks do not synchronize every step: the slowest.

Each asks for a difference both large (at least `_NOTABLE` of the step) and sure (the two ranks' 95%
intervals apart, stability.py): a verdict that a busy machine cannot flip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

from loopaudit.findings.finding import Finding
from loopaudit.profiling.in_loopaudit.audit import RunAudit, StaticCheck, display_path
from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
from loopaudit.profiling.in_loopaudit.runner import RankOutcome
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.profiling.in_script.report import SiteRecord
from loopaudit.profiling.in_script.stability import Estimate, median_interval

# A difference between ranks worth naming: this share of the (slower) step time.
_NOTABLE = 0.10


@dataclass
class RankView:
    rank: int
    outcome: RankOutcome
    status: str  # "measured", "failed: exit status 1", "stuck waiting for rank 1", ...
    failed: bool  # the script failed on this rank (not stopped by loopaudit, not stuck)
    evidence: RunEvidence | None = None
    audit: RunAudit | None = None

    @property
    def steps(self) -> int:
        return self.evidence.steps_measured if self.evidence is not None else 0

    def _median(self, value: Callable) -> Estimate | None:
        if self.evidence is None or not self.evidence.report.steps:
            return None
        return median_interval([value(step) * 1000 for step in self.evidence.steady_steps])

    @property
    def step_ms(self) -> Estimate | None:
        return self._median(lambda step: step.seconds)

    @property
    def data_wait_ms(self) -> Estimate | None:
        """Per step, waiting for batches that were not loaded yet (the loader falling behind)."""
        return self._median(lambda step: step.data_starved_seconds)

    @property
    def comm_ms(self) -> Estimate | None:
        """Per step, inside torch.distributed's collectives."""
        return self._median(lambda step: step.comm_seconds)

    @property
    def collectives_per_step(self) -> float | None:
        if self.evidence is None or not self.steps:
            return None
        return sum(record.count for record in self.evidence.report.collectives) / self.steps


@dataclass
class Collective:
    """A line that ran a collective, as each rank measured it."""

    file: str
    line: int
    call: str
    via: str | None
    per_step: dict[int, float] = field(default_factory=dict)  # rank -> calls per measured step
    ms_per_step: dict[int, float] = field(default_factory=dict)  # rank -> time inside it per step


@dataclass
class JobAudit:
    ranks: list[RankView]
    straggler: int | None
    straggler_reason: str
    imbalance: float | None  # the slowest rank's median step over the fastest's, minus one
    collectives: list[Collective]
    findings: list[Finding]  # the ranks' runtime findings, one per place, naming the ranks
    static: list[StaticCheck]


def rank_status(outcome: RankOutcome, first_failure: int | None = None) -> tuple[str, bool]:
    """What became of a rank, and whether its script failed. `first_failure`: the rank whose failure
    came first, when another rank's did (the others then fail on a collective whose peer is gone)."""
    run = outcome.outcome
    report = run.report
    if outcome.stuck_after is not None:
        return f"stuck: rank {outcome.stuck_after} had ended", False
    if run.interrupted:
        return "interrupted", False
    if run.timed_out:
        seen = report.steps_seen if report is not None else 0
        return f"timed out, step {seen}", False
    if report is not None and report.stopped:
        return "measured", False
    if run.status != 0:
        if first_failure is not None and first_failure != outcome.rank:
            return f"failed after rank {first_failure} (exit {run.status})", True
        return f"failed first (exit {run.status})", True
    if report is None or not report.steps:
        return "ended before its steps were measured", False
    return "measured (the script ended)", False


def first_failure(outcomes: Sequence[RankOutcome]) -> int | None:
    """The rank whose script failed first, of those that failed by themselves."""
    failed = [o for o in outcomes if o.ended_order is not None and o.outcome.status != 0 and not o.outcome.interrupted]
    return min(failed, key=lambda o: cast(int, o.ended_order)).rank if failed else None


# Steps a rank must have measured for the ranks to be compared (the median's interval needs 6).
_FEWEST_STEPS = 6


def _behind(views: Sequence[RankView]) -> tuple[int | None, str]:
    """At --timeout: the rank that took fewer steps than every other is the one they were waiting for."""
    # Steps, then batches: a rank blocked in its step's all-reduce has fetched the batch of the step
    # that the hung rank never reached.
    seen = {
        view.rank: (report.steps_seen, report.batches_seen) if (report := view.outcome.outcome.report) else (0, 0)
        for view in views
    }
    lowest = min(seen.values())
    behind = [rank for rank, count in seen.items() if count == lowest]
    if len(behind) != 1 or len(seen) < 2:
        return None, ""
    report = views[behind[0]].outcome.outcome.report
    where = ""
    if report is not None and report.halted_at:
        where = f", stuck at {display_path(report.halted_at[0])}:{report.halted_at[1]}"
    return behind[0], (
        f"it stopped after step {lowest[0]} and batch {lowest[1]}{where}, while the others had gone on and "
        "waited for it until --timeout"
    )


def merge(views: list[RankView]) -> JobAudit:
    measured = [view for view in views if view.evidence is not None and view.steps]
    hung = _behind(views) if views and all(view.outcome.outcome.timed_out for view in views) else (None, "")
    if hung[0] is not None:
        (straggler, reason), imbalance = hung, None  # a hung job's last steps are no pace to compare
    else:
        comparable = len(measured) == len(views) > 1 and all(
            not view.failed and view.steps >= _FEWEST_STEPS for view in views
        )
        if comparable:
            straggler, reason = _straggler(measured)
        else:
            straggler, reason = None, "" if len(views) < 2 else "not compared: not every rank measured its steps"
        imbalance = _imbalance(measured)
    return JobAudit(
        views,
        straggler,
        reason,
        imbalance,
        _collectives(measured),
        _merged_findings(measured),
        _merged_static(measured),
    )


def _imbalance(ranks: Sequence[Timed]) -> float | None:
    """The slowest rank's median step over the fastest's, minus one."""
    steps = [rank.step_ms.value for rank in ranks if rank.step_ms is not None]
    return max(steps) / min(steps) - 1 if len(steps) > 1 and min(steps) > 0 else None


def _apart(slow: Estimate, fast: Estimate) -> bool:
    """Are the two intervals apart, `slow` above `fast`? (No interval: the values alone.)"""
    if slow.low is None or fast.high is None:
        return slow.value > fast.value
    return slow.low > fast.high


class Timed(Protocol):
    """What naming a straggler reads of a rank: a run's (RankView) or a trace's (TraceRank)."""

    rank: int

    @property
    def step_ms(self) -> Estimate | None: ...

    @property
    def data_wait_ms(self) -> Estimate | None: ...

    @property
    def comm_ms(self) -> Estimate | None: ...


def _straggler(views: Sequence[Timed]) -> tuple[int | None, str]:
    step = max(view.step_ms.value for view in views if view.step_ms is not None)
    notable = _NOTABLE * step

    def ms(estimate: Estimate | None) -> str:
        return f"{cast(Estimate, estimate).value:.1f} ms"  # (measured views: each has its estimates)

    def others(rest: Sequence[Timed], value: Callable[[Timed], Estimate | None]) -> str:
        return ", ".join(f"rank {v.rank} {ms(value(v))}" for v in rest)

    def standing_out(value: Callable[[Timed], Estimate | None], highest: bool) -> tuple[Timed, list[Timed]] | None:
        """The rank whose `value` is the highest (or lowest) by a notable margin, intervals apart, and the rest."""
        ranked = sorted(views, key=lambda v: e.value if (e := value(v)) else 0.0, reverse=highest)
        first, rest = ranked[0], ranked[1:]
        mine = value(first)
        if mine is None:
            return None
        for other in rest:
            theirs = value(other)
            if theirs is None:
                return None
            high, low = (mine, theirs) if highest else (theirs, mine)
            if high.value - low.value < notable or not _apart(high, low):
                return None
        return first, rest

    if (found := standing_out(lambda v: v.data_wait_ms, highest=True)) is not None:
        top, rest = found
        return top.rank, (
            f"it waits {ms(top.data_wait_ms)} per step for its DataLoader ({others(rest, lambda v: v.data_wait_ms)}), "
            "and the other ranks wait for it"
        )
    if (found := standing_out(lambda v: v.comm_ms, highest=False)) is not None:
        least, rest = found
        return least.rank, (
            f"the other ranks wait for it inside collectives ({others(rest, lambda v: v.comm_ms)} per step, "
            f"rank {least.rank} {ms(least.comm_ms)})"
        )
    if (found := standing_out(lambda v: v.step_ms, highest=True)) is not None:
        slowest, rest = found
        return slowest.rank, f"its steps take {ms(slowest.step_ms)} ({others(rest, lambda v: v.step_ms)})"
    return (
        None,
        f"no rank holds the others back: data wait, comm wait and step time within {_NOTABLE:.0%} of a step or within noise",
    )


def _collectives(views: Sequence[RankView]) -> list[Collective]:
    merged: dict[tuple[str, int, str], Collective] = {}
    for view in views:
        evidence = view.evidence
        assert evidence is not None  # measured views only
        record: SiteRecord
        for record in evidence.report.collectives:
            key = (record.file, record.line, record.call)
            entry = merged.setdefault(key, Collective(record.file, record.line, record.call, record.via))
            entry.per_step[view.rank] = evidence.per_step(record.count)
            entry.ms_per_step[view.rank] = round(record.seconds * 1000 / max(1, evidence.steps_measured), 3)
    return sorted(merged.values(), key=lambda c: (-max(c.per_step.values(), default=0), c.file, c.line))


def _merged_findings(views: Sequence[RankView]) -> list[Finding]:
    return merged_findings([(view.rank, view.audit.findings if view.audit is not None else []) for view in views])


def merged_findings(
    per_rank: Sequence[tuple[int, Sequence[Finding]]], own_files: frozenset[str] = frozenset()
) -> list[Finding]:
    """One finding per code and place, the first rank's, saying on which ranks it was measured when
    not on all of them. `own_files`: each rank's own file (its trace), where a finding about the whole
    trace is placed: the same place on every rank."""
    first: dict[tuple[str, str, int], Finding] = {}
    ranks: dict[tuple[str, str, int], list[int]] = {}
    for rank, findings in per_rank:
        for finding in findings:
            place = "" if finding.filename in own_files else finding.filename
            key = (finding.code, place, finding.location.row)
            first.setdefault(key, finding)
            ranks.setdefault(key, []).append(rank)
    merged = []
    for key, finding in first.items():
        on = ranks[key]
        details = {**(finding.details or {}), "ranks": on}
        only = f" (on rank {', '.join(map(str, on))} only)" if len(on) < len(per_rank) else ""
        merged.append(replace(finding, message=finding.message + only, details=details))
    return sorted(merged, key=Finding.sort_key)


def _merged_static(views: Sequence[RankView]) -> list[StaticCheck]:
    """The scan's findings against the measurement: confirmed when any rank confirmed them."""
    checks: dict[tuple[str, str, int], StaticCheck] = {}
    for view in views:
        for check in view.audit.static if view.audit is not None else []:
            finding = check.finding
            key = (finding.code, finding.filename, finding.location.row)
            if key not in checks or (check.confirmed and not checks[key].confirmed):
                checks[key] = check
    return list(checks.values())


@dataclass
class TraceRank:
    """One rank's trace, in a folder of traces of one job (`loopaudit analyze DIR`)."""

    rank: int
    analysis: TraceAnalysis
    findings: list[Finding]

    def _median(self, value: Callable) -> Estimate | None:
        steps = self.analysis.steps if self.analysis.marks_steps else []
        return median_interval([value(step) / 1000 for step in steps]) if steps else None

    @property
    def steps(self) -> int:
        return len(self.analysis.steps) if self.analysis.marks_steps else 0

    @property
    def step_ms(self) -> Estimate | None:
        return self._median(lambda step: step.duration_us)

    @property
    def data_wait_ms(self) -> Estimate | None:
        return self._median(lambda step: step.dataloader_us)

    @property
    def comm_ms(self) -> Estimate | None:
        return self._median(lambda step: step.comm_us)


@dataclass
class TraceJob:
    ranks: list[TraceRank]
    straggler: int | None
    straggler_reason: str
    imbalance: float | None
    findings: list[Finding]


def merge_traces(ranks: list[TraceRank]) -> TraceJob:
    """The traces of one job's ranks side by side: the same straggler and imbalance as a run's."""
    timed = [rank for rank in ranks if rank.steps >= _FEWEST_STEPS]
    if len(timed) == len(ranks) > 1:
        straggler, reason = _straggler(timed)
    else:
        straggler, reason = (
            None,
            "" if len(ranks) < 2 else f"not compared: a trace holds fewer than {_FEWEST_STEPS} steps",
        )
    imbalance = _imbalance(ranks)
    traces = frozenset(f.filename for r in ranks for f in r.findings if _is_trace(f.filename))
    return TraceJob(ranks, straggler, reason, imbalance, merged_findings([(r.rank, r.findings) for r in ranks], traces))


def _is_trace(filename: str) -> bool:
    return filename.endswith((".json", ".json.gz"))
