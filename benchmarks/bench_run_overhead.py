"""What `loopaudit run` costs the script it measures: steps per second over the measured window.

One small CPU training script (an MLP, a DataLoader over in-memory tensors, AdamW, a `loss.item()`
per step so the sync spy has work to do) runs three ways:

    plain     python train.py
    light     loopaudit run train.py --warmup W --steps N
    profile   loopaudit run train.py --warmup W --steps N --profile

The script times itself: it writes a timestamp at the top of every loop iteration, so the same
iterations (the measured window: W+1 .. W+N) are compared in all three runs, from the script's own
point of view, with the probe's and the profiler's work inside them. Each way runs REPEATS times;
the table gives the median steps/s and the overhead against plain. Target (issue 4): light within
20% of plain.

    python benchmarks/bench_run_overhead.py                    # 9 repeats, --warmup 5 --steps 20
    python benchmarks/bench_run_overhead.py --repeats 9 --hidden 1024 --json /tmp/overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""\
    import sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    hidden, batch_size = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)  # two threads on two cores swing the step time by 40% from run to run
    data = TensorDataset(torch.randn(batch_size * 1000, 64), torch.randint(0, 10, (batch_size * 1000,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with open("iterations.txt", "w") as log:
        for x, y in loader:
            log.write(f"{time.perf_counter()}\\n")
            log.flush()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running = loss.item()
""")

WAYS = {
    "plain": lambda python, loopaudit, warmup, steps: [python, "train.py"],
    "light": lambda python, loopaudit, warmup, steps: [
        loopaudit,
        "run",
        "train.py",
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--output-format",
        "json",
    ],
    "profile": lambda python, loopaudit, warmup, steps: [
        loopaudit,
        "run",
        "train.py",
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--profile",
        "--trace-out",
        "window.json",
        "--output-format",
        "json",
    ],
}


def window_steps_per_second(folder: Path, warmup: int, steps: int) -> float:
    """Iterations W+1 .. W+N-1 (their starts are all logged before the window closes)."""
    stamps = [float(line) for line in (folder / "iterations.txt").read_text().split()]
    window = stamps[warmup : warmup + steps]
    if len(window) < steps:
        raise SystemExit(f"the script logged {len(stamps)} iterations, fewer than the window needs")
    return (len(window) - 1) / (window[-1] - window[0])


def run_once(way: str, folder: Path, args) -> float:
    command = [
        *WAYS[way](sys.executable, args.loopaudit, args.warmup, args.steps),
        "--",
        str(args.hidden),
        str(args.batch_size),
    ]
    if way == "plain":
        command.remove("--")
    completed = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=600)
    if completed.returncode not in (0, 1):
        raise SystemExit(f"{way} failed ({completed.returncode}):\n{completed.stderr}")
    return window_steps_per_second(folder, args.warmup, args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256, help="MLP width (256: a step of about 1.5 ms on one thread)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    args.loopaudit = shutil.which("loopaudit") or sys.exit("the `loopaudit` command is not installed")

    import torch  # only for the version in the report

    results: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="loopaudit-bench-") as work:
        folder = Path(work)
        (folder / "train.py").write_text(SCRIPT)
        for _ in range(args.repeats):  # interleaved, so that drift in the machine hits every way alike
            for way in WAYS:
                results[way].append(run_once(way, folder, args))

    plain = statistics.median(results["plain"])
    print(f"{platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}")
    print(
        f"MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch_size}; window: steps {args.warmup + 1}-{args.warmup + args.steps}; {args.repeats} runs each\n"
    )
    print(f"{'way':<8} {'steps/s (median)':>17} {'ms/step':>8} {'overhead':>9}   all runs (steps/s)")
    for way, values in results.items():
        median = statistics.median(values)
        overhead = plain / median - 1
        runs = ", ".join(f"{value:.0f}" for value in values)
        print(f"{way:<8} {median:>17.1f} {1000 / median:>8.3f} {overhead:>+9.1%}   {runs}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(args).items() if k != "loopaudit"},
                    "torch": torch.__version__,
                    "steps_per_second": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
