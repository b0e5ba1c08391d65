"""`with sync_budget(0):` fails when the code inside makes the host wait for the GPU more than allowed,
naming each site by its line, as `loopaudit run` names them.

What counts: on CUDA, every call the sync spy watches (scalar reads, value-dependent shapes,
device-to-host copies, `synchronize()`) on a GPU tensor, host-to-device copies from pageable memory
even with `non_blocking=True` (the driver stages them synchronously, and torch's own sync check does
not report them), and every sync torch's check (`torch.cuda.set_sync_debug_mode("warn")`) reports
from inside C++. On a machine without a GPU, the calls that *would* synchronize on CUDA, made by the
user's own code (the spy's CPU rule, profiling/in_script/spy.py). A line that suppresses LA601 or a
sync rule (`# noqa: LA101`, `# loopaudit: ignore[LA1]`, a bare `# noqa`) is allowed, as the scan
allows it.

Threads. The wrappers and torch's sync check are process-wide, the budgets are not: the first budget
opened installs them and the last one closed removes them (under a lock), and each counts only the
calls made by the thread that opened it (the innermost budget of that thread). A budget closing in one
thread never switches the check off under another's feet, and restores the mode that was set before
the first one opened.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

from loopaudit.testing.budget import Budget


class SyncBudgetExceeded(AssertionError):
    """The code inside a budget synchronized more often than allowed. An AssertionError, so that
    test runners report it as a failed check."""


@contextmanager
def sync_budget(allowed: int = 0) -> Iterator[Budget]:
    """Fail (SyncBudgetExceeded) when the code inside synchronizes more than `allowed` times. The
    budget it yields lists what was counted (`budget.syncs`), also when it passes."""
    __tracebackhide__ = True  # pytest shows the test's frames, not this one
    if allowed < 0:
        raise ValueError("sync_budget: allowed must be 0 or more")
    budget = Budget(allowed)
    _Shared.open(budget)
    try:
        yield budget
    finally:
        _Shared.close(budget)
    if budget.count > allowed:
        raise SyncBudgetExceeded(budget.report())


class _Shared:
    """The process-wide part: one spy and torch's sync check, installed while any budget is open."""

    _lock = threading.Lock()
    _open = 0
    _spy = None
    _mode_before: int | None = None
    _showwarning_before: Callable[..., None] | None = None
    _filter = None
    _local = threading.local()  # .budgets: this thread's open budgets, innermost last

    @classmethod
    def budgets(cls) -> list[Budget]:
        budgets = getattr(cls._local, "budgets", None)
        if budgets is None:
            budgets = cls._local.budgets = []
        return budgets

    @classmethod
    def open(cls, budget: Budget) -> None:
        import torch

        from loopaudit.testing.budget_spy import BudgetSpy

        with cls._lock:
            if cls._open == 0:
                cuda = torch.cuda.is_available()
                if cls._spy is None:
                    cls._spy = BudgetSpy(cuda, cls.budgets)
                cls._spy.cuda = cuda
                cls._spy.install()
                if cuda:
                    cls._watch_cuda(torch)
            cls._open += 1
        cls.budgets().append(budget)

    @classmethod
    def close(cls, budget: Budget) -> None:
        import torch

        budgets = cls.budgets()
        if budget in budgets:
            budgets.remove(budget)
        with cls._lock:
            cls._open -= 1
            if cls._open == 0:
                if cls._spy is not None:
                    cls._spy.uninstall()
                if cls._mode_before is not None:
                    cls._unwatch_cuda(torch)

    @classmethod
    def _watch_cuda(cls, torch) -> None:
        from loopaudit.profiling.in_script.spy import SYNC_WARNING

        cls._mode_before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("warn")
        cls._showwarning_before = warnings.showwarning
        warnings.showwarning = cls._on_warning
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
        cls._filter = warnings.filters[0]

    @classmethod
    def _unwatch_cuda(cls, torch) -> None:
        torch.cuda.set_sync_debug_mode(cls._mode_before)
        cls._mode_before = None
        # One installed since the first budget opened is not ours to remove.
        if warnings.showwarning is cls._on_warning and cls._showwarning_before is not None:
            warnings.showwarning = cls._showwarning_before
        _remove_filter(cls._filter)
        cls._filter = None

    @classmethod
    def _on_warning(cls, message, category, filename, lineno, file=None, line=None):
        from loopaudit.profiling.in_script.sites import user_site
        from loopaudit.profiling.in_script.spy import SYNC_WARNING  # loaded with torch, when the first budget opened

        if SYNC_WARNING in str(message) and cls._spy is not None and cls.budgets():
            cls._spy.note_sync_warning(user_site())
            return None
        previous = cls._showwarning_before or warnings._showwarning_orig
        return previous(message, category, filename, lineno, file, line)


def _remove_filter(entry) -> None:
    """Take out the filter the first budget added, and tell the warnings module its filters changed
    (as `warnings.filterwarnings` does; the module has no public way to remove one)."""
    filters = cast(list, warnings.filters)  # a list at run time; typeshed calls it a Sequence
    if entry not in filters:
        return
    lock = getattr(warnings, "_lock", None)  # Python 3.14: the filters are changed under a lock
    mutated_lock_held = getattr(warnings, "_filters_mutated_lock_held", None)
    if lock is not None and mutated_lock_held is not None:
        with lock:
            filters.remove(entry)
            mutated_lock_held()
        return
    filters.remove(entry)
    mutated = getattr(warnings, "_filters_mutated", None)
    if mutated is not None:
        mutated()
