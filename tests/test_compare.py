"""`loopaudit compare`: two runs' JSON set side by side, a change counted only beyond the noise.

The statistics are checked on documents built here (known step times), the command on real runs: a
step twice as slow fails the gate, the same script run twice passes it."""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from loopaudit.profiling.in_loopaudit.compare import CompareError, compare, log_shift, parse_limit

from .conftest import run_cli


def document(times_ms, not_ready_ms=None, sites=(), transient=()):
    """A run document as `loopaudit run --output-format json` writes it, with what compare reads."""
    not_ready_ms = not_ready_ms or [0.0] * len(times_ms)
    return {
        "script": "train.py",
        "device": "cpu",
        "torch": "2.13.0",
        "steps": [
            {"step": str(i + 6), "time_ms": t, "data_not_ready_ms": w, "transient": i in transient}
            for i, (t, w) in enumerate(zip(times_ms, not_ready_ms))
        ],
        "sync_sites": [
            {"filename": "train.py", "line": line, "kind": kind, "per_step": per_step, "on_step_path": per_step > 0.5}
            for line, kind, per_step in sites
        ],
    }


def noisy(level, count=20, seed=1):
    generator = random.Random(seed)
    return [level * generator.uniform(0.9, 1.15) for _ in range(count)]


def by_metric(comparison, metric):
    return [change for change in comparison.changes if change.metric == metric]


def test_limits_are_read_as_documented():
    assert parse_limit("step-time:+5%") == ("step-time", 0.05)
    assert parse_limit("data-wait:+2%") == ("data-wait", 0.02)
    assert parse_limit("syncs:+0") == ("syncs", 0.0)
    for wrong in ("step-time:5%", "step-time:+5", "syncs:+1%", "latency:+5%", ""):
        with pytest.raises(CompareError):
            parse_limit(wrong)


def test_the_shift_interval_covers_no_change_and_finds_a_real_one():
    same = log_shift(noisy(10, seed=1), noisy(10, seed=2))
    assert same[1] < 0 < same[2]
    slower = log_shift(noisy(10, seed=1), noisy(20, seed=2))
    assert slower[1] > 0.5  # log 2 = 0.69: twice as slow, beyond the noise
    assert log_shift([10.0] * 3, [20.0] * 3)[1] is None  # too few steps for an interval


def test_a_step_twice_as_slow_fails_and_the_same_run_again_passes():
    slower = compare(document(noisy(10, seed=1)), document(noisy(20, seed=2)), [], ("a", "b"))
    (step,) = by_metric(slower, "step-time")
    assert step.verdict == "worse" and step.failed and 0.8 < step.change < 1.2
    again = compare(document(noisy(10, seed=1)), document(noisy(10, seed=3)), [], ("a", "b"))
    assert again.failed == [] and by_metric(again, "step-time")[0].verdict == "unchanged"


def test_a_change_within_the_noise_does_not_cross_a_limit_it_might_reach():
    # 4 % slower on average, with noise of +-12 %: the limit of 3 % is not crossed beyond the noise.
    generator = random.Random(9)
    before = [10 * generator.uniform(0.88, 1.12) for _ in range(20)]
    after = [10.4 * generator.uniform(0.88, 1.12) for _ in range(20)]
    (step,) = by_metric(compare(document(before), document(after), ["step-time:+3%"], ("a", "b")), "step-time")
    assert not step.failed and step.low < 0.03


def test_transient_steps_stay_out():
    before = document([10.0] * 20)
    after = document([200.0] * 6 + [10.0] * 20, transient=range(6))
    (step,) = by_metric(compare(before, after, [], ("a", "b")), "step-time")
    assert step.change == pytest.approx(0.0) and not step.failed


def test_a_new_per_step_sync_fails_the_default_gate_and_periodic_ones_do_not_count():
    before = document(noisy(10), sites=[(30, "item", 0.1)])  # every tenth step: periodic
    after = document(noisy(10, seed=4), sites=[(30, "item", 0.15), (27, "item", 1.0)])
    comparison = compare(before, after, [], ("a", "b"))
    (syncs,) = by_metric(comparison, "syncs")
    assert (syncs.before, syncs.after, syncs.failed) == (0, 1.0, True)
    (site,) = by_metric(comparison, "site")
    assert site.label == "train.py:27 item" and site.verdict == "new"


def test_data_wait_changes_in_points_with_an_interval():
    before = document([10.0] * 20, [0.0] * 20)
    after = document([10.0] * 20, [3.0, 4.0] * 10)
    (wait,) = by_metric(compare(before, after, ["data-wait:+20%"], ("a", "b")), "data-wait")
    assert wait.change == pytest.approx(0.35) and wait.low > 0.2 and wait.failed


def test_the_command_reads_files_and_says_what_is_wrong(tmp_path):
    (tmp_path / "before.json").write_text(json.dumps(document(noisy(10, seed=1))))
    (tmp_path / "after.json").write_text(json.dumps(document(noisy(20, seed=2))))
    result = run_cli("compare", "before.json", "after.json", "--no-color", cwd=tmp_path)
    assert result.returncode == 1, result.err
    assert "step time" in result.out and "worse (past the limit)" in result.out
    result = run_cli("compare", "before.json", "before.json", "--output-format", "json", cwd=tmp_path)
    assert result.returncode == 0 and json.loads(result.out)["failed"] == []
    (tmp_path / "trace.json").write_text('{"traceEvents": []}')
    for args, message in (
        (("missing.json", "after.json"), "cannot read missing.json"),
        (("trace.json", "after.json"), "is not a `loopaudit run --output-format json` document"),
        (("before.json", "after.json", "--fail-on", "steps:+5%"), "write METRIC:+AMOUNT"),
    ):
        result = run_cli("compare", *args, cwd=tmp_path)
        assert result.returncode == 2 and message in result.err, result.err


SLEEPY_STEPS = textwrap.dedent("""\
    import os, time
    import torch
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1000):
        time.sleep(float(os.environ["STEP_SECONDS"]))  # the step's work: as long on a busy machine
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
""")


@pytest.mark.slow
def test_real_runs_a_slower_step_fails_and_the_same_script_twice_passes(tmp_path):
    pytest.importorskip("torch", reason="`loopaudit run` needs torch")
    (tmp_path / "train.py").write_text(SLEEPY_STEPS)

    def measure(name, seconds):
        result = run_cli(
            "run",
            "train.py",
            "--output-format",
            "json",
            cwd=tmp_path,
            env={"STEP_SECONDS": seconds, "CUDA_VISIBLE_DEVICES": ""},
        )
        assert result.returncode == 0, result.err
        (tmp_path / name).write_text(result.out)

    measure("before.json", "0.02")
    measure("again.json", "0.02")
    measure("slower.json", "0.04")
    assert run_cli("compare", "before.json", "again.json", cwd=tmp_path).returncode == 0
    slower = run_cli("compare", "before.json", "slower.json", "--output-format", "json", cwd=tmp_path)
    assert slower.returncode == 1
    (step,) = [change for change in json.loads(slower.out)["changes"] if change["metric"] == "step-time"]
    assert step["verdict"] == "worse" and step["interval"][0] > 0.5
