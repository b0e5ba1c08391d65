"""The terminal report of `loopaudit run` and `loopaudit analyze`: where the step time went (a table
and a bar per step), the sync sites, the DataLoaders, the findings with their source lines, and the
static findings next to what was measured.

What comes from the script or the trace (file names, calls, operators, datasets, the device's name)
is shown through `_shown`: never read as rich markup, control characters as their pictures. The
console writes only what the stream's encoding can carry (safe_text.EncodableStream).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import TextIO, cast

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

from loopaudit.findings.finding import Finding
from loopaudit.profiling.in_loopaudit.audit import RunAudit, display_path
from loopaudit.profiling.in_loopaudit.breakdown import PARTS, Breakdown
from loopaudit.profiling.in_loopaudit.compare import Change, Comparison
from loopaudit.profiling.in_loopaudit.job import JobAudit, Timed, TraceJob
from loopaudit.profiling.in_loopaudit.timing import steps_phrase
from loopaudit.profiling.in_loopaudit.trace_analysis import TraceAnalysis
from loopaudit.profiling.in_script.report import describe_site
from loopaudit.reporting import full
from loopaudit.reporting.safe_text import EncodableStream, terminal_ready

_BAR_WIDTH = 48
_MAX_BARS = 40
# A step this many times the median is marked in the table (the median and p90 are robust to it).
_OUTLIER = 3.0
# Each part's bar character and colour: the characters alone tell them apart without colour.
_PART_STYLE = {"compute": ("█", "green"), "data_wait": ("░", "red"), "sync_stall": ("▓", "yellow")}
_PART_NAME = {"compute": "compute", "data_wait": "data wait", "sync_stall": "sync stall"}


def _console(out: TextIO, color: bool) -> Console:
    return Console(
        file=cast(TextIO, EncodableStream(out)),
        force_terminal=color,
        no_color=not color,
        highlight=False,
        soft_wrap=True,
        width=120,
    )


def _shown(text: str, style: str = "") -> Text:
    """Text from outside loopaudit: a table cell given a str would read `[bold]` in a file name as
    markup (and fail on `[/x]`), and a terminal would act on its control characters."""
    return Text(terminal_ready(text), style=style)


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} ms" if value >= 1 else f"{value:.2f} ms"


def _interval_ms(estimate) -> str:
    return "" if estimate.low is None else f" [{_ms(estimate.low)}, {_ms(estimate.high)}]"


def _breakdown(console: Console, breakdown: Breakdown, why_no_sync: str) -> None:
    time = breakdown.step_time_ms
    estimate = breakdown.step_time
    if estimate is not None:  # a live run: the steady steps' median with its 95% interval
        line = (
            f"  median {_ms(time['median'])}{_interval_ms(estimate)} over {steps_phrase(estimate.steps, 'steady')}, "
            f"p90 {_ms(time['p90'])}"
        )
    else:
        line = f"  median {_ms(time['median'])}, p90 {_ms(time['p90'])}"
    console.print(Text.assemble(("Step time", "bold"), line))
    table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    table.add_column("part")
    table.add_column("median per step", justify="right")
    table.add_column("share of the steps", justify="right")
    for part in PARTS:
        share = breakdown.share(part)
        if share is None and part != "compute":
            reason = why_no_sync if part == "sync_stall" else "no DataLoader seen"
            table.add_row(_PART_NAME[part], "—", Text(f"— ({reason})", style="dim"))
            continue
        if part == "compute":
            measured = [p for p in PARTS if breakdown.share(p) is not None]
            share = 1.0 - sum(cast(float, breakdown.share(p)) for p in measured if p != "compute")
        table.add_row(_PART_NAME[part], _ms(breakdown.median(part)), f"{share:.1%}")
    console.print(table)
    if breakdown.data_not_ready is not None:
        console.print(
            Text.assemble(
                ("Waiting for batches not yet loaded", "bold"),
                f"  {breakdown.data_not_ready.as_share()} of the steady steps (LA602 above 5%; "
                "handing over a batch a worker had ready does not count)",
            )
        )
    _bars(console, breakdown)


def _bars(console: Console, breakdown: Breakdown) -> None:
    rows = breakdown.rows
    if not rows:
        return
    longest = max(row.total_ms for row in rows) or 1.0
    label_width = max(len(row.label) for row in rows[:_MAX_BARS])
    median = breakdown.step_time_ms["median"] or 0.0
    for row in rows[:_MAX_BARS]:
        line = Text(f"  {row.label:>{label_width}}  {_ms(row.total_ms):>9}  ")
        for part in PARTS:
            char, style = _PART_STYLE[part]
            line.append(char * round(row.part(part) / longest * _BAR_WIDTH), style=style)
        if row.label in breakdown.transient:
            line.append("  transient: left out", style="yellow")
        elif len(rows) >= 3 and median and row.total_ms > _OUTLIER * median:
            # a first epoch's worker start-up, a lazy initialisation: it weighs on the mean, not the median
            line.append(f"  {row.total_ms / median:.0f}x the median", style="yellow")
        console.print(line)
    if len(rows) > _MAX_BARS:
        console.print(Text(f"  ... {len(rows) - _MAX_BARS} more steps", style="dim"))
    legend = Text("  ")
    for part in PARTS:
        char, style = _PART_STYLE[part]
        legend.append(char, style=style)
        legend.append(f" {_PART_NAME[part]}   ")
    console.print(legend)
    console.print()


def _sync_sites(console: Console, audit: RunAudit) -> None:
    if not audit.sites:
        return
    cuda = audit.evidence.cuda
    title = "Sync sites" if cuda else "Sync sites (no GPU here: these would synchronize on CUDA)"
    console.print(Text(title, style="bold"))
    table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    for column, justify in (
        ("where", "left"),
        ("what", "left"),
        ("per step", "right"),
        ("calls", "right"),
        ("stall per step", "right"),
        ("scan", "left"),
    ):
        table.add_column(column, justify=cast(JustifyMethod, justify))
    steps = audit.evidence.steps_measured
    for site in audit.sites:
        record = site.record
        what = describe_site(record.kind, record.call) + (f" via {record.via}" if record.via else "")
        stall = _ms(record.seconds * 1000 / steps) if cuda and steps else "—"
        scan = ", ".join(site.static_codes) if site.static_codes else "not found"
        if not site.on_step_path:
            periodic = audit.evidence.step_path(record) == "below"
            scan += " (periodic: not reported)" if periodic else " (undecided: not reported)"
        table.add_row(
            _shown(f"{site.filename}:{record.line}"),
            _shown(what),
            f"{audit.evidence.per_step(record.count):g}",
            str(record.count),
            stall,
            scan,
        )
    console.print(table)
    console.print()


def _loaders(console: Console, audit: RunAudit) -> None:
    loaders = audit.evidence.loaders_in_window()
    if not loaders:
        return
    console.print(Text("DataLoaders (live settings)", style="bold"))
    steps = audit.evidence.steps_measured or 1
    total = audit.evidence.step_seconds or 1.0
    for _, loader in loaders:
        where = f"{display_path(loader.file)}:{loader.line}" if loader.file else "(created outside the script)"
        console.print(
            _shown(
                f"  {where}  {loader.dataset}, batch_size={loader.batch_size}, num_workers={loader.num_workers}, "
                f"pin_memory={loader.pin_memory}, persistent_workers={loader.persistent_workers}, "
                f"prefetch_factor={loader.prefetch_factor}: waited {_ms(loader.wait_seconds * 1000 / steps)} per step "
                f"({loader.wait_seconds / total:.1%})"
            )
        )
    console.print()


def _findings(console: Console, out: TextIO, findings: Sequence[Finding], color: bool) -> None:
    if not findings:
        return
    console.print(Text("Findings", style="bold"))
    full.render(findings, out, color)


def _static(console: Console, audit: RunAudit) -> None:
    if not audit.static:
        return
    console.print(Text("Static findings (`loopaudit scan`) against the measurement", style="bold"))
    table = Table(box=None, padding=(0, 2), show_header=False)
    for check in audit.static:
        f = check.finding
        if check.confirmed:
            verdict, style = "confirmed", "bold green"
            measurement = cast(Finding, check.measurement)  # confirmed: by this runtime finding
            measured = f"{measurement.code}: {full.describe_observed(cast(dict, measurement.observed))}"
        elif check.measurable:
            verdict, style, measured = "not confirmed", "yellow", "not seen in the measured steps"
        else:
            verdict, style, measured = "not measurable", "dim", check.unmeasurable_because or ""
        table.add_row(
            Text(verdict, style=style),
            _shown(f"{f.filename}:{f.location.row}:{f.location.column}"),
            f.code,
            Text(measured),
        )
    console.print(table)
    console.print()


def render_run(
    audit: RunAudit, breakdown: Breakdown, headline: str, notes: Sequence[str], out: TextIO, color: bool
) -> None:
    console = _console(out, color)
    console.print(_shown(headline, style="bold"))
    for note in notes:
        console.print(_shown(note))
    console.print()
    if breakdown.rows:
        _breakdown(console, breakdown, "no GPU: nothing stalls" if not audit.evidence.cuda else "")
    _sync_sites(console, audit)
    _loaders(console, audit)
    _findings(console, out, audit.findings, color)
    if audit.undecided:
        console.print(Text("Undecided (not reported: the measurement cannot tell)", style="bold"))
        for _, message in audit.undecided:
            console.print(Text(f"  {message}"))
        console.print()
    _static(console, audit)
    confirmed = sum(1 for check in audit.static if check.confirmed)
    measurable = sum(1 for check in audit.static if check.measurable)
    if measurable:
        static = f"{confirmed} of {measurable} measurable static findings confirmed"
    else:
        static = "no static finding that a run can confirm" if audit.static else "no static findings"
    console.print(Text(f"{_summary(audit.findings)}; {static}."))


def render_trace(
    analysis: TraceAnalysis, breakdown: Breakdown, findings: Sequence[Finding], out: TextIO, color: bool
) -> None:
    console = _console(out, color)
    steps = (
        "no ProfilerStep marks: the whole trace is one span"
        if not analysis.marks_steps
        else f"{len(analysis.steps)} profiler steps"
    )
    console.print(_shown(f"loopaudit analyze: {analysis.path}", style="bold"))
    console.print(_shown(f"{analysis.device}, {steps}"))
    console.print()
    if breakdown.rows:
        _breakdown(console, breakdown, "CPU-only trace: nothing stalls")
    if analysis.gpu_idle_fraction is not None:
        console.print(
            Text.assemble(
                ("GPU idle", "bold"),
                f"  {analysis.gpu_idle_fraction:.1%} of the GPU's active span (HolisticTraceAnalysis's measure)",
            )
        )
    if analysis.syncs:
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold", title_justify="left")
        for column in ("sync call", "operator", "python frame", "calls", "steps", "stall"):
            table.add_column(column)
        for site in analysis.syncs:
            table.add_row(
                _shown(site.call),
                _shown(site.operator or ""),
                _shown(str(site.frame) if site.frame else ""),
                str(site.count),
                str(site.steps),
                _ms(site.stall_us / 1000) if site.proven else "— (no GPU)",
            )
        console.print()
        console.print(table)
    if analysis.copies:
        table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
        for column in ("pageable copy", "operator", "python frame", "copies", "bytes", "GPU time"):
            table.add_column(column)
        for copy in analysis.copies:
            table.add_row(
                _shown(copy.kind),
                _shown(copy.operator or ""),
                _shown(str(copy.frame) if copy.frame else ""),
                str(copy.count),
                f"{copy.bytes:,}",
                _ms(copy.duration_us / 1000),
            )
        console.print()
        console.print(table)
    if analysis.allocator_calls:
        calls = ", ".join(f"{name} ×{count}" for name, count in sorted(analysis.allocator_calls.items()))
        console.print()
        console.print(
            Text.assemble(
                ("Allocator", "bold"),
                f"  {calls}, {_ms(analysis.allocator_us / 1000)} in all; "
                f"memory handed back to the driver in {steps_phrase(analysis.steps_freeing)}",
            )
        )
    console.print()
    _findings(console, out, findings, color)
    console.print(Text(_summary(findings) + "."))


_VERDICT_STYLE = {"worse": "bold red", "new": "bold red", "better": "green", "gone": "green", "undecided": "yellow"}


def _value(change: Change, value: float | None) -> str:
    if value is None:
        return "—"
    if change.metric == "step-time":
        return _ms(value)
    if change.metric == "data-wait":
        return f"{value:.1%}"
    return f"{value:g}"


def _change(change: Change) -> str:
    """+4.8% [+2.1%, +7.5%] for a step time, +1.2 points for a share, +1 for a count."""
    if change.change is None:
        return "—"
    if change.metric == "step-time":
        text = f"{change.change:+.1%}"
        interval = "" if change.low is None or change.high is None else f" [{change.low:+.1%}, {change.high:+.1%}]"
    elif change.metric == "data-wait":
        text = f"{change.change * 100:+.1f} points"
        interval = (
            "" if change.low is None or change.high is None else f" [{change.low * 100:+.1f}, {change.high * 100:+.1f}]"
        )
    else:
        return f"{change.change:+g} per step"
    return text + interval


def render_comparison(comparison: Comparison, out: TextIO, color: bool) -> None:
    console = _console(out, color)
    console.print(_shown(f"loopaudit compare: {comparison.before} → {comparison.after}", style="bold"))
    for note in comparison.notes:
        console.print(_shown(note))
    console.print()
    table = Table(box=None, padding=(0, 2), show_header=True, header_style="bold")
    for column, justify in (("metric", "left"), ("before", "right"), ("after", "right"), ("change [95%]", "right")):
        table.add_column(column, justify=cast(JustifyMethod, justify))
    table.add_column("verdict")
    for change in comparison.changes:
        verdict = change.verdict + (" (past the limit)" if change.failed else "")
        table.add_row(
            _shown(change.label),
            _value(change, change.before),
            _value(change, change.after),
            _change(change),
            Text(verdict, style=_VERDICT_STYLE.get(change.verdict, "")),
        )
    console.print(table)
    console.print()
    if comparison.failed:
        failed = ", ".join(change.label for change in comparison.failed)
        console.print(Text(f"Regressed beyond the noise and the limits: {failed}.", style="bold red"))
    else:
        console.print(Text("No regression beyond the noise and the limits."))


def _summary(findings: Sequence[Finding]) -> str:
    if not findings:
        return "No findings"
    counts = Counter(f.code for f in findings)
    codes = ", ".join(f"{code} ×{count}" if count > 1 else code for code, count in sorted(counts.items()))
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''} ({codes})"


def render_job(job: JobAudit, headline: str, notes: Sequence[str], out: TextIO, color: bool) -> None:
    """`loopaudit run --nproc-per-node N`: a row per rank, the straggler, the collectives, the findings."""
    console = _console(out, color)
    console.print(_shown(headline, style="bold"))
    for note in notes:
        console.print(_shown(note))
    console.print()
    _ranks(console, job)
    _straggler(console, job.straggler, job.straggler_reason)
    if job.imbalance is not None and job.imbalance >= 0.05:
        console.print(
            _shown(f"Imbalance: the slowest rank's median step is {job.imbalance:.0%} longer than the fastest's.")
        )
    elif job.imbalance is not None:
        console.print(
            _shown(
                f"Step times: every rank within {max(job.imbalance, 0.01):.0%} of the others (each step waits for the slowest)."
            )
        )
    console.print()
    _collectives(console, job)
    _findings(console, out, job.findings, color)
    if job.static:
        _static(console, cast(RunAudit, _StaticOnly(job.static)))
    console.print(Text(f"{_summary(job.findings)}."))


def _ranks(console: Console, job: JobAudit) -> None:
    stuck_at = any(view.outcome.outcome.report and view.outcome.outcome.report.halted_at for view in job.ranks)
    table = Table(box=None, padding=(0, 1))
    columns = ["rank", "status", "steps", "step time", "95%", "data wait", "comm wait", "collectives"]
    for name in columns + (["stopped at"] if stuck_at else []):
        left = name in ("status", "95%", "stopped at")
        table.add_column(name, justify="left" if left else "right", no_wrap=name in ("status", "stopped at"))
    for view in job.ranks:
        report = view.outcome.outcome.report
        row: list[str | Text] = [
            f"{view.rank}{' ◀' if view.rank == job.straggler else ''}",
            _shown(view.status, style="red" if view.failed else ""),
            str(view.steps) if view.steps else "—",
            *_times(view),
            f"{view.collectives_per_step:g}/step" if view.collectives_per_step is not None else "—",
        ]
        if stuck_at:
            where = f"{display_path(report.halted_at[0])}:{report.halted_at[1]}" if report and report.halted_at else ""
            row.append(_shown(where))
        table.add_row(*row)
    console.print(table)
    console.print(
        Text(
            "Per step, medians: data wait for batches not loaded yet; comm wait inside torch.distributed's collectives.",
            style="dim",
        )
    )
    console.print()


def _collectives(console: Console, job: JobAudit) -> None:
    if not job.collectives:
        return
    console.print(Text("Collectives in the measured steps", style="bold"))
    rows = Table(box=None, padding=(0, 2), show_header=True)
    for name in ("where", "call", "per step", "time per step, by rank"):
        rows.add_column(name)
    for entry in job.collectives:
        per_step = max(entry.per_step.values(), default=0.0)
        times = ", ".join(f"{rank}: {_ms(ms)}" for rank, ms in sorted(entry.ms_per_step.items()))
        via = f" (via {entry.via})" if entry.via else ""
        rows.add_row(
            _shown(f"{display_path(entry.file)}:{entry.line}"), _shown(entry.call + via), f"{per_step:g}", times
        )
    console.print(rows)
    console.print()


def _times(rank: Timed) -> list[str]:
    """A rank's table cells: median step time, its 95% interval, data wait and comm wait per step."""
    step, wait, comm = rank.step_ms, rank.data_wait_ms, rank.comm_ms
    interval = ""
    if step is not None and step.low is not None and step.high is not None:
        interval = f"[{step.low:.1f}, {step.high:.1f}]"
    return [
        _ms(step.value) if step is not None else "—",
        interval,
        _ms(wait.value) if wait is not None else "—",
        _ms(comm.value) if comm is not None else "—",
    ]


def _straggler(console: Console, straggler: int | None, reason: str) -> None:
    if straggler is not None:
        console.print(_shown(f"Straggler (◀): rank {straggler}: {reason}.", style="bold"))
    elif reason:
        console.print(_shown(f"Straggler: none, {reason}."))


class _StaticOnly:
    """What `_static` reads of a RunAudit, for the merged static checks of a job."""

    def __init__(self, static) -> None:
        self.static = static


def render_trace_job(job: TraceJob, folder: str, out: TextIO, color: bool) -> None:
    """`loopaudit analyze DIR`: one trace per rank, side by side."""
    console = _console(out, color)
    console.print(_shown(f"loopaudit analyze: {folder}, {len(job.ranks)} ranks", style="bold"))
    console.print()
    table = Table(box=None, padding=(0, 1))
    for name in ("rank", "trace", "device", "steps", "step time", "95%", "data wait", "comm wait"):
        table.add_column(name, justify="left" if name in ("trace", "device", "95%") else "right")
    for rank in job.ranks:
        table.add_row(
            f"{rank.rank}{' ◀' if rank.rank == job.straggler else ''}",
            _shown(os.path.basename(rank.analysis.path)),
            _shown(rank.analysis.device),
            str(rank.steps) if rank.steps else "—",
            *_times(rank),
        )
    console.print(table)
    console.print(
        Text(
            "Per profiler step, medians: data wait in DataLoader `next()`; comm wait in collectives (NCCL kernels, or the host's gloo calls).",
            style="dim",
        )
    )
    console.print()
    _straggler(console, job.straggler, job.straggler_reason)
    if job.imbalance is not None:
        console.print(
            _shown(f"Imbalance: the slowest rank's median step is {job.imbalance:.0%} longer than the fastest's.")
        )
    console.print()
    _findings(console, out, job.findings, color)
    console.print(Text(f"{_summary(job.findings)}."))
