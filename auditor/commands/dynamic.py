"""`loopaudit run` (run a script under measurement), `loopaudit analyze` (read a profiler trace) and
`loopaudit compare` (two runs' JSON side by side: a regression gate).

None imports torch in this process: `run` starts the script in a child process that does, and
`analyze` and `compare` only read JSON.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, cast

import typer

from loopaudit.commands.shared import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    OutputFormat,
    build_settings,
    usage_error,
    wants_color,
)
from loopaudit.configuration.config_file import ConfigError
from loopaudit.findings.finding import Finding
from loopaudit.profiling.in_loopaudit.timing import steps_phrase
from loopaudit.reporting import FORMATS, format_names
from loopaudit.rule_api.registry import static_rules
from loopaudit.rule_api.rule import RuntimeRule
from loopaudit.scan.engine import analyze_path
from loopaudit.scan.options import ScanOptions


def _split(rules) -> tuple[tuple[type[RuntimeRule], ...], frozenset[str]]:
    """The runtime rules among `rules`, and the codes of the static ones (which static findings to list)."""
    runtime = tuple(rule for rule in rules if issubclass(rule, RuntimeRule))
    static = frozenset(rule.code for rule in rules if not issubclass(rule, RuntimeRule))
    return runtime, static


def _default_trace_path(script: Path) -> str:
    """`train.pt.trace.json` in the working directory (the name TensorBoard's plugin looks for),
    never one that exists already: an earlier trace is the user's, not ours to overwrite."""
    candidate = Path(f"{script.stem}.pt.trace.json")
    number = 1
    while candidate.exists():
        candidate = Path(f"{script.stem}.{number}.pt.trace.json")
        number += 1
    return str(candidate.resolve())


def run(
    script: Annotated[
        str, typer.Argument(help="The training script, run as `python SCRIPT ARGS...` runs it.", show_default=False)
    ],
    script_args: Annotated[
        list[str] | None, typer.Argument(help="The script's own arguments, after `--`.", show_default=False)
    ] = None,
    profile: Annotated[
        bool, typer.Option("--profile", help="Also record torch.profiler over the measured steps and write the trace.")
    ] = False,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Steps to measure.")] = 20,
    max_steps: Annotated[
        int,
        typer.Option(
            "--max-steps",
            min=1,
            help=(
                "Measure on, up to this many steps, while a verdict is undecided (the data-wait share's interval "
                "straddles its threshold) or a run of slow steps was left out. Not with --profile."
            ),
        ),
    ] = 100,
    warmup: Annotated[
        int, typer.Option("--warmup", min=0, help="Steps to let run before measuring (start-up, caches, lazy init).")
    ] = 5,
    stop: Annotated[
        bool, typer.Option("--stop/--no-stop", help="Stop the script once the steps are measured, or let it finish.")
    ] = True,
    trace_out: Annotated[
        str | None,
        typer.Option(
            "--trace-out", help="Where to write the trace (implies --profile). Default: SCRIPT.pt.trace.json here."
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0,
            help="Stop the script this many seconds after it starts (importing torch not counted), and report what was measured.",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--output-format", help=f"{format_names()}.")
    ] = OutputFormat.full,
    select: Annotated[
        list[str] | None, typer.Option(help="Only these rule codes or prefixes (static and runtime).")
    ] = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Skip these rule codes or prefixes.")] = None,
    exit_zero: Annotated[
        bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings (not when the script fails).")
    ] = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colour on or off.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="Use this configuration file.")] = None,
    isolated: Annotated[bool, typer.Option("--isolated", help="Ignore every configuration file.")] = False,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            min=1,
            help=(
                "Run the script as this many ranks of one distributed job on this machine, as "
                "`torchrun --standalone --nproc-per-node N` would (RANK, WORLD_SIZE, MASTER_ADDR, ... set), and "
                "report every rank: step time, data wait, comm wait, the straggler."
            ),
        ),
    ] = 1,
    launcher: Annotated[
        str | None,
        typer.Option(
            "--launcher",
            help=(
                "Run the ranks under your own launcher command instead, as one string: "
                '`--launcher "torchrun --nproc-per-node 4"`, `--launcher "accelerate launch --num_processes 2"`. '
                "It is called as LAUNCHER -m <loopaudit's runner> SCRIPT ARGS."
            ),
        ),
    ] = None,
) -> None:
    """Run a training script for a few steps and measure its step time, data waits and syncs.

    The script runs unmodified, as `__main__`, in its own process; loopaudit finds its steps through
    `optimizer.step()` (or DataLoader batches), measures WARMUP+STEPS of them and stops it. Needs torch
    (`pip install 'loopaudit[profile]'`). Exit status: the script's own when it fails, 2 when it never
    reached the measured steps, 130 or 143 when stopped by SIGINT or SIGTERM (reporting what was
    measured), else 1 with findings and 0 without.
    """
    # Imported here, not at the top: every `loopaudit scan` imports this module (for the commands'
    # signatures), and the measured reports' imports would cost each scan 30 ms.
    from loopaudit.profiling.in_loopaudit.audit import audit_run, display_path
    from loopaudit.profiling.in_loopaudit.breakdown import from_run
    from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
    from loopaudit.profiling.in_loopaudit.runner import RunRequest, run_script, torch_is_installed
    from loopaudit.reporting import measured, measured_json

    path = Path(script)
    if not path.exists():
        raise usage_error(f"no such file: {script}")
    if not path.is_file():
        raise usage_error(f"not a file: {script} (give the training script itself)")
    if trace_out is not None:
        profile = True
        if not Path(trace_out).resolve().parent.is_dir():
            raise usage_error(f"--trace-out: the folder of {trace_out} does not exist")
        if Path(trace_out).is_dir():
            raise usage_error(f"--trace-out: {trace_out} is a folder; give the trace file's name")
    settings = build_settings(select, None, ignore, None, config, isolated)
    try:
        runtime_rules, shown = _split(settings.rules_for(path))
        # Every static rule runs (some runtime rules weigh the scan's word); the selection only
        # decides which static findings are listed. The file's step methods, periodic names and
        # device setting apply.
        options = replace(settings.options_for(path), rules=static_rules())
    except ConfigError as error:
        raise usage_error(str(error)) from None
    if not torch_is_installed():
        raise usage_error("`loopaudit run` needs torch in this environment: pip install 'loopaudit[profile]'")

    distributed = nproc_per_node > 1 or launcher is not None
    if distributed and profile:
        raise usage_error("--profile records one process: measure the ranks without it, or profile one rank")
    if nproc_per_node > 1 and launcher is not None:
        raise usage_error("--nproc-per-node and --launcher both start the ranks: give one of them")
    launcher_command = shlex.split(launcher) if launcher is not None else None
    if launcher_command == []:
        raise usage_error('--launcher: give the launcher\'s command, e.g. "torchrun --nproc-per-node 2"')

    script_path = str(path.resolve())
    scan: list[Finding] = []

    def scan_while_it_runs() -> None:
        scan.extend(analyze_path(script_path, display_path(script_path), options, explicit=True))

    request = RunRequest(
        script=script,
        args=list(script_args or []),
        warmup=warmup,
        steps=steps,
        longest=max(steps, max_steps),
        thresholds=tuple(
            sorted({rule.data_wait_threshold for rule in runtime_rules if rule.data_wait_threshold is not None})
        ),
        profile=profile,
        trace_out=str(Path(trace_out).resolve()) if trace_out else (_default_trace_path(path) if profile else None),
        stop=stop,
        timeout=timeout,
        # JSON goes to stdout alone: the script's own output moves to stderr.
        script_output=sys.stderr if output_format is not OutputFormat.full else None,
        on_progress=_PhaseNotes(warmup, steps) if output_format is OutputFormat.full and _on_terminal() else None,
    )
    if distributed:
        shown_as = _JobReport(runtime_rules, shown, options, output_format, color, exit_zero)
        _run_job(request, nproc_per_node, launcher_command, scan_while_it_runs, scan, shown_as)
    outcome = run_script(request, scan_while_it_runs)
    report = outcome.report
    # A timeout or a signal to loopaudit is loopaudit's (or the user's) doing, not the script failing.
    script_failed = (
        outcome.status != 0 and not outcome.timed_out and not outcome.interrupted and not (report and report.stopped)
    )
    if outcome.interrupted and not (report and report.steps):
        signal_number = cast(int, outcome.signal)  # interrupted: the signal is set
        raise _end(f"{_stopped_by(signal_number)} before any step was measured", 128 + signal_number)
    if report is None and outcome.timed_out:
        raise _end(
            f"--timeout {timeout:g}s passed and the script had to be killed before it handed over its measurements",
            EXIT_ERROR,
        )
    if report is None:
        raise _end(
            f"the script ended (exit status {outcome.status}) before loopaudit could write its measurements",
            outcome.status or EXIT_ERROR,
        )
    if report.error:
        raise usage_error(report.error)
    if not report.steps:
        if outcome.timed_out:
            raise _end(
                f"--timeout {timeout:g}s passed before any step was measured ({steps_phrase(report.steps_seen)} seen)",
                EXIT_ERROR,
            )
        if script_failed:
            raise _end(
                f"the script ended with exit status {outcome.status} before any step was measured (its own output is above)",
                outcome.status,
            )
        raise _end(_why_nothing_was_measured(report.steps_seen, warmup), EXIT_ERROR)

    trace = _window_trace(report.trace)
    scan += _scan_other_files([report], script_path, options)
    evidence = RunEvidence(report, script_path, trace, scan)
    audit = audit_run(evidence, runtime_rules, [finding for finding in scan if finding.code in shown])
    breakdown = from_run(evidence)
    headline, notes = _describe_run(evidence, outcome, script_failed, display_path(script_path))
    if output_format is OutputFormat.json:
        status = {
            "exit_status": outcome.status,
            "stopped": report.stopped,
            "window_complete": report.window_complete,
            "timed_out": outcome.timed_out,
            "interrupted_by": signal.Signals(cast(int, outcome.signal)).name if outcome.interrupted else None,
        }
        document = measured_json.run_document(audit, breakdown, display_path(script_path), request.args, status)
        measured_json.write(document, sys.stdout)
    elif output_format is OutputFormat.full:
        measured.render_run(audit, breakdown, headline, notes, sys.stdout, wants_color(color))
    else:
        FORMATS[output_format.value](audit.findings, sys.stdout, wants_color(color))
        if output_format is OutputFormat.concise and not audit.findings:
            typer.echo("All checks passed: no findings in the measured steps.")
    if output_format is not OutputFormat.full:
        for note in notes if script_failed or outcome.timed_out or outcome.interrupted else []:
            typer.echo(f"loopaudit: {note}", err=True)
    if script_failed:
        raise typer.Exit(outcome.status)
    if outcome.interrupted:
        raise typer.Exit(128 + cast(int, outcome.signal))
    raise typer.Exit(EXIT_FINDINGS if audit.findings and not exit_zero else EXIT_CLEAN)


@dataclass(frozen=True)
class _JobReport:
    """What a job's report is made of and how it is shown: as `run` takes it for one process."""

    runtime_rules: tuple[type[RuntimeRule], ...]
    shown: frozenset[str]
    options: ScanOptions
    output_format: OutputFormat
    color: bool | None
    exit_zero: bool


def _run_job(
    request, world_size: int, launcher: list[str] | None, scan_while_it_runs, scan: list[Finding], report: _JobReport
):
    """`loopaudit run --nproc-per-node N` or `--launcher CMD`: every rank measured, one merged report
    (job.py). Ends with the exit status: a failed rank's own, 2 when no rank measured a step, else 1
    with findings."""
    from loopaudit.profiling.in_loopaudit.audit import audit_run, display_path
    from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
    from loopaudit.profiling.in_loopaudit.job import RankView, first_failure, merge, rank_status
    from loopaudit.profiling.in_loopaudit.runner import LauncherError, run_launched, run_ranks
    from loopaudit.reporting import measured, measured_json

    script_path = str(Path(request.script).resolve())
    launcher_status = None
    if launcher is not None:
        try:
            outcomes, launcher_status = run_launched(request, launcher, scan_while_it_runs)
        except LauncherError as error:
            raise usage_error(str(error)) from None
        world_size = len(outcomes)
        if not outcomes:
            raise _end(
                f"the launcher ended (exit status {launcher_status}) before any rank started; its output is above",
                launcher_status or EXIT_ERROR,
            )
    else:
        outcomes = run_ranks(request, world_size, scan_while_it_runs)
    probed = [outcome.outcome.report for outcome in outcomes if outcome.outcome.report is not None]
    refused = next((p.error for p in probed if p.error), None)  # the probe could not run (no torch)
    if refused is not None:
        raise usage_error(refused)
    # the script's own findings (scanned while it ran) and the other files any rank saw, scanned once
    files = scan + _scan_other_files([p for p in probed if p.steps], script_path, report.options)
    shown_files = [f for f in files if f.code in report.shown]
    views = []
    first = first_failure(outcomes)
    for outcome in outcomes:
        status, failed = rank_status(outcome, first)
        view = RankView(outcome.rank, outcome, status, failed)
        if outcome.outcome.report is not None and outcome.outcome.report.steps:
            view.evidence = RunEvidence(outcome.outcome.report, script_path, None, files)
            view.audit = audit_run(view.evidence, report.runtime_rules, shown_files)
        views.append(view)
    first_status = next((o.outcome.status for o in outcomes if o.rank == first), None)
    job = merge(views)
    measured_steps = [view.steps for view in views if view.steps]
    display = display_path(script_path)
    failures = [view for view in views if view.failed]
    if report.output_format is OutputFormat.json:
        measured_json.write(measured_json.job_document(job, display, request.args, world_size), sys.stdout)
    elif report.output_format is OutputFormat.full:
        device = next((view.evidence.report.device for view in views if view.evidence), "?")
        headline = f"loopaudit run: {display} as {world_size} ranks on {device}"
        notes = []
        if measured_steps:
            notes.append(
                f"{max(measured_steps)} steps measured per rank after {steps_phrase(request.warmup, 'warm-up')}."
            )
        if first is not None:
            others = [view.rank for view in failures if view.rank != first]
            after = f"; rank {', '.join(map(str, others))} failed after it" if others else ""
            notes.append(
                f"Rank {first} failed first (exit status {first_status}){after}. The ranks' own output is above."
            )
        measured.render_job(job, headline, notes, sys.stdout, wants_color(report.color))
    else:
        FORMATS[report.output_format.value](job.findings, sys.stdout, wants_color(report.color))
    if first is not None:
        if report.output_format is not OutputFormat.full:
            typer.echo(f"loopaudit: rank {first} failed first, exit status {first_status}", err=True)
        raise typer.Exit(cast(int, first_status))
    interrupted = next((o.outcome.signal for o in outcomes if o.outcome.interrupted), None)
    if interrupted is not None:
        raise typer.Exit(128 + interrupted)
    if not measured_steps:
        raise _end("no rank measured a step: " + "; ".join(f"rank {v.rank} {v.status}" for v in views), EXIT_ERROR)
    stuck = [view.rank for view in views if view.outcome.stuck_after is not None]
    if stuck or (job.straggler is not None and all(o.outcome.timed_out for o in outcomes)):
        # a job that hangs is a failure a gate must see, whatever was measured before it
        hung = stuck or [cast(int, job.straggler)]
        raise _end(f"the job hung: rank {', '.join(map(str, hung))} stopped making progress", EXIT_ERROR)
    raise typer.Exit(EXIT_FINDINGS if job.findings and not report.exit_zero else EXIT_CLEAN)


def _stopped_by(number: int) -> str:
    return "interrupted" if number == signal.SIGINT else f"stopped by {signal.Signals(number).name}"


def _end(message: str, status: int) -> typer.Exit:
    typer.echo(f"loopaudit: {message}", err=True)
    return typer.Exit(status)


def _why_nothing_was_measured(steps_seen: int, warmup: int) -> str:
    if steps_seen == 0:
        return (
            "the script never took a step: no `optimizer.step()` ran and no torch DataLoader handed out a "
            "batch, so there was nothing to measure"
        )
    return f"the script took {steps_phrase(steps_seen)}, all of them warm-up (--warmup {warmup}): rerun with a smaller --warmup to measure them"


def _window_trace(path: str | None):
    """The measured window's trace, analysed; None without --profile, or when it cannot be read
    (the run's own measurements still stand)."""
    if path is None:
        return None
    from loopaudit.profiling.in_loopaudit.trace import TraceError, load_trace
    from loopaudit.profiling.in_loopaudit.trace_analysis import analyze_trace

    try:
        return analyze_trace(load_trace(path))
    except TraceError as error:
        typer.echo(f"loopaudit: warning: the trace could not be analysed: {error}", err=True)
        return None


def _scan_other_files(reports, script: str, options: ScanOptions) -> list[Finding]:
    """Static findings of the user's other files where the run saw something (a sync in a helper
    module), so that they can be confirmed too; each file once, for one process or every rank."""
    from loopaudit.profiling.in_loopaudit.audit import display_path

    files = set()
    for report in reports:
        files |= {record.file for record in (*report.syncs, *report.empty_cache, *report.batch_moves)}
        files |= {loader.file for loader in report.loaders if loader.file}
    findings: list[Finding] = []
    for file in sorted({os.path.abspath(file) for file in files} - {script}):
        if file.endswith(".py") and os.path.isfile(file):
            findings += analyze_path(file, display_path(file), options, explicit=True)
    return findings


def _on_terminal() -> bool:
    return sys.stdout.isatty() and sys.stderr.isatty()


class _PhaseNotes:
    """Says on stderr when the run moves on: steps found and warming up, measuring. Lines rather than a
    live bar: the script writes to the same terminal, and would cut through a bar redrawn in place."""

    def __init__(self, warmup: int, steps: int) -> None:
        self.warmup, self.steps = warmup, steps
        self._said = ""

    def __call__(self, seen: int) -> None:
        if seen < self.warmup:
            phase = f"loopaudit: steps found; warming up ({steps_phrase(self.warmup)})"
        elif seen < self.warmup + self.steps:
            phase = f"loopaudit: measuring {steps_phrase(self.steps)}"
        else:
            return
        if phase != self._said:
            self._said = phase
            typer.echo(phase, err=True)


def _describe_run(evidence, outcome, script_failed: bool, script: str) -> tuple[str, list[str]]:
    report = evidence.report
    unit = (
        "optimizer steps" if report.step_kind == "optimizer" else "batches (no optimizer stepped: one step per batch)"
    )
    headline = f"loopaudit run: {script} on {report.device} (torch {report.torch_version})"
    notes = [f"{len(report.steps)} {unit} measured after {steps_phrase(report.warmup, 'warm-up')}."]
    if len(report.steps) == 1:
        notes[0] = notes[0].replace("optimizer steps", "optimizer step").replace("batches (", "batch (")
    if report.startup_excluded:
        notes.append(
            "Step 1 ran from the script's start (imports, building the model, no batch fetched first): it is left out."
        )
    if len(report.steps) > report.window:
        notes.append(
            f"The window went on past the {report.window} steps asked for until its verdicts were decided "
            f"(at most --max-steps {report.longest})."
        )
    transient = evidence.transient
    if transient is not None:
        first = report.warmup + transient.first + 1  # numbered as the step table numbers them
        last = report.warmup + transient.last + 1
        notes.append(
            f"Steps {first}-{last} ran {transient.ratio:.1f}x slower than the others ({transient.slow_ms:.1f} ms "
            f"against {transient.steady_ms:.1f} ms): a transient (a warm-up that had not ended, other work on the "
            "machine), left out of the step time and the data-wait share."
        )
    if report.stopped:
        notes.append("The script was stopped after them (--no-stop lets it finish).")
    if outcome.timed_out:
        notes.append(f"The script was interrupted at --timeout after {steps_phrase(len(report.steps), 'measured')}.")
    elif outcome.interrupted:
        stopped = _stopped_by(outcome.signal)
        notes.append(f"{stopped[0].upper()}{stopped[1:]}: what was measured until then is below.")
    elif not report.window_complete:
        notes.append(f"The script ended before the {report.window} steps asked for: the measurement covers fewer.")
    if script_failed:
        notes.append(
            f"The script ended with exit status {outcome.status}; its own output (a traceback, if it raised) is above."
        )
    if report.trace:
        notes.append(
            f"Trace of the measured steps: {report.trace} (open it in https://ui.perfetto.dev or TensorBoard)."
        )
    return headline, notes


def analyze(
    trace: Annotated[
        str,
        typer.Argument(
            help="A torch.profiler (kineto) trace: .json or .json.gz; or a folder with one trace per rank of a job.",
            show_default=False,
        ),
    ],
    output_format: Annotated[
        OutputFormat, typer.Option("--output-format", help=f"{format_names()}.")
    ] = OutputFormat.full,
    select: Annotated[list[str] | None, typer.Option(help="Only these rule codes or prefixes.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(help="Skip these rule codes or prefixes.")] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings.")] = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colour on or off.")] = None,
    config: Annotated[str | None, typer.Option("--config", help="Use this configuration file.")] = None,
    isolated: Annotated[bool, typer.Option("--isolated", help="Ignore every configuration file.")] = False,
) -> None:
    """Analyse a profiler trace someone already recorded: step breakdown, DataLoader share, syncs,
    pageable copies, allocator churn and GPU idle time, with the LA6xx findings they show."""
    from loopaudit.profiling.in_loopaudit.audit import audit_trace
    from loopaudit.profiling.in_loopaudit.breakdown import from_trace
    from loopaudit.profiling.in_loopaudit.trace import TraceError, load_trace
    from loopaudit.profiling.in_loopaudit.trace_analysis import analyze_trace
    from loopaudit.reporting import measured, measured_json

    settings = build_settings(select, None, ignore, None, config, isolated)
    if Path(trace).is_dir():
        _analyze_ranks(Path(trace), settings, output_format, color, exit_zero)
    try:
        runtime_rules, _ = _split(settings.rules_for(Path(trace)))
        analysis = analyze_trace(load_trace(trace))
    except (ConfigError, TraceError) as error:
        raise usage_error(str(error)) from None
    findings = audit_trace(analysis, runtime_rules)
    breakdown = from_trace(analysis)
    if output_format is OutputFormat.json:
        measured_json.write(measured_json.trace_document(analysis, breakdown, findings), sys.stdout)
    elif output_format is OutputFormat.full:
        measured.render_trace(analysis, breakdown, findings, sys.stdout, wants_color(color))
    else:
        FORMATS[output_format.value](findings, sys.stdout, wants_color(color))
        if output_format is OutputFormat.concise and not findings:
            typer.echo("All checks passed: no findings in the trace.")
    raise typer.Exit(EXIT_FINDINGS if findings and not exit_zero else EXIT_CLEAN)


# A rank named in a trace's file name (`rank-3.json.gz`, `trace_rank3.pt.trace.json`), where the trace
# itself carries no distributedInfo.
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def _analyze_ranks(folder: Path, settings, output_format, color, exit_zero) -> None:
    """`loopaudit analyze DIR`: each trace of the folder as one rank of a job (its distributedInfo's
    rank, else a `rank-N` in its name), then the merged report `run --nproc-per-node` gives."""
    from loopaudit.profiling.in_loopaudit.audit import audit_trace
    from loopaudit.profiling.in_loopaudit.job import TraceRank, merge_traces
    from loopaudit.profiling.in_loopaudit.trace import TraceError, load_trace
    from loopaudit.profiling.in_loopaudit.trace_analysis import analyze_trace
    from loopaudit.reporting import measured, measured_json

    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not files:
        raise usage_error(f"{folder} holds no trace (*.json or *.json.gz)")
    ranks: dict[int, TraceRank] = {}
    try:
        runtime_rules, _ = _split(settings.rules_for(folder))
        for number, path in enumerate(files):
            loaded = load_trace(path)
            named = _RANK_IN_NAME.search(path.name)
            rank = loaded.rank if loaded.rank is not None else int(named.group(1)) if named else number
            if rank in ranks:
                raise usage_error(
                    f"{path.name} and {os.path.basename(ranks[rank].analysis.path)} are both rank {rank}: "
                    "give a folder with one trace per rank"
                )
            analysis = analyze_trace(loaded)
            ranks[rank] = TraceRank(rank, analysis, audit_trace(analysis, runtime_rules))
    except (ConfigError, TraceError) as error:
        raise usage_error(str(error)) from None
    job = merge_traces([ranks[rank] for rank in sorted(ranks)])
    if output_format is OutputFormat.json:
        measured_json.write(measured_json.trace_job_document(job, str(folder)), sys.stdout)
    elif output_format is OutputFormat.full:
        measured.render_trace_job(job, str(folder), sys.stdout, wants_color(color))
    else:
        FORMATS[output_format.value](job.findings, sys.stdout, wants_color(color))
    raise typer.Exit(EXIT_FINDINGS if job.findings and not exit_zero else EXIT_CLEAN)


class ComparisonFormat(str, enum.Enum):
    full = "full"
    json = "json"


def compare(
    before: Annotated[
        str, typer.Argument(help="`loopaudit run --output-format json` of the run before.", show_default=False)
    ],
    after: Annotated[str, typer.Argument(help="The same, of the run after.", show_default=False)],
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            help=(
                "Exit 1 when a metric got worse by more than this beyond the noise (its whole 95% interval past "
                "it): step-time:+5% (of the step time), data-wait:+2% (percentage points of the step), "
                "syncs:+0 (syncs per step). Repeatable. Default: step-time:+10%, data-wait:+5%, syncs:+0."
            ),
        ),
    ] = None,
    output_format: Annotated[
        ComparisonFormat, typer.Option("--output-format", help="full or json.")
    ] = ComparisonFormat.full,
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colour on or off.")] = None,
) -> None:
    """Compare two measured runs of a script (a regression gate): step time, data wait, syncs per step
    and each sync site, with the change's 95% interval and a verdict. Exit status: 1 when a change
    crosses a --fail-on limit beyond the noise, 0 when none does, 2 when a file cannot be read."""
    from loopaudit.profiling.in_loopaudit.compare import CompareError
    from loopaudit.profiling.in_loopaudit.compare import compare as compare_runs
    from loopaudit.reporting import measured, measured_json

    documents = []
    for name in (before, after):
        try:
            with open(name, encoding="utf-8") as stream:
                documents.append(json.load(stream))
        except OSError as error:
            raise usage_error(f"cannot read {name}: {error.strerror or error}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise usage_error(f"{name} is not JSON ({error})") from None
    try:
        comparison = compare_runs(documents[0], documents[1], fail_on or (), (before, after))
    except CompareError as error:
        raise usage_error(str(error)) from None
    if output_format is ComparisonFormat.json:
        measured_json.write(measured_json.comparison_document(comparison), sys.stdout)
    else:
        measured.render_comparison(comparison, sys.stdout, wants_color(color))
    raise typer.Exit(EXIT_FINDINGS if comparison.failed else EXIT_CLEAN)
