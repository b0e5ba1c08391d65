"""When a measurement of a few dozen steps can be trusted, and how far: intervals, transients, and
whether the window has seen enough to decide.

Both sides of a run use it. The probe asks `settled` after every step past the requested window, and
measures on (up to the cap the user set) until the verdicts it feeds are decided; loopaudit then
computes the same estimates from the report, so what it prints is what the probe decided on. Pure
Python and no torch: the probe's process must not pay for it, and the host never imports torch.

Two choices, and why:

- **Batch means for a share.** Consecutive steps are not independent (a worker falls behind for a few
  steps, the machine is busy for a second), so the steps are grouped into consecutive batches and the
  interval comes from the spread between batches: the standard remedy for autocorrelated series in
  simulation output analysis. The share is a ratio of sums (data wait over step time), so its spread is
  the delta method's, with Student's t for the few batches there are.
- **A transient is a change of level, not an outlier.** One slow step moves a median little; a run of
  them (a warm-up that had not ended, another job taking the CPUs for a second) moves everything. The
  window is split where the step time's level changes most; when one side runs at least twice as slow
  as the other (by their medians) and their middle halves do not overlap, that side is a transient: left out of the estimates and said so, and the window goes on
  until the steady side has as many steps as were asked for. Slow steps at the start are a warm-up that
  had not ended, however many; slow steps later are a passing episode when they are the fewer, and the
  way the script now runs when they are the most (then nothing is left out).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, 97.5th percentile, by degrees of freedom: two-sided 95 % intervals.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
Z975 = 1.959964  # the normal's 97.5th percentile: two-sided 95 % intervals
_MOST_BATCHES = 20  # more batches than this makes each too short to absorb the steps' correlation
_FEWEST_BATCHES = 5
# A side of the window that runs this many times slower than the other is a transient.
TRANSIENT_RATIO = 2.0
# Steps: a shorter run of slow steps is noise the interval absorbs, and the steady side always has
# enough steps for the median's interval (6).
_SHORTEST_SIDE = 6


def t_quantile(degrees: int) -> float:
    if degrees < 1:
        return math.inf
    if degrees <= len(_T975):
        return _T975[degrees - 1]
    return 1.96 + 2.4 / degrees  # within 0.003 of the true value from 30 degrees on


@dataclass(frozen=True)
class Estimate:
    """A value with its 95 % interval, over `steps` steps; the interval is None when too few steps
    were measured to give one."""

    value: float
    low: float | None
    high: float | None
    steps: int

    def as_share(self) -> str:
        """A share as reports print it: "4.4% [2.1%, 6.9%]" (the value alone without an interval)."""
        if self.low is None or self.high is None:
            return f"{self.value:.1%}"
        return f"{self.value:.1%} [{self.low:.1%}, {self.high:.1%}]"

    def against(self, threshold: float) -> str:
        """ "above", "below" or "inconclusive": where the interval lies against a threshold."""
        if self.low is None or self.high is None:
            return "inconclusive"
        if self.low > threshold:
            return "above"
        if self.high <= threshold:
            return "below"
        return "inconclusive"


def share_interval(parts: Sequence[float], totals: Sequence[float]) -> Estimate:
    """sum(parts) / sum(totals), per step, with its interval by batch means."""
    steps = len(totals)
    whole = sum(totals)
    if not steps or whole <= 0:
        return Estimate(0.0, None, None, steps)
    value = sum(parts) / whole
    if value == 0:
        return Estimate(0.0, 0.0, 0.0, steps)  # not one wait in the window: nothing to spread
    # Two steps or more a batch where there are enough steps; down to one a batch for a short window.
    count = min(_MOST_BATCHES, max(steps // 2, min(steps, _FEWEST_BATCHES)))
    if count < _FEWEST_BATCHES:
        return Estimate(value, None, None, steps)
    size = steps // count
    # The first steps that do not fill a batch are left to the point estimate: the batches are the
    # latest steps, and each is the same length.
    start = steps - count * size
    batch_parts = [sum(parts[start + i * size : start + (i + 1) * size]) for i in range(count)]
    batch_totals = [sum(totals[start + i * size : start + (i + 1) * size]) for i in range(count)]
    mean_total = sum(batch_totals) / count
    ratio = sum(batch_parts) / sum(batch_totals)
    residuals = [p - ratio * t for p, t in zip(batch_parts, batch_totals, strict=True)]
    error = math.sqrt(sum(r * r for r in residuals) / (count * (count - 1))) / mean_total
    margin = t_quantile(count - 1) * error
    return Estimate(value, max(0.0, value - margin), min(1.0, value + margin), steps)


def median_interval(values: Sequence[float]) -> Estimate:
    """The median with its distribution-free 95 % interval: the order statistics between which the
    median lies with at least 95 % probability (binomial, p = 1/2)."""
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return Estimate(0.0, None, None, 0)
    median = statistics.median(ordered)
    # The largest k with P(Binomial(n, 1/2) < k) <= 2.5 %: the interval is the k-th smallest to the
    # k-th largest value.
    cumulative, k = 0.0, 0
    while True:
        cumulative += math.comb(n, k) / 2**n
        if cumulative > 0.025:
            break
        k += 1
    if k == 0:
        return Estimate(median, None, None, n)  # under 6 values: no interval at 95 %
    return Estimate(median, ordered[k - 1], ordered[n - k], n)


def proportion_interval(successes: int, trials: int) -> Estimate:
    """The share of `trials` steps in which something happened, with its Wilson 95 % interval (which
    stays inside [0, 1] and behaves at 0 of n and n of n, where the textbook one does not)."""
    if trials <= 0:
        return Estimate(0.0, None, None, 0)
    z = Z975
    share = successes / trials
    scale = 1 + z * z / trials
    center = (share + z * z / (2 * trials)) / scale
    half = z / scale * math.sqrt(share * (1 - share) / trials + z * z / (4 * trials * trials))
    return Estimate(share, max(0.0, center - half), min(1.0, center + half), trials)


@dataclass(frozen=True)
class Transient:
    """Steps `first` to `last` (indices into the measured steps, inclusive) ran `ratio` times slower
    than the rest."""

    first: int
    last: int
    slow_ms: float  # their median step time
    steady_ms: float  # the others'
    ratio: float


def find_transient(step_seconds: Sequence[float]) -> Transient | None:
    """The split of the window that best separates two levels of step time (least absolute deviation
    of the log times from each side's median, the usual cost for one change point); a transient when
    the slower side runs TRANSIENT_RATIO times slower than the other."""
    n = len(step_seconds)
    if n < 2 * _SHORTEST_SIDE or min(step_seconds) <= 0:
        return None
    logs = [math.log(value) for value in step_seconds]

    def spread(part: Sequence[float]) -> float:
        middle = statistics.median(part)
        return sum(abs(value - middle) for value in part)

    best: tuple[float, int] | None = None
    for split in range(_SHORTEST_SIDE, n - _SHORTEST_SIDE + 1):
        cost = spread(logs[:split]) + spread(logs[split:])
        if best is None or cost < best[0]:
            best = (cost, split)
    assert best is not None  # n >= 2 * _SHORTEST_SIDE: there is a split
    split = best[1]
    before = statistics.median(step_seconds[:split])
    after = statistics.median(step_seconds[split:])
    if max(before, after) < TRANSIENT_RATIO * min(before, after):
        return None
    slow_side, fast_side = (step_seconds[:split], step_seconds[split:])
    if after > before:
        slow_side, fast_side = fast_side, slow_side
    if _quartile(slow_side, 1) <= _quartile(fast_side, 3):
        return None  # two levels that overlap: noise with a few slow steps, not a change of level
    if after > before and n - split > split:
        # The steps slowed down and stayed slow for most of the window: that is how the script runs
        # now (memory filling up, the machine taken by another job), not a passing episode.
        return None
    first, last = (0, split - 1) if before > after else (split, n - 1)
    slow, steady = max(before, after), min(before, after)
    return Transient(first, last, slow * 1000, steady * 1000, slow / steady)


def _quartile(values: Sequence[float], which: int) -> float:
    """The lower (1) or upper (3) quartile, as the nearest-rank value."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(which / 4 * (len(ordered) - 1)))]


def steady_indices(step_seconds: Sequence[float]) -> tuple[list[int], Transient | None]:
    """The steps the estimates use (all but a transient's), and the transient."""
    transient = find_transient(step_seconds)
    if transient is None:
        return list(range(len(step_seconds))), None
    return [i for i in range(len(step_seconds)) if not transient.first <= i <= transient.last], transient


def settled(step_seconds: Sequence[float], waits: Sequence[float], wanted: int, thresholds: Sequence[float]) -> bool:
    """Has the window seen enough: `wanted` steady steps, and the data-wait share decided against
    every threshold? Asked by the probe after each step past the window the user asked for."""
    kept, _ = steady_indices(step_seconds)
    if len(kept) < wanted:
        return False
    share = share_interval([waits[i] for i in kept], [step_seconds[i] for i in kept])
    return all(share.against(threshold) != "inconclusive" for threshold in thresholds)
