"""The `loopaudit` command.

Exit codes, as ruff's: 0 no findings, 1 findings, 2 a usage error, a path that does not exist, or an
internal error. Nothing here prints a traceback for anything a user can type or any file they have.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from loopaudit import __version__
from loopaudit.atomic import write_atomically
from loopaudit.commands.dynamic import analyze, compare, run
from loopaudit.commands.progress import ScanProgress
from loopaudit.commands.shared import (
    EXIT_CLEAN,
    EXIT_ERROR,
    EXIT_FINDINGS,
    EXIT_INTERRUPTED,
    OutputFormat,
    PlainHelpCommand,
    build_settings,
    usage_error,
    wants_color,
)
from loopaudit.configuration.config_file import ConfigError
from loopaudit.configuration.discovery import MissingPath, SourceFile, discover
from loopaudit.configuration.project_context import context_files
from loopaudit.findings.baseline import BaselineError, new_findings
from loopaudit.findings.baseline import load as load_baseline
from loopaudit.findings.baseline import write as write_baseline_file
from loopaudit.findings.finding import Finding
from loopaudit.findings.since import SinceError, changed_lines_under, on_changed_lines
from loopaudit.reporting import FORMATS, format_names
from loopaudit.reporting.safe_text import EncodableStream, terminal_ready
from loopaudit.rule_api.docs import rule_markdown
from loopaudit.rule_api.registry import all_rules, rule_by_code
from loopaudit.scan.add_noqa import with_noqa
from loopaudit.scan.cache import ENVIRONMENT_VARIABLE, FOLDER_NAME, ResultCache, default_folder
from loopaudit.scan.collector import own_collector
from loopaudit.scan.engine import FILE_CODES
from loopaudit.scan.fixing import UNREADABLE_SOURCE, applicable, fix_file, read_source
from loopaudit.scan.fixing import write_if_unchanged as write_fixed
from loopaudit.scan.project_scan import ScanResult, analyze_many, analyze_stdin

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Audits PyTorch training loops for the code that keeps a GPU idle.",
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loopaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


@app.command(cls=PlainHelpCommand, short_help="Find what keeps the GPU idle in training scripts, without running them.")
def scan(
    paths: Annotated[
        list[str] | None, typer.Argument(help="Files or folders; `-` reads stdin. Default: the current folder.")
    ] = None,
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--output-format",
            envvar="LOOPAUDIT_OUTPUT_FORMAT",
            help=f"{format_names()} (default: $LOOPAUDIT_OUTPUT_FORMAT, else the configuration's, else full).",
            show_default=False,
        ),
    ] = None,
    output_file: Annotated[
        str | None,
        typer.Option(
            "--output-file", "-o", help="Write the report to this file instead of stdout.", show_default=False
        ),
    ] = None,
    select: Annotated[
        list[str] | None,
        typer.Option(
            help="Only these rule codes or prefixes (LA1, LA101); comma-separated or repeated. Replaces the configuration's select."
        ),
    ] = None,
    extend_select: Annotated[
        list[str] | None, typer.Option("--extend-select", help="Add these rule codes or prefixes to the selection.")
    ] = None,
    ignore: Annotated[
        list[str] | None, typer.Option(help="Skip these rule codes or prefixes (added to the configuration's).")
    ] = None,
    exit_zero: Annotated[bool, typer.Option("--exit-zero", help="Exit 0 even when there are findings.")] = False,
    statistics: Annotated[
        bool, typer.Option("--statistics", help="Print how many findings each rule has instead of the findings.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Print the findings alone: no summary, no notes on fixes.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Say on stderr which files are scanned, the cache's hits and the time."),
    ] = False,
    show_files: Annotated[
        bool, typer.Option("--show-files", help="List the files the scan would read, and exit.")
    ] = False,
    show_fixes: Annotated[
        bool, typer.Option("--show-fixes", help="With --fix: list what was fixed, by file and rule.")
    ] = False,
    watch: Annotated[
        bool,
        typer.Option("--watch", "-w", help="Scan again whenever a scanned file changes, until Ctrl-C."),
    ] = False,
    add_noqa: Annotated[
        bool,
        typer.Option("--add-noqa", help="Add a `# noqa: CODE` comment to the line of every finding, and exit."),
    ] = False,
    exit_non_zero_on_fix: Annotated[
        bool,
        typer.Option(
            "--exit-non-zero-on-fix", help="With --fix: exit 1 when a file was changed, even if nothing is left."
        ),
    ] = False,
    stdin_filename: Annotated[str | None, typer.Option(help="The name to report for source read from stdin.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=0, help="Worker processes (0: one per CPU).")] = 0,
    color: Annotated[
        bool | None,
        typer.Option("--color/--no-color", help="Force colour on or off (default: when writing to a terminal)."),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option("--config", help="Use this configuration file for every file (pyproject.toml or loopaudit.toml)."),
    ] = None,
    isolated: Annotated[bool, typer.Option("--isolated", help="Ignore every configuration file.")] = False,
    force_exclude: Annotated[
        bool,
        typer.Option(
            "--force-exclude",
            help="Apply exclude/extend-exclude to files named on the command line too (for pre-commit, which names every file).",
        ),
    ] = False,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Report only findings that are not in this baseline file.")
    ] = None,
    write_baseline: Annotated[
        str | None,
        typer.Option("--write-baseline", help="Record today's findings in this file (for --baseline) and exit 0."),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", help="Report only findings on lines changed since this git revision (e.g. origin/main)."
        ),
    ] = None,
    fix: Annotated[bool, typer.Option("--fix", help="Apply the safe fixes to the files.")] = False,
    unsafe_fixes: Annotated[
        bool,
        typer.Option(
            "--unsafe-fixes",
            help="With --fix or --diff: also apply fixes that change behaviour (each rule's docs say which).",
        ),
    ] = False,
    diff: Annotated[
        bool,
        typer.Option("--diff", help="Print the fixes as a unified diff and write nothing (exit 1 when there is one)."),
    ] = False,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the cache of earlier results.")
    ] = False,
    no_project: Annotated[
        bool,
        typer.Option(
            "--no-project",
            help="Analyse files named on the command line on their own, not inside the project they lie in.",
        ),
    ] = False,
    cache_dir: Annotated[
        str | None,
        typer.Option(
            "--cache-dir",
            help=f"Keep the cache here (default: ${ENVIRONMENT_VARIABLE}, else {FOLDER_NAME} at the project root).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Scan training scripts for what keeps the GPU idle once per step.

    Host-device syncs (`.item()`, `.cpu()`, `if tensor:`), data loading (DataLoaders without workers
    or pinned memory, blocking batch copies), per-sample Python loops, allocator churn and evaluation
    without `no_grad`, found statically: the scripts are parsed, never imported or run. Exit status:
    0 no findings, 1 findings, 2 a usage error or an unreadable path.
    """
    if watch:
        arguments = {name: value for name, value in locals().items() if name != "watch"}
        if fix or diff or add_noqa or write_baseline or show_files or (paths and "-" in paths):
            raise usage_error(
                "--watch scans and reports: it cannot be combined with stdin, --fix, --diff, --add-noqa, --write-baseline or --show-files"
            )
        _watch(arguments)
    settings = build_settings(select, extend_select, ignore, output_format, config, isolated)
    paths = paths or ["."]
    if show_files:
        for source in _files_to_scan(paths, settings, force_exclude):
            typer.echo(terminal_ready(source.display))
        raise typer.Exit(EXIT_CLEAN)
    if "-" in paths and len(paths) > 1:
        raise usage_error("`-` (stdin) cannot be combined with other paths")
    if "-" in paths and (fix or diff or add_noqa):
        raise usage_error("--fix, --diff and --add-noqa work on files, not on stdin")
    if add_noqa and (fix or diff):
        raise usage_error("--add-noqa cannot be combined with --fix or --diff")
    if baseline and write_baseline:
        raise usage_error("--baseline and --write-baseline cannot be combined")
    try:
        known = load_baseline(Path(baseline)) if baseline else None
    except BaselineError as error:
        raise usage_error(str(error)) from None
    try:
        # A bar only for the human-readable formats on a terminal (it goes to stderr, and away at the end).
        show_progress = (
            sys.stdout.isatty()
            and sys.stderr.isatty()
            and OutputFormat(settings.output_format(Path.cwd()))
            in (
                OutputFormat.full,
                OutputFormat.concise,
            )
        )
        started = time.perf_counter()
        with ScanProgress("scanning", show_progress) as progress:
            cache = None if no_cache or paths == ["-"] else _open_cache(cache_dir, settings)
            results, files = _scan(paths, stdin_filename, settings, jobs, force_exclude, progress, cache, no_project)
        if verbose:
            _say_what_was_scanned(files, cache, time.perf_counter() - started)
        fixes = []
        if fix or diff:
            results.findings, fixes = _fix_files(results, files, settings, unsafe_fixes, write=not diff)
        chosen_format = OutputFormat(settings.output_format(Path.cwd()))
    except ConfigError as error:
        raise usage_error(str(error)) from None
    findings, problems = results.findings, results.problems
    for problem in problems:
        typer.echo(f"loopaudit: internal error: {terminal_ready(problem)} (please report this)", err=True)
    failed = EXIT_ERROR if problems else None
    changed = any(result.changed and not result.problem for result in fixes) and fix and not diff
    if diff:
        with _report_to(output_file):
            raise typer.Exit(failed or _print_diffs(fixes))
    if write_baseline:
        try:
            write_baseline_file(Path(write_baseline), findings)
        except (BaselineError, OSError) as error:
            raise usage_error(str(error)) from None
        typer.echo(
            f"Wrote a baseline of {len(findings)} finding{'s' if len(findings) != 1 else ''} to {write_baseline}.",
            err=True,
        )
        raise typer.Exit(failed or EXIT_CLEAN)
    findings, hidden = _narrow(findings, since, known, paths)
    if add_noqa:
        raise typer.Exit(failed or _add_noqa_comments(findings, files))

    use_color = wants_color(color) and output_file is None
    with _report_to(output_file):
        if statistics:
            _print_statistics(findings, chosen_format, use_color)
        else:
            FORMATS[chosen_format.value](findings, sys.stdout, use_color)
            if chosen_format in (OutputFormat.full, OutputFormat.concise) and not quiet:
                _print_summary(findings, len(files), hidden, len(problems))
                _print_fix_summary(findings, fixes if fix else None, unsafe_fixes)
        if show_fixes and fix:
            _print_fixes_made(fixes)
    flagged = (findings and not exit_zero) or (exit_non_zero_on_fix and changed)
    raise typer.Exit(failed or (EXIT_FINDINGS if flagged else EXIT_CLEAN))


@contextlib.contextmanager
def _report_to(output_file: str | None):
    """stdout, or the --output-file (written whole when the report is done; an unwritable path is a
    usage error before anything is printed)."""
    if output_file is None:
        yield
        return
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        try:
            write_atomically(output_file, buffer.getvalue().encode("utf-8"))
        except OSError as error:
            typer.echo(f"loopaudit: error: --output-file {output_file}: {error.strerror or error}", err=True)
            raise typer.Exit(EXIT_ERROR) from None


def _add_noqa_comments(findings: list[Finding], files: list[SourceFile]) -> int:
    """--add-noqa: the comments written, file by file (notebooks and unreadable files passed over)."""
    by_display = {source.display: source for source in files}
    by_file: dict[str, list[Finding]] = {}
    for finding in findings:
        if finding.code in FILE_CODES or finding.cell is not None or finding.filename not in by_display:
            continue
        by_file.setdefault(finding.filename, []).append(finding)
    added = 0
    for display, found in sorted(by_file.items()):
        path = by_display[display].path
        try:
            original, encoding, source = read_source(path)
        except UNREADABLE_SOURCE as error:
            typer.echo(f"loopaudit: {terminal_ready(display)}: cannot add noqa comments: {error}", err=True)
            continue
        text, count = with_noqa(source, found)
        if count:
            problem = write_fixed(path, original, text.encode(encoding))
            if problem:
                typer.echo(f"loopaudit: {terminal_ready(display)}: {problem}", err=True)
                continue
            added += count
    notebooks = sum(1 for finding in findings if finding.cell is not None)
    if notebooks:
        typer.echo(f"loopaudit: --add-noqa leaves notebooks alone ({notebooks} findings in cells)", err=True)
    typer.echo(f"Added {added} noqa comment{'s' if added != 1 else ''}.", err=True)
    return EXIT_CLEAN


_WATCH_SECONDS = 0.5  # how often the files are looked at


def _watch(arguments: dict) -> None:
    """--watch: the same scan again each time a scanned file is added, removed or changed (its size
    or modification time), a status line on stderr between runs, until Ctrl-C."""
    settings = build_settings(
        arguments["select"],
        arguments["extend_select"],
        arguments["ignore"],
        arguments["output_format"],
        arguments["config"],
        arguments["isolated"],
    )
    paths = arguments["paths"] or ["."]
    seen = None
    while True:
        current = _file_states(paths, settings, arguments["force_exclude"])
        if current != seen:
            seen = current
            typer.echo(f"[{time.strftime('%H:%M:%S')}] Scanning...", err=True)
            with contextlib.suppress(typer.Exit):  # each run's exit status is for the run, not the watch
                scan(**arguments)
            sys.stdout.flush()
            typer.echo(f"[{time.strftime('%H:%M:%S')}] Watching for file changes (Ctrl-C to stop).", err=True)
        time.sleep(_WATCH_SECONDS)


def _file_states(paths: list[str], settings, force_exclude: bool) -> dict[str, tuple[int, int]]:
    states = {}
    for source in _files_to_scan(paths, settings, force_exclude):
        try:
            stat = os.stat(source.path)
        except OSError:
            continue
        states[source.path] = (stat.st_mtime_ns, stat.st_size)
    return states


def _files_to_scan(
    paths: list[str], settings, force_exclude: bool, skipped: list[tuple[str, str]] | None = None
) -> list[SourceFile]:
    """The files a scan of `paths` reads: the walk and the excludes (a file named on the command line
    is read unless --force-exclude). `skipped` receives what the walk passed over."""
    try:
        found = discover([path for path in paths if path != "-"], skipped=skipped if skipped is not None else [])
    except MissingPath as missing:
        raise usage_error(f"no such file or folder: {missing}") from None
    return [f for f in found if (f.explicit and not force_exclude) or not settings.excluded(Path(f.path))]


def _say_what_was_scanned(files: list[SourceFile], cache, seconds: float) -> None:
    """--verbose: on stderr, so that the report on stdout stays machine-readable."""
    for source in files:
        typer.echo(f"loopaudit: scanned {terminal_ready(source.display)}", err=True)
    cached = f"; cache: {cache.hits} hits, {cache.misses} misses" if cache is not None else "; no cache"
    typer.echo(f"loopaudit: {len(files)} file{'s' if len(files) != 1 else ''} in {seconds:.2f} s{cached}", err=True)


def _print_fixes_made(fixes) -> None:
    """--show-fixes: ruff's list of what --fix changed, by file and rule."""
    made = [result for result in fixes if result.changed and not result.problem and result.fixed_codes]
    if not made:
        typer.echo("No fixes applied.")
        return
    total = sum(sum(result.fixed_codes.values()) for result in made)
    typer.echo(f"Fixed {total} finding{'s' if total != 1 else ''}:")
    for result in made:
        typer.echo(f"- {terminal_ready(result.display)}:")
        for code, count in sorted(result.fixed_codes.items()):
            rule = rule_by_code(code)
            typer.echo(f"    {count} × {code} ({rule.name if rule else code})")


def _open_cache(cache_dir: str | None, settings) -> ResultCache | None:
    """The cache: `--cache-dir`, else $LOOPAUDIT_CACHE_DIR, else `.loopaudit_cache` in the folder
    of the configuration that applies here (the project's root), else in the current folder. A
    folder that cannot be written is reported once and the scan runs without it."""
    root = settings.finder.for_folder(Path.cwd()).root
    cache = ResultCache(Path(cache_dir) if cache_dir else default_folder(root))
    problem = cache.prepare()
    if problem is not None:
        typer.echo(f"loopaudit: warning: {problem}; scanning without a cache", err=True)
        return None
    return cache


def _scan(
    paths: list[str],
    stdin_filename: str | None,
    settings,
    jobs: int,
    force_exclude: bool,
    progress=None,
    cache=None,
    alone: bool = False,
):
    """The scan's results and the files it read (one pseudo-file for stdin)."""
    if paths == ["-"]:
        name = stdin_filename or "<stdin>"
        options = settings.options_for(Path(stdin_filename or "stdin.py"))
        return analyze_stdin(sys.stdin.buffer.read(), name, options), [SourceFile(name, name, True)]
    skipped: list[tuple[str, str]] = []
    files = _files_to_scan(paths, settings, force_exclude, skipped)
    _say_skipped([(path, why) for path, why in skipped if not settings.excluded(Path(path))])
    workers = jobs or os.cpu_count() or 1
    # Files named on their own are analysed inside their project, which is not reported on.
    context = [] if alone else context_files(paths, files, lambda path: settings.excluded(path))
    items = [(f.path, f.display, f.explicit, settings.options_for(f.path)) for f in files + context]
    # Isolated: a file that crashes the parser or runs for minutes costs that file alone (workers.py).
    results = analyze_many(items, workers, progress, cache, isolated=True)
    if context:
        results = only_named(results, files)
    return results, files


def only_named(results: ScanResult, files: list[SourceFile]) -> ScanResult:
    """The results for the named files alone: the project around them was context."""
    named = {f.display for f in files}
    return ScanResult(
        [f for f in results.findings if f.filename in named],
        [p for p in results.problems if any(p.startswith(name + ":") for name in named)],
        {name: facts for name, facts in results.facts.items() if name in named},
    )


def _say_skipped(skipped: list[tuple[str, str]], shown: int = 3) -> None:
    """One line on stderr for what the walk could not read (a FIFO, a link loop, a locked folder)."""
    if not skipped:
        return
    listed = ", ".join(f"{terminal_ready(path)} ({why})" for path, why in skipped[:shown])
    more = f" and {len(skipped) - shown} more" if len(skipped) > shown else ""
    typer.echo(f"loopaudit: warning: skipped what cannot be read as a file: {listed}{more}", err=True)


def _narrow(findings, since: str | None, known: frozenset[str] | None, paths: list[str]):
    """The findings `--since` and `--baseline` keep, and what they left out, for the summary."""
    hidden = []
    if since:
        try:
            changes = changed_lines_under(since, paths)
        except SinceError as error:
            raise usage_error(str(error)) from None
        kept = on_changed_lines(findings, changes)
        hidden.append(f"{len(findings) - len(kept)} on lines unchanged since {since}")
        findings = kept
    if known is not None:
        kept = new_findings(findings, known)
        hidden.append(f"{len(findings) - len(kept)} in the baseline")
        findings = kept
    return findings, hidden


def _print_diffs(fixes) -> int:
    out = EncodableStream(sys.stdout)  # a name that is not UTF-8, an ASCII pipe: shown escaped, never a crash
    for changed in fixes:
        out.write(changed.diff)
    count = sum(changed.fixed for changed in fixes)
    files = sum(1 for changed in fixes if changed.changed)
    typer.echo(
        f"Would fix {count} finding{'s' if count != 1 else ''} in {files} file{'s' if files != 1 else ''}.", err=True
    )
    return EXIT_FINDINGS if count else EXIT_CLEAN


@app.command(
    "config",
    cls=PlainHelpCommand,
    short_help="Print the configuration that applies to a path, and where each setting comes from.",
)
def show_config(
    path: Annotated[str, typer.Argument(help="The file or folder whose configuration to show.")] = ".",
    config: Annotated[str | None, typer.Option("--config", help="Use this configuration file.")] = None,
    isolated: Annotated[bool, typer.Option("--isolated", help="Ignore every configuration file.")] = False,
    output_format: Annotated[str, typer.Option("--output-format", help="text or json.")] = "text",
) -> None:
    """Print the configuration that applies to PATH: every setting, its value and where it came from."""
    if output_format not in ("text", "json"):
        raise usage_error(f"unknown format {output_format!r}: use text or json")
    if not os.path.exists(path):
        raise usage_error(f"no such file or folder: {path}")
    settings = build_settings(None, None, None, None, config, isolated)
    target = Path(path)
    try:
        found = settings.finder.for_folder(target if target.is_dir() else target.resolve().parent)
    except ConfigError as error:
        raise usage_error(str(error)) from None
    effective = settings.effective(found)
    if output_format == "json":
        data = {
            "file": str(found.path) if found.path else None,
            "settings": {k: {"value": v, "from": src} for k, (v, src) in effective.items()},
        }
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(f"Configuration for {path}: {found.table if found.path else 'no configuration file (defaults)'}")
    width = max(map(len, effective))
    for key, (value, source) in effective.items():
        shown = "all rules" if key == "select" and value is None else json.dumps(value)
        typer.echo(f"  {key:<{width}}  {shown}    ({source})")


def _print_summary(findings, scanned: int, hidden: list[str], failed: int = 0) -> None:
    files = len({f.filename for f in findings})
    notes = f"; not shown: {', '.join(hidden)}" if hidden else ""
    if failed:  # internal errors were printed above: "all checks passed" would be untrue
        notes += f"; {failed} internal error{'s' if failed != 1 else ''}"
    if findings or failed:
        noun = "finding" if len(findings) == 1 else "findings"
        typer.echo(
            f"Found {len(findings)} {noun} in {files} file{'s' if files != 1 else ''} ({scanned} scanned{notes})."
        )
    else:
        typer.echo(f"All checks passed ({scanned} file{'s' if scanned != 1 else ''} scanned{notes}).")


def _fix_files(results, files, settings, unsafe: bool, write: bool):
    """Fix every file with an applicable fix; its findings become those left after fixing."""
    findings = results.findings
    fixable = {f.filename for f in findings if applicable(f, unsafe)}
    by_display = {f.display: f for f in files}
    fixed = []
    for display in sorted(fixable):
        source = by_display[display]
        options = settings.options_for(source.path)
        fixed.append(
            fix_file(source.path, display, options, unsafe=unsafe, write=write, facts=results.facts.get(display))
        )
    for result in fixed:
        if result.problem:
            typer.echo(f"loopaudit: {terminal_ready(result.display)}: {result.problem}", err=True)
    replaced = {r.display: r.remaining for r in fixed if r.changed and not r.problem and write}
    kept = [f for f in findings if f.filename not in replaced]
    kept += [f for remaining in replaced.values() for f in remaining]
    return sorted(kept, key=Finding.sort_key), fixed


def _print_fix_summary(findings, fixes, unsafe: bool) -> None:
    """As ruff: what was fixed, and what --fix or --unsafe-fixes would fix of what is left."""
    if fixes is not None:
        count = sum(r.fixed for r in fixes if r.changed and not r.problem)
        if count:
            typer.echo(f"Fixed {count} finding{'s' if count != 1 else ''} ({len(findings)} remaining).")
    safe = sum(1 for f in findings if applicable(f, False))
    more = sum(1 for f in findings if applicable(f, True)) - safe
    if fixes is None and safe:
        typer.echo(f"{safe} fixable with --fix.")
    if more and not unsafe:
        typer.echo(f"{more} more fixable with --fix --unsafe-fixes.")


def _print_statistics(findings, output_format: OutputFormat, color: bool) -> None:
    counts = Counter(f.code for f in findings)
    fixable = Counter(f.code for f in findings if applicable(f, False))
    rows = [(code, counts[code], rule_by_code(code)) for code in sorted(counts)]
    if output_format is OutputFormat.json:
        data = [
            {"code": code, "name": rule.name if rule else None, "count": count, "fixable": fixable[code]}
            for code, count, rule in rows
        ]
        typer.echo(json.dumps(data, indent=2))
        return
    if not rows:
        typer.echo("All checks passed: no findings to count.")
        return
    width = max(5, len(str(len(findings))))
    typer.echo(f"{'count':>{width}}  {'code':<6}     rule")
    for code, count, rule in rows:
        # [*]: every finding of the rule is fixable with --fix; [-]: some are (ruff's marks)
        marker = "[*]" if fixable[code] == count else "[-]" if fixable[code] else "   "
        typer.echo(f"{count:>{width}}  {code:<6} {marker} {rule.name if rule else ''}".rstrip())
    typer.echo(f"{len(findings):>{width}}  total in {len(rows)} rule{'s' if len(rows) != 1 else ''}")
    if fixable:
        typer.echo("[*] fixable with --fix; [-] some of them")


@app.command("rules", cls=PlainHelpCommand)
def list_rules(
    output_format: Annotated[str, typer.Option("--output-format", help="text or json.")] = "text",
) -> None:
    """List every rule: code, name, and what it flags."""
    rules = all_rules()
    if output_format == "json":
        typer.echo(json.dumps([{"code": r.code, "name": r.name, "summary": r.summary} for r in rules], indent=2))
        return
    if output_format != "text":
        raise usage_error(f"unknown format {output_format!r}: use text or json")
    table = Table(box=None, show_header=True, header_style="bold")
    table.add_column("code")
    table.add_column("name")
    table.add_column("summary")
    for rule in rules:
        # Text, not markup: summaries contain brackets (`x[mask]`) that rich would read as styles.
        table.add_row(Text(rule.code), Text(rule.name), Text(rule.summary))
    Console(soft_wrap=False, highlight=False).print(table)


@app.command("rule", cls=PlainHelpCommand)
def show_rule(code: Annotated[str, typer.Argument(help="A rule code, e.g. LA101, or its name.")]) -> None:
    """Print a rule's documentation."""
    rule = rule_by_code(code) or next((r for r in all_rules() if r.name == code), None)
    if rule is None:
        raise usage_error(f"no rule {code!r} (see `loopaudit rules`)")
    console = Console(highlight=False)
    if console.is_terminal:
        from rich.markdown import Markdown  # only here: importing it costs every scan 35 ms

        console.print(Markdown(rule_markdown(rule)))
    else:
        typer.echo(rule_markdown(rule))  # piped: the Markdown itself, not a rendering padded to the width


app.command(
    "run",
    cls=PlainHelpCommand,
    short_help="Run a training script for a few steps and measure its step time, data waits and syncs.",
)(run)
app.command(
    "analyze", cls=PlainHelpCommand, short_help="Read a torch.profiler trace: step time, data waits, GPU idle time."
)(analyze)
app.command(
    "compare",
    cls=PlainHelpCommand,
    short_help="Compare two runs' JSON: what changed beyond the noise, and a gate on regressions.",
)(compare)


@app.command("server", cls=PlainHelpCommand, short_help="Serve the scan to editors: a Language Server on stdio.")
def server() -> None:
    """Serve the scan to an editor: a Language Server on stdin/stdout (diagnostics, quick fixes, rule
    docs on hover). Needs the `lsp` extra: pip install 'loopaudit[lsp]'."""
    try:
        from loopaudit.server.language_server import serve
    except ImportError as error:
        raise usage_error(f"`loopaudit server` needs pygls: pip install 'loopaudit[lsp]' ({error})") from None
    serve()


def main() -> None:
    own_collector()  # this process runs loopaudit alone (collector.py)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("loopaudit: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
