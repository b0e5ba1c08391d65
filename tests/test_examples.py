"""The runnable examples the README's `run` section uses: examples/slow_loop.py and its fixed twin,
torch only, synthetic data. The scan and the run must tell them apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import run_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def codes(result) -> list[str]:
    return sorted(finding["code"] for finding in json.loads(result.out))


def test_the_scan_finds_the_slow_loop_s_habits_and_nothing_in_its_fixed_twin():
    slow = run_cli("scan", str(EXAMPLES / "slow_loop.py"), "--output-format", "json")
    assert slow.returncode == 1, slow.err
    assert codes(slow) == ["LA101", "LA201", "LA202", "LA203", "LA301"]
    fast = run_cli("scan", str(EXAMPLES / "fast_loop.py"), "--output-format", "json")
    assert fast.returncode == 0, fast.out + fast.err
    assert codes(fast) == []


@pytest.mark.slow
def test_the_run_measures_the_slow_loop_s_costs_and_passes_the_fixed_twin(tmp_path):
    pytest.importorskip("torch", reason="the dynamic mode needs torch (pip install 'loopaudit[profile]')")
    # The CPU path, as the README shows it: on an H100 the fixed twin's two workers cannot keep up
    # with a 2 ms step, and LA602 rightly says so (docs/gpu-validation.md). One intra-op thread: on a
    # busy 2-CPU machine torch's two wait for each other, and the slow loop's step grew from 180 to
    # 505 ms, its data waits (the sleeps of its dataset) under LA602's 5%.
    one_thread = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    slow = run_cli(
        "run",
        str(EXAMPLES / "slow_loop.py"),
        "--warmup",
        "2",
        "--steps",
        "6",
        "--output-format",
        "json",
        cwd=tmp_path,
        env=one_thread,
    )
    assert slow.returncode == 1, slow.err
    document = json.loads(slow.out)
    measured = {finding["code"] for finding in document["findings"]}
    assert {"LA601", "LA602", "LA603"} <= measured
    fast = run_cli(
        "run",
        str(EXAMPLES / "fast_loop.py"),
        "--warmup",
        "2",
        "--steps",
        "6",
        "--output-format",
        "json",
        cwd=tmp_path,
        env=one_thread,
    )
    assert fast.returncode == 0, fast.out + fast.err
    fixed = json.loads(fast.out)
    assert fixed["findings"] == []
    # What fixing buys: the fixed twin's loading runs in its workers, beside the training, and its
    # whole step-time interval lies below the slow loop's (about 60 ms against 130 on 2 CPUs).
    slow_time, fast_time = document["estimates"]["step_time_ms"], fixed["estimates"]["step_time_ms"]
    assert fast_time["high"] < slow_time["low"], (fast_time, slow_time)
