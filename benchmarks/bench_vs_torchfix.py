#!/usr/bin/env python3
"""Benchmark: loopaudit vs TorchFix on a large real tree of Python code.

What it measures
    The wall-clock time each tool takes to lint every ``*.py`` file under one
    tree, run as its user would run it from a shell:

        loopaudit scan TREE --output-format concise --exit-zero
        torchfix --show-stderr -j NCPU TREE

    Both tools are libcst-based linters and both use every CPU (loopaudit's
    default ``--jobs 0``; TorchFix gets ``-j`` set to the CPU count, which is
    also its default). The default tree is the installed torch package's own
    sources, which any machine with torch has (~2,300 files, ~1.2M lines).

    For each tool the table shows: files and lines under the tree (counted by
    this script), wall seconds, findings, lines of output, exit status, and the
    peak RSS of its largest single process (``RUSAGE_CHILDREN.ru_maxrss``;
    exact for the first tool run, for later tools shown only when it rises).
    The last column is TorchFix seconds / loopaudit seconds.

TorchFix isolation
    ``torchfix==0.7.0`` pins ``libcst<1.6``, so it lives in its own virtual
    environment, created on first use (default ``<repo>/.bench-venv/torchfix``,
    git-ignored). It does not need torch.

How to run
    python benchmarks/bench_vs_torchfix.py                      # both tools
    python benchmarks/bench_vs_torchfix.py --tool loopaudit     # one tool
    python benchmarks/bench_vs_torchfix.py --tree ~/src/myproj --json out.json

    TorchFix takes 15+ minutes on torch's sources with 2 CPUs.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO / ".bench-venv" / "torchfix"
TORCHFIX_SPEC = "torchfix==0.7.0"
NCPU = os.cpu_count() or 1

# A finding is one "path:line:col: CODE message" line (both tools print this).
LOOPAUDIT_FINDING = re.compile(r":\d+:\d+: LA\d+ ")
TORCHFIX_FINDING = re.compile(r":\d+:\d+: TOR\d+ ")


class BenchError(Exception):
    """A problem to report to the user in one line, without a traceback."""


def count_tree(tree: Path) -> tuple[int, int]:
    """Number of *.py files under `tree` and their total number of lines.

    Reading every file here also warms the page cache, so neither tool pays
    for cold disk reads that the other does not.
    """
    files = lines = 0
    for path in tree.rglob("*.py"):
        if path.is_file():
            files += 1
            with open(path, "rb") as f:
                lines += sum(1 for _ in f)
    return files, lines


def default_tree() -> Path:
    """The installed torch package's source folder (found without importing it)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise BenchError(
            "torch is not installed in this Python, so there is no default tree: install torch or pass --tree PATH"
        )
    return Path(spec.origin).parent  # i.e. os.path.dirname(torch.__file__)


def ensure_torchfix(venv: Path) -> Path:
    """Return the path of the `torchfix` command, creating its venv if needed."""
    exe = venv / "bin" / "torchfix"
    if exe.exists():
        return exe
    print(f"Creating a venv for TorchFix at {venv} (once) ...", file=sys.stderr)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        # TorchFix 0.7.0 depends on flake8, PyYAML and libcst<1.6, not on torch.
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", TORCHFIX_SPEC],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)  # don't leave a half-built venv
            detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            raise BenchError(
                f"could not set up TorchFix's venv: `{' '.join(cmd)}` failed (exit {proc.returncode}): {detail[0]}"
            )
    if not exe.exists():
        raise BenchError(f"{TORCHFIX_SPEC} installed, but {exe} is missing")
    return exe


def package_version(python: str, name: str) -> str:
    """Version of package `name` as installed for interpreter `python`."""
    code = f"from importlib.metadata import version; print(version({name!r}))"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return proc.stdout.strip() or "?"


def git_revision() -> str | None:
    """The repo's commit (with -dirty for local edits), to tie results to code."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return None
    return proc.stdout.strip() or None


def timed_run(cmd: list[str]) -> dict:
    """Run `cmd`, capturing its output; return wall seconds, output and peak RSS."""
    rss_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    seconds = time.perf_counter() - start
    rss_after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    return {
        "command": " ".join(cmd),
        "seconds": round(seconds, 2),
        "exit_code": proc.returncode,
        "stdout": proc.stdout,
        "stderr": proc.stderr,
        # ru_maxrss is a running maximum over all children: it only tells us
        # this command's peak when the peak rose during this command.
        "peak_rss_mib": round(rss_after / 1024) if rss_after > rss_before else None,
        "load_avg_1min_before": round(load, 2),
    }


def run_loopaudit(tree: Path) -> dict:
    exe = shutil.which("loopaudit")
    if exe is None:
        raise BenchError("the `loopaudit` command is not on PATH: pip install -e .")
    result = timed_run([exe, "scan", str(tree), "--output-format", "concise", "--exit-zero"])
    result["findings"] = sum(bool(LOOPAUDIT_FINDING.search(line)) for line in result["stdout"].splitlines())
    result["flags"] = "--output-format concise --exit-zero (jobs: default 0 = all CPUs)"
    result["libcst"] = metadata.version("libcst")
    result["version"] = metadata.version("loopaudit")
    return result


def run_torchfix(tree: Path, venv: Path) -> dict:
    exe = ensure_torchfix(venv)
    # --show-stderr only stops TorchFix from swallowing libcst's per-file
    # messages, so that we can count the files it failed to parse.
    result = timed_run([str(exe), "--show-stderr", "-j", str(NCPU), str(tree)])
    result["findings"] = sum(bool(TORCHFIX_FINDING.search(line)) for line in result["stdout"].splitlines())
    result["failed_files"] = result["stderr"].count("Failed to codemod ")
    checked = re.search(r"Finished checking (\d+) files", result["stderr"])
    # TorchFix skips, unparsed, the files that never mention "torch".
    result["files_checked_by_tool"] = int(checked.group(1)) if checked else None
    result["flags"] = f"--show-stderr -j {NCPU}"
    python = str(venv / "bin" / "python")
    result["libcst"] = package_version(python, "libcst")
    result["version"] = package_version(python, "torchfix")
    return result


def print_table(files: int, lines: int, results: dict) -> None:
    head = f"{'tool':<10} {'files':>6} {'lines':>10} {'seconds':>8} {'findings':>8} {'out lines':>9} {'exit':>4} {'peak RSS':>9}  flags"
    print(head)
    print("-" * len(head))
    for tool, r in results.items():
        rss = f"{r['peak_rss_mib']} MiB" if r["peak_rss_mib"] else "n/a"
        out_lines = len(r["stdout"].splitlines())
        print(
            f"{tool:<10} {files:>6} {lines:>10,} {r['seconds']:>8.1f} {r['findings']:>8} "
            f"{out_lines:>9} {r['exit_code']:>4} {rss:>9}  {r['flags']}"
        )
    if len(results) == 2:
        ratio = results["torchfix"]["seconds"] / results["loopaudit"]["seconds"]
        print(f"\nTorchFix / loopaudit wall time: {ratio:.1f}x")
    if "torchfix" in results:
        tf = results["torchfix"]
        print(
            f"TorchFix parsed {tf['files_checked_by_tool']} files that mention 'torch' "
            f"and failed on {tf['failed_files']}."
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="folder to scan (default: torch's installed sources)")
    parser.add_argument("--tool", choices=["loopaudit", "torchfix", "both"], default="both")
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"TorchFix's venv (default: {DEFAULT_VENV})")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args()

    try:
        tree = (args.tree or default_tree()).resolve()
        if not tree.is_dir():
            raise BenchError(f"{tree} is not a folder")
        # Set up TorchFix before timing anything, so venv creation is not timed.
        if args.tool in ("torchfix", "both"):
            ensure_torchfix(args.venv)

        revision = git_revision()  # before running: the repo may change meanwhile
        files, lines = count_tree(tree)
        print(f"Tree: {tree}\n{files} .py files, {lines:,} lines, {NCPU} CPUs\n", file=sys.stderr)

        results = {}
        # loopaudit first: its peak RSS reading is then exact.
        if args.tool in ("loopaudit", "both"):
            print("Running loopaudit ...", file=sys.stderr)
            results["loopaudit"] = run_loopaudit(tree)
        if args.tool in ("torchfix", "both"):
            print("Running TorchFix (slow) ...", file=sys.stderr)
            results["torchfix"] = run_torchfix(tree, args.venv)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130

    print_table(files, lines, results)

    if args.json:
        try:
            torch_version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            torch_version = None
        report = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": {"cpus": NCPU, "platform": platform.platform(), "python": platform.python_version()},
            "loopaudit_git": revision,
            "tree": str(tree),
            "torch_version": torch_version,
            "files": files,
            "lines": lines,
            # Keep the JSON small: drop the raw output, keep its line count.
            "results": {
                tool: {k: v for k, v in r.items() if k not in ("stdout", "stderr")}
                | {"output_lines": len(r["stdout"].splitlines())}
                for tool, r in results.items()
            },
        }
        if len(results) == 2:
            report["ratio_torchfix_over_loopaudit"] = round(
                results["torchfix"]["seconds"] / results["loopaudit"]["seconds"], 2
            )
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nWrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
