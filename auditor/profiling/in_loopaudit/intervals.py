"""Time intervals in microseconds, as the profiler's trace gives them: merging and overlap."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable


class IntervalSet:
    """A union of half-open intervals [start, end), merged once, queried many times."""

    def __init__(self, intervals: Iterable[tuple[float, float]]) -> None:
        merged: list[list[float]] = []
        for start, end in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [start for start, _ in merged]
        self.ends = [end for _, end in merged]

    def __bool__(self) -> bool:
        return bool(self.starts)

    @property
    def first(self) -> float:
        return self.starts[0]

    @property
    def last(self) -> float:
        return self.ends[-1]

    def covered(self, start: float, end: float) -> float:
        """How much of [start, end) the union covers."""
        total = 0.0
        index = max(bisect_right(self.starts, start) - 1, 0)
        while index < len(self.starts) and self.starts[index] < end:
            total += max(0.0, min(end, self.ends[index]) - max(start, self.starts[index]))
            index += 1
        return total

    def total(self) -> float:
        return sum(end - start for start, end in zip(self.starts, self.ends))
