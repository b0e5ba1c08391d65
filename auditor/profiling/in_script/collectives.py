"""The collectives spy: torch.distributed's collectives, wrapped during the measured window, each call
timed and counted against the user's line that made it (and the user's lines above it, so that a
helper's `all_reduce` is also known by the step's call of the helper, where the scan reports it).

The time inside a blocking collective is the rank's "comm wait": the round trip, plus the wait for
the slowest rank to arrive. DDP's own gradient all-reduce runs from C++ hooks inside `backward()`,
not through these functions: it is not counted here (a trace shows it).
"""

from __future__ import annotations

import functools
import os
import threading
import time

import torch

from loopaudit.profiling.in_script.report import SiteRecord
from loopaudit.profiling.in_script.sites import caller_frame, is_user_file

COLLECTIVES = (
    "all_reduce",
    "reduce",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "broadcast_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
)
# How many of the user's lines above the call are kept: the helper's line, the step's call of it, ...
_STACK_DEPTH = 4


class CollectiveSpy:
    """Installed when the measured window opens, removed when it closes."""

    def __init__(self) -> None:
        self.sites: dict[tuple[str, int, str], SiteRecord] = {}
        self.seconds = 0.0  # time inside collectives since the probe last read it
        self._thread = threading.get_ident()
        self._busy = False  # inside a watched call: a collective it makes itself is not counted again
        self._restore: list[tuple[str, object]] = []
        self._enabled = True
        os.register_at_fork(after_in_child=self.disable)

    def install(self) -> None:
        if not torch.distributed.is_available():
            return
        module = torch.distributed
        for name in COLLECTIVES:
            original = getattr(module, name, None)
            if original is not None:
                self._restore.append((name, original))
                setattr(module, name, self._watch(name, original))

    def uninstall(self) -> None:
        for name, original in reversed(self._restore):
            setattr(torch.distributed, name, original)
        self._restore.clear()

    def disable(self) -> None:
        self._enabled = False

    def end_step(self) -> float:
        """A measured step ended: its calls count. Returns the time it spent in collectives."""
        for record in self.sites.values():
            record.commit()
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def discard_step(self) -> None:
        for record in self.sites.values():
            record.discard()
        self.seconds = 0.0

    def _watch(self, name: str, original):
        spy = self

        @functools.wraps(original)
        def watched(*args, **kwargs):
            if spy._busy or not spy._enabled or threading.get_ident() != spy._thread:
                return original(*args, **kwargs)
            record = spy._record(name)
            spy._busy = True
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                spy._busy = False
                if record is not None:
                    record.seen(elapsed)
                    spy.seconds += elapsed

        return watched

    def _record(self, name: str) -> SiteRecord | None:
        frame = caller_frame()
        via = None
        if frame is not None and not is_user_file(frame.f_code.co_filename):
            code = frame.f_code
            via = f"{os.path.basename(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"
        stack: list[tuple[str, int]] = []
        while frame is not None and len(stack) < _STACK_DEPTH:
            if is_user_file(frame.f_code.co_filename):
                stack.append((frame.f_code.co_filename, frame.f_lineno))
            frame = frame.f_back
        if not stack:
            return None
        file, line = stack[0]
        key = (file, line, name)
        record = self.sites.get(key)
        if record is None:
            record = self.sites[key] = SiteRecord(name, f"torch.distributed.{name}", file, line, via)
            record.stack = [list(place) for place in stack]
        return record
