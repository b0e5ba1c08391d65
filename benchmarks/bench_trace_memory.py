#!/usr/bin/env python3
"""Time and peak memory of `loopaudit analyze` on traces that expand to 2 GiB.

The trace reader streams the file (auditor/profiling/in_loopaudit/trace_stream.py), so what `analyze` holds is
bounded by what it keeps, not by the size of the file; the target is under 500 MB for any input.
Each case is written as gzip to a temporary folder and analysed in a fresh process, whose peak RSS
comes from os.wait4:

    whitespace  `{"traceEvents": [` + spaces + `]}`: a gzip bomb, 2 GiB from about 2 MB
    repeated    one complete event over and over: a gzip bomb too, far more events than are kept
    steps       real-looking steps (ProfilerStep, DataLoader wait, a kernel), each carrying an arg
                the analysis does not read: a legitimate trace, analysed in full

The bombs are built from one compressed block written many times (gzip allows a file of several
members), so writing them takes seconds; the steps are compressed as they are written.

    python benchmarks/bench_trace_memory.py                       # all three, 2 GiB each
    python benchmarks/bench_trace_memory.py --size-mib 200 --case steps
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BLOCK = 16 << 20  # the repeated member of a bomb
EVENT = b'{"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm", "ts": 1, "dur": 1, "pid": 0, "tid": 7, "args": {"correlation": 1}}'
STEPS = 2000  # in the steps case, whatever the size: the padding grows instead
STEP_US = 1000  # each step: DataLoader wait 0-250 us, a kernel 300-900 us


def write_bomb(path: Path, head: bytes, filler: bytes, tail: bytes, size: int) -> None:
    """head, then `filler` repeated to `size` bytes, then tail, as a gzip file of several members."""
    block = gzip.compress(filler * (BLOCK // len(filler)), compresslevel=9)
    with open(path, "wb") as out:
        out.write(gzip.compress(head))
        for _ in range(size // BLOCK):
            out.write(block)
        out.write(gzip.compress(tail))


def write_steps(path: Path, size: int) -> None:
    padding = "x" * max(size // STEPS - 600, 0)
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write('{"traceEvents": [\n')
        for step in range(STEPS):
            start = step * STEP_US
            out.write(
                f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "ts": {start}, "dur": {STEP_US}, '
                f'"pid": 1, "tid": 1, "args": {{"padding": "{padding}"}}}},\n'
                f'{{"ph": "X", "cat": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", '
                f'"ts": {start}, "dur": 250, "pid": 1, "tid": 1}},\n'
                f'{{"ph": "X", "cat": "kernel", "name": "sm80_xmma_gemm", "ts": {start + 300}, "dur": 600, "pid": 0, "tid": 7}}'
                + (",\n" if step < STEPS - 1 else "\n")
            )
        out.write('], "deviceProperties": [{"name": "NVIDIA H100"}]}\n')


def write_case(case: str, path: Path, size: int) -> None:
    if case == "whitespace":
        write_bomb(path, b'{"traceEvents": [', b" " * 4096, b"]}", size)
    elif case == "repeated":
        write_bomb(path, b'{"traceEvents": [\n', EVENT + b",\n", EVENT + b"\n]}", size)
    else:
        write_steps(path, size)


def expanded_size(path: Path) -> int:
    total = 0
    with gzip.open(path) as unpacked:
        while chunk := unpacked.read(1 << 24):
            total += len(chunk)
    return total


def analyze(path: Path) -> tuple[int, str, float, int]:
    """Exit status, what came of it (the error, or the measures), wall seconds and peak RSS in bytes
    of one `analyze` run."""
    command = shutil.which("loopaudit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen([command, "analyze", str(path), "--output-format", "json"], stdout=out, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        if child.returncode in (0, 1):
            document = json.load(out)
            outcome = ", ".join(
                f"{key} {document[key]}" for key in ("steps_measured", "data_wait_fraction", "gpu_idle_fraction")
            )
        else:
            outcome = err.read().decode("utf-8", "replace").strip()
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS, KiB on Linux
    return child.returncode, outcome, seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=2048, help="expanded size of each trace (default 2048)")
    parser.add_argument(
        "--case", choices=("whitespace", "repeated", "steps"), action="append", help="default: all three"
    )
    options = parser.parse_args()
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'case':<11} {'gzip':>9} {'expanded':>10} {'exit':>4} {'seconds':>8} {'peak RSS':>9}")
    with tempfile.TemporaryDirectory() as folder:
        for case in options.case or ("whitespace", "repeated", "steps"):
            path = Path(folder) / f"{case}.json.gz"
            write_case(case, path, options.size_mib << 20)
            status, outcome, seconds, peak = analyze(path)
            print(
                f"{case:<11} {path.stat().st_size / 1e6:>7.1f}MB {expanded_size(path) / 2**30:>7.2f}GiB {status:>4} "
                f"{seconds:>8.1f} {peak / 2**20:>6.0f}MiB\n    {outcome}"
            )
            path.unlink()


if __name__ == "__main__":
    main()
