"""The sync spy as budgets use it: installed once for the whole process, counting each call into the
innermost budget of the thread that made it (sync_budget.py says why)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from loopaudit.profiling.in_script.report import SiteRecord
from loopaudit.profiling.in_script.spy import SyncSpy
from loopaudit.testing.budget import Budget


class BudgetSpy(SyncSpy):
    def __init__(self, cuda: bool, budgets: Callable[[], list[Budget]]) -> None:
        self._state = threading.local()  # before the spy's own __init__ sets the per-thread flags
        self._budgets = budgets  # this thread's open budgets, innermost last
        super().__init__(cuda)

    # The spy's flags for the call in progress belong to the thread making it.
    @property
    def _busy(self) -> bool:
        return getattr(self._state, "busy", False)

    @_busy.setter
    def _busy(self, value: bool) -> None:
        self._state.busy = value

    @property
    def _current(self) -> SiteRecord | None:
        return getattr(self._state, "current", None)

    @_current.setter
    def _current(self, value: SiteRecord | None) -> None:
        self._state.current = value

    def _watches_this_thread(self) -> bool:
        return bool(self._budgets())

    def _record(self, kind: str, label: str) -> SiteRecord | None:
        budgets = self._budgets()
        site, via = self._site()
        if site is None or not budgets:
            return None
        record = _site_record(budgets[-1], kind, label, site, via)
        self._current = record
        return record

    def note_sync_warning(self, site: tuple[str, int] | None) -> None:
        budgets = self._budgets()
        if not self._enabled or not budgets:
            return
        if self._current is not None:
            self._current.proven += 1
            return
        if site is not None:
            _site_record(budgets[-1], "cuda sync", "torch.cuda.set_sync_debug_mode", site, None).proven += 1


def _site_record(budget: Budget, kind: str, label: str, site: tuple[str, int], via: str | None) -> SiteRecord:
    key = (kind, site[0], site[1], via)
    record = budget.sites.get(key)
    if record is None:
        record = budget.sites[key] = SiteRecord(kind, label, site[0], site[1], via)
    record.seen()  # counted in `pending`: a budget has no steps to commit them to
    return record
