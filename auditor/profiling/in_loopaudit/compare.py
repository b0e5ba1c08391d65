"""Two runs of a script set side by side: what changed between `before.json` and `after.json`
(`loopaudit run --output-format json`), by how much, whether it is more than the noise, and whether
it crosses a limit the user set (`--fail-on step-time:+5%`).

Each metric's change comes with a 95 % interval, and only a change whose whole interval lies past a
limit fails the gate:

- **step time**: the ratio of the steady steps' typical times, as the Hodges-Lehmann estimate of the
  shift between the two runs' log step times, with its distribution-free interval (the order
  statistics of the pairwise differences that the Mann-Whitney test's critical value picks). No
  assumption of normal step times, and one slow step moves nothing.
- **data wait**: the difference of the shares of the steps spent waiting for batches not yet loaded,
  each with its batch-means interval (stability.py), combined as independent errors.
- **syncs per step**: the calls that synchronized in most steps (LA601's sites), per step. Counts do
  not vary with the machine's load: their change is exact.
- each such **sync site**, matched by file, line and kind: new, gone, or more or fewer per step.

Steps a run left out as a transient stay out here too.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from loopaudit.profiling.in_script.stability import Z975, share_interval

# How each limit is written and read: step-time in percent of the step time, data-wait in
# percentage points of the step, syncs in calls per step.
METRICS = {"step-time": "%", "data-wait": "points", "syncs": "per step"}
DEFAULT_LIMITS = ("step-time:+10%", "data-wait:+5%", "syncs:+0")
_LIMIT = re.compile(r"^(?P<metric>[a-z-]+):\+(?P<amount>\d+(\.\d+)?)(?P<percent>%?)$")


class CompareError(ValueError):
    """A document or a limit that cannot be compared; the message says which and why."""


def parse_limit(text: str) -> tuple[str, float]:
    """ "step-time:+5%" -> ("step-time", 0.05); "data-wait:+2%" -> ("data-wait", 0.02);
    "syncs:+0" -> ("syncs", 0.0)."""
    match = _LIMIT.match(text.strip())
    if match is None or match["metric"] not in METRICS:
        names = ", ".join(METRICS)
        raise CompareError(f"--fail-on {text!r}: write METRIC:+AMOUNT, as step-time:+5%, with METRIC one of {names}")
    amount = float(match["amount"])
    metric = match["metric"]
    if metric in ("step-time", "data-wait"):
        if not match["percent"]:
            raise CompareError(f"--fail-on {text!r}: {metric} takes a percentage, as {metric}:+5%")
        amount /= 100
    elif match["percent"]:
        raise CompareError(f"--fail-on {text!r}: syncs takes calls per step, as syncs:+0")
    return metric, amount


@dataclass
class Change:
    metric: str  # "step-time", "data-wait", "syncs" or "site"
    label: str  # what the row is called: "step time", "train.py:27 `.item()`"
    before: float | None
    after: float | None
    change: float | None  # step-time: relative (0.05 is 5 % slower); the others: after - before
    low: float | None  # the change's 95 % interval; equal to it for counts; None when not known
    high: float | None
    verdict: str = "unchanged"  # "worse", "better", "unchanged", "undecided", "new", "gone"
    limit: float | None = None  # the --fail-on limit for this metric
    failed: bool = False  # the whole interval lies past the limit

    def judge(self, limit: float | None) -> None:
        self.limit = limit
        if self.change is None:
            self.verdict = "undecided"
            return
        if self.low is None or self.high is None:
            self.verdict = "undecided" if self.change else "unchanged"
        elif self.low > 0:
            self.verdict = "worse"
        elif self.high < 0:
            self.verdict = "better"
        else:
            self.verdict = "unchanged"
        self.failed = limit is not None and self.low is not None and self.low > limit


@dataclass
class Comparison:
    before: str
    after: str
    changes: list[Change]
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Change]:
        return [change for change in self.changes if change.failed]


def _steady_rows(document: dict, name: str) -> list[dict]:
    if not isinstance(document, dict) or "steps" not in document or "sync_sites" not in document:
        raise CompareError(f"{name} is not a `loopaudit run --output-format json` document")
    rows = [row for row in document["steps"] if not row.get("transient")]
    if not rows:
        raise CompareError(f"{name} has no measured steps")
    return rows


def log_shift(before: Sequence[float], after: Sequence[float]) -> tuple[float, float | None, float | None]:
    """The Hodges-Lehmann shift from `before` to `after` in log values, with its 95 % interval: the
    median of the pairwise differences, and the order statistics at the Mann-Whitney critical value
    (normal approximation). The interval is None when there are too few values for one."""
    differences = sorted(math.log(a) - math.log(b) for a in after for b in before)
    n, m = len(before), len(after)
    shift = statistics.median(differences)
    spread = math.sqrt(n * m * (n + m + 1) / 12)
    k = math.floor(n * m / 2 - Z975 * spread)
    if k < 1:
        return shift, None, None
    return shift, differences[k - 1], differences[n * m - k]


def _step_time(before: list[dict], after: list[dict]) -> Change:
    times_before = [row["time_ms"] for row in before if row["time_ms"] > 0]
    times_after = [row["time_ms"] for row in after if row["time_ms"] > 0]
    shift, low, high = log_shift(times_before, times_after)
    return Change(
        "step-time",
        "step time (median, ms)",
        statistics.median(times_before),
        statistics.median(times_after),
        math.expm1(shift),
        None if low is None else math.expm1(low),
        None if high is None else math.expm1(high),
    )


def _data_wait(before: list[dict], after: list[dict]) -> Change | None:
    def estimate(rows: list[dict]):
        if any(row.get("data_not_ready_ms") is None for row in rows):
            return None
        return share_interval([row["data_not_ready_ms"] for row in rows], [row["time_ms"] for row in rows])

    first, second = estimate(before), estimate(after)
    if first is None or second is None:
        return None  # no DataLoader seen in one of the runs
    difference = second.value - first.value
    low: float | None = None
    high: float | None = None
    if first.low is not None and first.high is not None and second.low is not None and second.high is not None:
        margin = math.hypot((first.high - first.low) / 2, (second.high - second.low) / 2)
        low, high = difference - margin, difference + margin
    if first.value == second.value == 0:
        low = high = 0.0
    return Change(
        "data-wait",
        "waiting for batches not yet loaded (share)",
        first.value,
        second.value,
        difference,
        low,
        high,
    )


def _per_step_sites(document: dict) -> dict[tuple[str, int, str], float]:
    return {
        (site["filename"], site["line"], site["kind"]): site["per_step"]
        for site in document["sync_sites"]
        if site["on_step_path"]
    }


def _syncs(before: dict, after: dict) -> list[Change]:
    first, second = _per_step_sites(before), _per_step_sites(after)
    total_before, total_after = round(sum(first.values()), 3), round(sum(second.values()), 3)
    difference = round(total_after - total_before, 3)
    changes = [Change("syncs", "syncs per step", total_before, total_after, difference, difference, difference)]
    for key in sorted(first.keys() | second.keys()):
        filename, line, kind = key
        was, now = first.get(key), second.get(key)
        if was == now:
            continue
        difference = round((now or 0.0) - (was or 0.0), 3)
        change = Change("site", f"{filename}:{line} {kind}", was, now, difference, difference, difference)
        changes.append(change)
    return changes


def compare(before: dict, after: dict, limits: Sequence[str], names: tuple[str, str]) -> Comparison:
    """`before` and `after` are run documents; `limits` as --fail-on writes them (an empty sequence:
    DEFAULT_LIMITS)."""
    parsed = dict(parse_limit(limit) for limit in (limits or DEFAULT_LIMITS))
    rows_before, rows_after = _steady_rows(before, names[0]), _steady_rows(after, names[1])
    changes = [_step_time(rows_before, rows_after)]
    data = _data_wait(rows_before, rows_after)
    if data is not None:
        changes.append(data)
    changes += _syncs(before, after)
    for change in changes:
        change.judge(parsed.get(change.metric))
        if change.metric == "site":
            change.verdict = "new" if change.before is None else "gone" if change.after is None else change.verdict
    notes = []
    for key, what in (("script", "scripts"), ("device", "devices"), ("torch", "torch versions")):
        if before.get(key) != after.get(key):
            notes.append(f"The runs differ in their {what}: {before.get(key)} and {after.get(key)}.")
    return Comparison(names[0], names[1], changes, notes)
