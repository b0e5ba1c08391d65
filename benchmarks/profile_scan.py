#!/usr/bin/env python3
"""Where a cold scan's time goes: parse, analysis, prefilter, project facts, line numbers.

Runs `loopaudit scan PATH --jobs 1 --no-cache` in this process with the engine's steps wrapped in CPU
timers, and prints each step's CPU seconds, share and number of calls (to stderr, after the scan).

    python benchmarks/profile_scan.py .bench-venv/corpus/tree   # the corpus of bench_scan_speed.py
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time

import libcst as cst

import loopaudit.scan.engine as engine
import loopaudit.scan.project_scan as project_scan
from loopaudit.commands.cli import app
from loopaudit.scan.collector import own_collector

seconds: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()


def timed(step: str, function):
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[step] += time.process_time() - start
            calls[step] += 1

    return wrapper


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    engine.cst.parse_module = timed("parse (libcst)", cst.parse_module)
    engine._apply_rules = timed("analysis (index, step model, tensors, rules, summary)", engine._apply_rules)
    engine.to_findings = timed("  of which findings (positions, fixes)", engine.to_findings)
    engine.passes_prefilter = timed("prefilter", engine.passes_prefilter)
    project_scan.derive_facts = timed("project facts (derive_facts, all rounds)", project_scan.derive_facts)
    project_scan._with_lines = timed("line numbers of contexts", project_scan._with_lines)
    sys.argv = [
        "loopaudit",
        "scan",
        sys.argv[1],
        "--isolated",
        "--output-format",
        "json",
        "--exit-zero",
        "--no-cache",
        "--jobs",
        "1",
    ]
    own_collector()  # as the command's own process does (cli.main)
    start = time.process_time()
    with contextlib.suppress(SystemExit):
        app()
    total = time.process_time() - start
    for step, spent in seconds.most_common():
        print(f"{step:55} {spent:7.1f} s {100 * spent / total:5.1f} %  ({calls[step]} calls)", file=sys.stderr)
    print(f"{'total CPU':55} {total:7.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
