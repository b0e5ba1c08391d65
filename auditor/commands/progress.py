"""A progress bar for long scans: on a terminal only, and only once a scan has taken a second.

Short scans and piped or machine-readable output (JSON, SARIF, ...) never show one; the bar goes to
stderr and disappears when the scan ends, so what stays on the screen is the report alone.
"""

from __future__ import annotations

import time
from typing import cast

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

DELAY_SECONDS = 1.0


class ScanProgress:
    """Called as `progress(done, total)`; a no-op when not `enabled`. Use as a context manager."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label = label
        self.enabled = enabled
        self._started = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> ScanProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or done >= total:
            return
        if self._bar is None:
            if time.monotonic() - self._started < DELAY_SECONDS:
                return
            self._bar = Progress(
                TextColumn(self.label),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)
        self._bar.update(cast(TaskID, self._task), completed=done)
