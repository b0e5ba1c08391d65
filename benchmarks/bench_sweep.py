#!/usr/bin/env python3
"""Robustness at scale: loopaudit over every .py file of a site-packages folder, as a user and as a fuzzer.

Two passes over the same tree, each counting what must stay zero: tracebacks, internal errors, files
whose worker crashed or ran out of time (LA003 with those reasons), and false syntax errors (LA001 on
a file that Python's `ast.parse` accepts).

- scan:  `loopaudit scan TREE --no-cache` exactly as a user runs it (folder walk, prefilter, project
         analysis, workers), then once more with a warm cache: wall time, peak RSS of the largest
         process, findings;
- parse: every file named explicitly through the engine's isolated analysis (as the command runs it,
         `--every-file`), so that each one is parsed, prefilter or not: the parser's worst cases.

The tree is the site-packages of the interpreter running the script unless --tree names one;
--fetch installs the issue's package set (torch, transformers, lightning, numpy, scipy, pandas,
torchvision) and sympy, mpmath, pydantic and networkx into .bench-venv/sweep with
`pip install --no-deps --target` first.
No code from the tree is imported or run.

    python benchmarks/bench_sweep.py                       # this venv's site-packages
    python benchmarks/bench_sweep.py --fetch --every-file  # the issue's corpus, both passes
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SWEEP = REPO / ".bench-venv" / "sweep"
# torch 2.13.0: the CPU build this project's machine has on disk (any other resolves to a multi-GB build).
# sympy, mpmath and pydantic hold the self-recursive factories that once gave false syntax errors.
PACKAGES = [
    "torch==2.13.0",
    "transformers",
    "lightning",
    "numpy",
    "scipy",
    "pandas",
    "torchvision",
    "sympy",
    "mpmath",
    "pydantic",
    "networkx",
]
# LA003's reasons that mean a worker failed, rather than libcst declining valid code.
FAILED_WORKER = ("crashed", "ran past the budget", "ended unexpectedly", "without an end")


def fetch(target: Path) -> Path:
    if not all((target / name.split("=")[0]).is_dir() for name in PACKAGES):
        print(f"Installing {', '.join(PACKAGES)} into {target} (once) ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *PACKAGES], check=True
        )
    return target


def python_files(tree: Path) -> list[Path]:
    return sorted(path for path in tree.rglob("*.py") if path.is_file())


def ast_accepts(path: Path) -> bool:
    try:
        ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def tally(findings: list[dict], base: Path) -> dict:
    """What must stay zero, from a list of findings as the JSON format writes them."""
    failed = [f for f in findings if f["code"] == "LA003" and any(reason in f["message"] for reason in FAILED_WORKER)]
    syntax = [f for f in findings if f["code"] == "LA001"]
    false_syntax = [f for f in syntax if ast_accepts(base / f["filename"])]
    declined = [f for f in findings if f["code"] == "LA003" and f not in failed]
    return {
        "findings": len(findings),
        "workers_failed": [f"{f['filename']}: {f['message']}" for f in failed],
        "false_syntax_errors": [f"{f['filename']}: {f['message']}" for f in false_syntax],
        "syntax_errors": len(syntax),
        "libcst_declined": [f"{f['filename']}: {f['message']}" for f in declined],
    }


def scan_pass(tree: Path, cache: Path) -> dict:
    """`loopaudit scan` cold (no cache) and warm, from the command line."""
    runs = {}
    shutil.rmtree(cache, ignore_errors=True)
    for name, flags in (
        ("cold", ["--no-cache"]),
        ("cache written", ["--cache-dir", str(cache)]),
        ("warm", ["--cache-dir", str(cache)]),
    ):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            started = time.monotonic()
            scan = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "loopaudit",
                    "scan",
                    ".",
                    "--output-format",
                    "json",
                    "--exit-zero",
                    "--isolated",
                    *flags,
                ],
                cwd=tree,
                stdout=out,
                stderr=err,
            )
            # wait4: the peak of this run's largest process (its workers are reaped by it, and count)
            _, status, usage = os.wait4(scan.pid, 0)
            seconds = time.monotonic() - started
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(), err.read().decode(errors="replace")
        runs[name] = {
            "seconds": round(seconds, 1),
            "exit": os.waitstatus_to_exitcode(status),
            "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "traceback": "Traceback" in stderr,
            "stderr": stderr.strip().splitlines()[-3:],
        }
        if name == "cold":
            runs[name].update(tally(json.loads(stdout or "[]"), tree))
    return runs


def parse_pass(tree: Path, files: list[Path], jobs: int) -> dict:
    """Every file named explicitly (parsed whatever the prefilter says), through the isolated analysis."""
    from loopaudit.rule_api.registry import static_rules
    from loopaudit.scan.options import ScanOptions
    from loopaudit.scan.project_scan import analyze_many

    options = ScanOptions(rules=static_rules())
    items = [(str(path), path.relative_to(tree).as_posix(), True, options) for path in files]
    started = time.monotonic()
    result = analyze_many(items, jobs, isolated=True)
    seconds = time.monotonic() - started
    findings = [{"code": f.code, "filename": f.filename, "message": f.message} for f in result.findings]
    return {"seconds": round(seconds, 1), "internal_errors": result.problems[:20], **tally(findings, tree)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", type=Path, help="the folder to sweep (default: this interpreter's site-packages)")
    parser.add_argument(
        "--fetch", action="store_true", help=f"sweep {SWEEP} after installing the issue's packages there"
    )
    parser.add_argument("--every-file", action="store_true", help="also parse every file, named explicitly")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    tree = fetch(SWEEP) if args.fetch else (args.tree or Path(sysconfig.get_paths()["purelib"]))
    tree = tree.resolve()
    files = python_files(tree)
    lines = sum(path.read_bytes().count(b"\n") for path in files)
    results = {"tree": str(tree), "files": len(files), "lines": lines, "cpus": os.cpu_count()}
    print(f"{tree}: {len(files):,} files, {lines:,} lines, {os.cpu_count()} CPUs", flush=True)
    results["scan"] = scan_pass(tree, REPO / ".bench-venv" / "sweep-cache")
    for name, run in results["scan"].items():
        print(
            f"scan {name:>13}: {run['seconds']:7.1f} s, exit {run['exit']}, peak RSS {run['peak_rss_mb']} MB"
            f"{', TRACEBACK' if run['traceback'] else ''}",
            flush=True,
        )
    cold = results["scan"]["cold"]
    print(
        f"  findings {cold['findings']}, syntax errors {cold['syntax_errors']}, false syntax errors "
        f"{len(cold['false_syntax_errors'])}, workers failed {len(cold['workers_failed'])}, libcst declined "
        f"{len(cold['libcst_declined'])}",
        flush=True,
    )
    if args.every_file:
        every = results["parse"] = parse_pass(tree, files, args.jobs)
        print(
            f"every file: {every['seconds']:.1f} s, findings {every['findings']}, syntax errors {every['syntax_errors']}, "
            f"false syntax errors {len(every['false_syntax_errors'])}, workers failed {len(every['workers_failed'])}, "
            f"libcst declined {len(every['libcst_declined'])}, internal errors {len(every['internal_errors'])}",
            flush=True,
        )
        for line in (
            every["false_syntax_errors"] + every["workers_failed"] + every["libcst_declined"] + every["internal_errors"]
        ):
            print(f"  {line[:200]}")
    for line in cold["false_syntax_errors"] + cold["workers_failed"] + cold["libcst_declined"]:
        print(f"  {line[:200]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    bad = (
        cold["false_syntax_errors"]
        or cold["workers_failed"]
        or any(run["traceback"] for run in results["scan"].values())
    )
    if args.every_file:
        every = results["parse"]
        bad = bad or every["false_syntax_errors"] or every["workers_failed"] or every["internal_errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
