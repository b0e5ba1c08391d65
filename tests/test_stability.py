"""The statistics behind `loopaudit run`'s verdicts (profiling/in_script/stability.py): intervals
that hold what they claim, transients told from noise, and a window that knows when it has seen enough.

The coverage checks draw many series from a known distribution with a seeded generator and count how
often the interval holds the true value: a property of the method, not of one draw."""

from __future__ import annotations

import random

import pytest

from loopaudit.profiling.in_script.stability import (
    Estimate,
    find_transient,
    median_interval,
    settled,
    share_interval,
    steady_indices,
    t_quantile,
)


def test_t_quantiles_meet_the_normal_from_below():
    assert t_quantile(1) == pytest.approx(12.706)
    assert t_quantile(9) == pytest.approx(2.262)
    assert t_quantile(30) == pytest.approx(2.042)
    assert 1.96 < t_quantile(200) < t_quantile(40) < t_quantile(30)


def test_a_share_interval_holds_the_true_share_about_95_times_in_100():
    generator = random.Random(7)
    true_share, held, draws = 0.2, 0, 400
    for _ in range(draws):
        steps = [generator.uniform(8, 12) for _ in range(40)]
        waits = [step * min(1.0, max(0.0, generator.gauss(true_share, 0.08))) for step in steps]
        estimate = share_interval(waits, steps)
        held += estimate.low <= true_share <= estimate.high
    assert 0.88 * draws <= held <= draws  # nominal 95 %; t with few batches is a little wide, not narrow


def test_correlated_steps_widen_the_interval():
    # Waits that come in runs of ten (a worker falling behind for a while) against the same waits
    # shuffled: batch means must see the runs.
    runs = ([0.0] * 10 + [4.0] * 10) * 3
    shuffled = runs[:]
    random.Random(3).shuffle(shuffled)
    steps = [10.0] * len(runs)
    in_runs, mixed = share_interval(runs, steps), share_interval(shuffled, steps)
    assert in_runs.value == mixed.value == pytest.approx(0.2)
    assert (in_runs.high - in_runs.low) > (mixed.high - mixed.low)


def test_verdicts_against_a_threshold():
    assert Estimate(0.9, 0.85, 0.95, 20).against(0.05) == "above"
    assert Estimate(0.01, 0.0, 0.03, 20).against(0.05) == "below"
    assert Estimate(0.05, 0.03, 0.07, 20).against(0.05) == "inconclusive"
    assert Estimate(0.5, None, None, 4).against(0.05) == "inconclusive"  # too few steps for an interval


def test_too_few_steps_give_a_value_without_an_interval():
    estimate = share_interval([1.0] * 4, [10.0] * 4)
    assert estimate.value == pytest.approx(0.1) and estimate.low is None
    assert share_interval([], []).low is None


def test_the_median_interval_is_two_order_statistics_and_covers():
    values = list(range(1, 21))  # 20 values: the 95 % interval is the 6th to the 15th
    estimate = median_interval(values)
    assert (estimate.value, estimate.low, estimate.high) == (10.5, 6, 15)
    assert median_interval([1, 2, 3, 4, 5]).low is None  # under 6 values no pair reaches 95 %
    generator = random.Random(11)
    held = sum(
        (e := median_interval([generator.expovariate(1.0) for _ in range(30)])).low <= 0.6931 <= e.high
        for _ in range(400)
    )
    assert held >= 0.93 * 400


def test_a_warm_up_that_had_not_ended_is_a_transient_however_long():
    times = [0.096] * 13 + [0.004] * 7
    transient = find_transient(times)
    assert (transient.first, transient.last) == (0, 12)
    assert transient.ratio == pytest.approx(24)
    kept, _ = steady_indices(times)
    assert kept == list(range(13, 20))


def test_a_short_slow_episode_later_is_a_transient_and_a_lasting_slowdown_is_not():
    burst = [0.010] * 14 + [0.050] * 6
    transient = find_transient(burst)
    assert (transient.first, transient.last) == (14, 19)
    slowed = [0.010] * 6 + [0.050] * 14  # it runs at 50 ms now: that is the script's speed
    assert find_transient(slowed) is None


def test_noise_and_single_outliers_are_not_transients():
    generator = random.Random(5)
    noisy = [generator.uniform(0.008, 0.014) for _ in range(40)]
    noisy[17] = 0.300  # one step waits for a lazy initialisation
    assert find_transient(noisy) is None


def test_settled_needs_the_wanted_steady_steps_and_a_decided_share():
    steps = [0.010] * 20
    assert settled(steps, [0.0] * 20, wanted=20, thresholds=(0.05,))
    assert settled(steps, [0.009] * 20, wanted=20, thresholds=(0.05,))
    assert not settled(steps[:10], [0.0] * 10, wanted=20, thresholds=(0.05,))
    # Half the steps wait 1 ms, half none: 5 % exactly, the interval straddles it.
    assert not settled(steps, [0.001, 0.0] * 10, wanted=20, thresholds=(0.05,))
    # A slow start leaves too few steady steps.
    assert not settled([0.1] * 8 + [0.01] * 16, [0.0] * 24, wanted=20, thresholds=(0.05,))
    assert settled([0.1] * 8 + [0.01] * 20, [0.0] * 28, wanted=20, thresholds=(0.05,))


# --- the verdicts as LA602 gives them, from a run's measurements --------------------------------------


def _evidence(starved_ms: list[float], step_ms: float = 10.0):
    from loopaudit.profiling.in_loopaudit.evidence import RunEvidence
    from loopaudit.profiling.in_script.report import LoaderRecord, ProbeReport, StepRecord

    steps = [StepRecord(step_ms / 1000, (wait + 1.5) / 1000, 0.0, wait / 1000) for wait in starved_ms]
    loader = LoaderRecord("/work/train.py", 12, "Images", 64, 2, False, True, 2, batches=len(steps))
    loader.wait_seconds = sum(step.data_wait_seconds for step in steps)
    loader.starved_seconds = sum(step.data_starved_seconds for step in steps)
    report = ProbeReport("cpu", False, "2.13.0", 2, 5, 20, steps=steps, loaders=[loader], longest=100)
    return RunEvidence(report, "/work/train.py")


def _audit(evidence):
    from loopaudit.profiling.in_loopaudit.audit import audit_run
    from loopaudit.rules.runtime.data_loader_stall import DataLoaderStall

    return audit_run(evidence, [DataLoaderStall], [])


def test_a_share_that_straddles_the_threshold_is_undecided_not_a_finding():
    # Waits in runs: five steps of 1 ms, five of none, so the share is 5 % with a wide interval.
    audit = _audit(_evidence(([1.0] * 5 + [0.0] * 5) * 4))
    assert audit.findings == []
    ((code, message),) = audit.undecided
    assert code == "LA602" and "straddles the 5% threshold" in message and "--max-steps" in message


def test_a_share_past_the_threshold_is_reported_with_its_interval():
    audit = _audit(_evidence([8.0, 9.0] * 10))
    (finding,) = audit.findings
    low, high = finding.observed["interval"]
    assert low > 0.05 and low <= finding.observed["share"] <= high
    assert f"[{low:.1%}, {high:.1%}]" in finding.message and audit.undecided == []


def test_handing_over_ready_batches_is_not_a_stall():
    # Every step spends 1.5 ms receiving a delivered batch (15 % of it) and never waits for one.
    audit = _audit(_evidence([0.0] * 20))
    assert audit.findings == [] and audit.undecided == []
    assert audit.evidence.data_wait_fraction == pytest.approx(0.15)


def test_the_wilson_interval_tells_per_step_from_periodic_and_owns_up_to_half():
    from loopaudit.profiling.in_script.stability import proportion_interval

    assert proportion_interval(20, 20).against(0.5) == "above"
    assert proportion_interval(6, 6).against(0.5) == "above"  # the tests' short windows
    assert proportion_interval(2, 20).against(0.5) == "below"  # every tenth step
    assert proportion_interval(11, 20).against(0.5) == "inconclusive"
    every = proportion_interval(20, 20)
    assert every.high == 1.0 and 0.8 < every.low < 0.85
    assert proportion_interval(0, 0).low is None


def test_a_sync_in_about_half_of_the_steps_is_undecided():
    from loopaudit.profiling.in_loopaudit.audit import audit_run
    from loopaudit.profiling.in_script.report import SiteRecord
    from loopaudit.rules.runtime.sync_observed_in_step import SyncObservedInStep

    evidence = _evidence([0.0] * 20)
    evidence.report.syncs = [
        SiteRecord("item", "Tensor.item", "/work/train.py", 30, count=11, steps=11),
        SiteRecord("item", "Tensor.item", "/work/train.py", 31, count=20, steps=20),
        SiteRecord("item", "Tensor.item", "/work/train.py", 32, count=2, steps=2),
    ]
    audit = audit_run(evidence, [SyncObservedInStep], [])
    assert [finding.location.row for finding in audit.findings] == [31]
    ((code, message),) = audit.undecided
    assert code == "LA601" and "train.py:30 happened in 11 of 20 measured steps" in message


def test_the_report_says_what_is_undecided_and_the_intervals():
    import io

    from loopaudit.profiling.in_loopaudit.breakdown import from_run
    from loopaudit.reporting import measured

    evidence = _evidence(([1.0] * 5 + [0.0] * 5) * 4)
    out = io.StringIO()
    measured.render_run(_audit(evidence), from_run(evidence), "loopaudit run: train.py", [], out, color=False)
    text = out.getvalue()
    assert "Undecided (not reported: the measurement cannot tell)" in text
    assert "LA602 undecided: the steps waited for batches not yet loaded 5.0% [" in text
    assert "Step time  median 10.0 ms [10.0 ms, 10.0 ms] over 40 steady steps" in text
    assert "Waiting for batches not yet loaded  5.0% [" in text
