"""Summaries of step times, the same for a live run and for a trace."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median_and_p90(values_ms: Sequence[float]) -> dict[str, float | None]:
    """{"median", "p90"} in milliseconds, rounded to the microsecond; None for no values. The p90
    is the nearest-rank value, so it is always a step that really happened."""
    ordered = sorted(values_ms)
    if not ordered:
        return {"median": None, "p90": None}
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return {"median": round(statistics.median(ordered), 3), "p90": round(p90, 3)}


def steps_phrase(count: int, adjective: str = "") -> str:
    """ "1 step", "6 measured steps": reports count steps in many places."""
    words = f"{adjective} step" if adjective else "step"
    return f"{count} {words}{'' if count == 1 else 's'}"
