"""The sync spy: the Python entry points that make the host wait for the GPU, wrapped during the
measured window so that each call is counted against the user's line that made it.

What it watches: scalar reads (`.item()`, `.tolist()`, `if t:`, `float(t)`, `int(t)`, a tensor as an
index, printing or formatting a tensor), ops whose output size depends on values (`nonzero`,
`argwhere`, `masked_select`, `unique`, `bincount`, one-argument `torch.where`, `repeat_interleave`
with tensor repeats, `one_hot` without `num_classes`, `x[mask]`), copies (`.cpu()`, `.to(...)`,
`.cuda()`, `.copy_()`, `.numpy(force=True)`) and explicit `synchronize()` calls.

Why wrappers and not a TorchDispatchMode: a dispatch mode calls back into Python for every operator
the step runs (forward, backward, every optimizer update), about 10 microseconds each on this
project's machine: +100% to +200% on the step time of a small model, which would both slow the run
and distort the very step time being measured. Wrapping the entry points costs nothing for the
operators that cannot sync. What wrappers cannot see, syncs made inside C++ code, are still caught
on CUDA by `torch.cuda.set_sync_debug_mode("warn")` (the probe counts those warnings per line).

On CUDA a call counts when its tensor is on the GPU, wherever it was made from, and is attributed to
the innermost user frame (library code that syncs, such as GradScaler's `found_inf` read, is named
as `via`). On a machine without CUDA nothing syncs, so the spy reports what *would* synchronize on
CUDA, and to stay precise it counts only calls made directly by the user's own code: the optimizer's
own `step.item()` on its CPU step counter is not the user's sync, on any device.
"""

from __future__ import annotations

import functools
import os
import threading
import time

import torch

from loopaudit.profiling.in_script.report import BatchMove, SiteRecord
from loopaudit.profiling.in_script.sites import caller_frame, is_user_file, user_frame

# The text of the warning torch's CUDA sync check (`set_sync_debug_mode("warn")`) gives for a sync:
# the probe and the sync budget catch it to count syncs made inside C++ (note_sync_warning).
SYNC_WARNING = "synchronizing CUDA operation"

# Tensors straight out of a DataLoader carry the index of their loader under this attribute, and
# tensors the script moved to its device carry MOVED; see BatchTracker.
BATCH_TAG = "_loopaudit_batch"
MOVED_TAG = "_loopaudit_moved"


def _tensor(value) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def _has_bool_mask(index) -> bool:
    if isinstance(index, torch.Tensor):
        return index.dtype is torch.bool
    if isinstance(index, tuple):
        return any(isinstance(part, torch.Tensor) and part.dtype is torch.bool for part in index)
    return False


# Each entry point: where it lives, its attribute, the kind of sync, and an optional test of its
# arguments (args include `self` for methods) that says whether this call needs a device value.
_ALWAYS = None
_SCALAR_READS = {
    "item": "item",
    "tolist": "tolist",
    "__bool__": "bool",
    "__float__": "float",
    "__int__": "int",
    "__index__": "index",
    "__format__": "format",
    "__repr__": "format",
}
_DATA_DEPENDENT = ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount")


def _tensor_repeats(args, kwargs) -> bool:
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
    return isinstance(repeats, torch.Tensor) and repeats.dim() > 0 and kwargs.get("output_size") is None


def _condition_only(args, kwargs) -> bool:
    return len(args) == 1 and not kwargs  # torch.where(cond) is nonzero(cond) in tuple form


def _no_num_classes(args, kwargs) -> bool:
    classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    return classes == -1


def _mask_index(args, kwargs) -> bool:
    return len(args) > 1 and _has_bool_mask(args[1])


def _force(args, kwargs) -> bool:
    return bool(kwargs.get("force", args[1] if len(args) > 1 else False))


ENTRY_POINTS: list[tuple[object, str, str, object]] = [
    *[(torch.Tensor, name, kind, _ALWAYS) for name, kind in _SCALAR_READS.items()],
    *[(owner, name, name, _ALWAYS) for name in _DATA_DEPENDENT for owner in (torch.Tensor, torch)],
    (torch, "where", "nonzero", _condition_only),
    (torch.Tensor, "repeat_interleave", "repeat_interleave", _tensor_repeats),
    (torch, "repeat_interleave", "repeat_interleave", _tensor_repeats),
    (torch.nn.functional, "one_hot", "one_hot", _no_num_classes),
    (torch.Tensor, "numpy", "device-to-host copy", _force),
    (torch.Tensor, "cpu", "device-to-host copy", _ALWAYS),
]
# Indexing has a wrapper of its own (`_watch_index`): datasets index tensors once per sample, so the
# common case (an int, a slice) must cost next to nothing.
_PLAIN_INDEX = (int, slice, type(None), type(Ellipsis))
# Copies whose direction is known only from the devices involved.
COPIES = ("to", "cuda", "copy_")
SYNCHRONIZE = [(torch.cuda, "synchronize"), (torch.cuda.Stream, "synchronize"), (torch.cuda.Event, "synchronize")]


class SyncSpy:
    """Installed when the measured window opens, removed when it closes."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.sites: dict[tuple[str, str, int, str | None], SiteRecord] = {}
        self.batch_moves: dict[tuple[int, str, int], BatchMove] = {}
        self.stall_seconds = 0.0  # time inside syncs since the probe last read it (CUDA)
        self.moves_batches = False  # has the script moved any DataLoader output to its device?
        self._thread = threading.get_ident()
        self._busy = False  # inside a watched call: what it calls itself is not counted again
        self._current: SiteRecord | None = None
        self._restore: list[tuple[object, str, object, bool]] = []
        self._enabled = True
        # Inside a DataLoader's `__next__` (single-process loading): `Dataset.__getitem__` and the
        # collate function build the batch on the host, so nothing they read can wait for a GPU.
        self.fetching = False
        # DataLoader workers forked while it is installed inherit the wrappers: they must stay quiet.
        os.register_at_fork(after_in_child=self.disable)

    # --- installing ----------------------------------------------------------------------------

    def install(self) -> None:
        self._enabled = True
        for owner, name, kind, accepts in ENTRY_POINTS:
            self._patch(owner, name, self._watch(owner, name, kind, accepts))
        self._patch(torch.Tensor, "__getitem__", self._watch_index())
        for name in COPIES:
            self._patch(torch.Tensor, name, self._watch_copy(name))
        for owner, name in SYNCHRONIZE:
            self._patch(owner, name, self._watch(owner, name, "synchronize", _ALWAYS, device_free=True))

    def uninstall(self) -> None:
        self._enabled = False
        for owner, name, original, owned in reversed(self._restore):
            if owned:
                setattr(owner, name, original)
            else:
                delattr(owner, name)  # it was inherited (Tensor.__bool__ from TensorBase)
        self._restore.clear()

    def end_step(self) -> float:
        """A measured step ended: its calls count. Returns the time it spent in syncs (CUDA)."""
        for record in (*self.sites.values(), *self.batch_moves.values()):
            record.commit()
        stalled, self.stall_seconds = self.stall_seconds, 0.0
        return stalled

    def discard_step(self) -> None:
        """A step left out of the measurement ended: its calls and stalls do not count."""
        for record in (*self.sites.values(), *self.batch_moves.values()):
            record.discard()
        self.stall_seconds = 0.0

    def _watches_this_thread(self) -> bool:
        """The script's main thread only: its steps are what the probe measures."""
        return threading.get_ident() == self._thread

    def disable(self) -> None:
        """Count nothing more (the wrappers stay until `uninstall`): in a forked worker, and once
        loopaudit has halted the measurement."""
        self._enabled = False

    def _patch(self, owner, name: str, make) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        owned = name in vars(owner) if isinstance(owner, type) else True
        self._restore.append((owner, name, original, owned))
        setattr(owner, name, make(original))

    # --- watching --------------------------------------------------------------------------------

    def _watch(self, owner, name: str, kind: str, accepts, device_free: bool = False):
        spy = self
        label = f"{'Tensor' if owner is torch.Tensor else getattr(owner, '__name__', str(owner))}.{name}"

        def make(original):
            @functools.wraps(original)
            def watched(*args, **kwargs):
                if spy._busy or not spy._enabled or not spy._watches_this_thread():
                    return original(*args, **kwargs)
                if accepts is not None and not accepts(args, kwargs):
                    return original(*args, **kwargs)
                if not device_free and not spy._would_sync(args):
                    return original(*args, **kwargs)
                return spy._timed(kind, label, original, args, kwargs)

            return watched

        return make

    def _watch_index(self):
        """`x[mask]` with a boolean mask: its size depends on the mask's values."""
        spy = self
        generic = self._watch(torch.Tensor, "__getitem__", "boolean-mask index", _mask_index)

        def make(original):
            watched = generic(original)

            @functools.wraps(original)
            def indexed(tensor, index):
                if not spy._enabled or type(index) in _PLAIN_INDEX:
                    return original(tensor, index)
                if type(index) is tuple:  # x[:, 0]: no tensor in it, no mask
                    for part in index:
                        if isinstance(part, torch.Tensor):
                            return watched(tensor, index)
                    return original(tensor, index)
                return watched(tensor, index)

            return indexed

        return make

    def _watch_copy(self, name: str):
        spy = self
        label = f"Tensor.{name}"

        def make(original):
            @functools.wraps(original)
            def watched(*args, **kwargs):
                if spy._busy or not spy._enabled or not spy._watches_this_thread():
                    return original(*args, **kwargs)
                return spy._copy(label, original, args, kwargs)

            return watched

        return make

    def _would_sync(self, args) -> bool:
        """Does this call need a value that lives on the GPU?"""
        tensor = _tensor(args[0]) if args else None
        if tensor is None:
            return False
        if self.cuda:
            return tensor.is_cuda
        if self.fetching:
            return False
        # No GPU here: only the user's own calls count, and not on DataLoader output that the script
        # leaves on the host while it moves other batch tensors (a CUDA run keeps it there too).
        if (
            getattr(tensor, BATCH_TAG, None) is not None
            and not getattr(tensor, MOVED_TAG, False)
            and self.moves_batches
        ):
            return False
        caller = caller_frame()
        return caller is not None and is_user_file(caller.f_code.co_filename)

    def _timed(self, kind: str, label: str, original, args, kwargs):
        self._busy = True
        record = self._record(kind, label)
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - started
            self._busy = False
            self._current = None
            if record is not None:
                record.seconds += elapsed
                if self.cuda:
                    self.stall_seconds += elapsed

    def _record(self, kind: str, label: str) -> SiteRecord | None:
        site, via = self._site()
        if site is None:
            return None
        key = (kind, site[0], site[1], via)
        record = self.sites.get(key)
        if record is None:
            record = self.sites[key] = SiteRecord(kind, label, site[0], site[1], via)
        record.seen()
        self._current = record
        return record

    def _site(self) -> tuple[tuple[str, int] | None, str | None]:
        """The user's line, and the library function between it and the call, if any."""
        frame = caller_frame()
        via = None
        if (
            frame is not None
            and not is_user_file(frame.f_code.co_filename)
            and not frame.f_code.co_filename.startswith("<")
        ):
            # co_qualname is Python 3.11+; 3.10 names the function alone.
            code = frame.f_code
            via = f"{_short_path(code.co_filename)}:{getattr(code, 'co_qualname', code.co_name)}"
        frame = user_frame(frame)
        if frame is None:
            return None, None
        return (frame.f_code.co_filename, frame.f_lineno), via

    def note_sync_warning(self, site: tuple[str, int] | None) -> None:
        """torch's CUDA sync check fired. Inside a watched call that proves the call synchronized;
        anywhere else it is a sync the wrappers cannot see (one made inside C++), counted at `site`."""
        if not self._enabled or not self._watches_this_thread():
            return
        if self._current is not None:
            self._current.proven += 1
            return
        if site is None:
            return
        key = ("cuda sync", site[0], site[1], None)
        record = self.sites.get(key)
        if record is None:
            record = self.sites[key] = SiteRecord("cuda sync", "torch.cuda.set_sync_debug_mode", site[0], site[1])
        record.seen()
        record.proven += 1

    # --- copies ----------------------------------------------------------------------------------

    def _copy(self, label: str, original, args, kwargs):
        direction = _copy_direction(label, args, kwargs)
        if direction is None:
            return original(*args, **kwargs)
        source, target, non_blocking = direction
        # `destination.copy_(batch)` fills a buffer the script owns: not a move of the batch itself.
        batch = getattr(source, BATCH_TAG, None) if label != "Tensor.copy_" else None
        kind = None
        if self.cuda and source.is_cuda and target.type == "cpu" and not non_blocking:
            kind = "device-to-host copy"
        elif self.cuda and not source.is_cuda and target.type == "cuda" and not (non_blocking and source.is_pinned()):
            # From pageable memory even a non_blocking copy is staged synchronously by the driver.
            kind = "blocking host-to-device copy"
        if batch is None and kind is None:
            return original(*args, **kwargs)
        started = time.perf_counter()
        result = self._timed(kind, label, original, args, kwargs) if kind else original(*args, **kwargs)
        # On a CPU machine `.to(device)` is where a CUDA run would copy the batch to the GPU.
        if batch is not None and isinstance(result, torch.Tensor) and (target.type != "cpu" or not self.cuda):
            self.moves_batches = True
            self._note_batch_move(batch, source, result, time.perf_counter() - started)
        return result

    def _note_batch_move(self, loader: int, source: torch.Tensor, result: torch.Tensor, seconds: float) -> None:
        try:
            setattr(result, MOVED_TAG, True)
        except (AttributeError, RuntimeError):
            pass
        frame = user_frame(caller_frame())
        if frame is None:
            return
        pageable = source.device.type == "cpu" and not source.is_pinned()
        key = (loader, frame.f_code.co_filename, frame.f_lineno)
        record = self.batch_moves.get(key)
        if record is None:
            record = self.batch_moves[key] = BatchMove(loader, key[1], key[2], pageable)
        record.seen(source.numel() * source.element_size(), seconds)
        record.pageable = record.pageable or pageable


def _copy_direction(label: str, args, kwargs) -> tuple[torch.Tensor, torch.device, bool] | None:
    """(source tensor, device the data goes to, non_blocking) of `.to(...)`, `.cuda(...)` and
    `destination.copy_(source)`; None when the call moves nothing (`.to(torch.half)`)."""
    try:
        if label == "Tensor.to":
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is None or not isinstance(args[0], torch.Tensor):
                return None
            return args[0], torch.device(device), bool(non_blocking)
        non_blocking = bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))
        if label == "Tensor.cuda":
            return (args[0], torch.device("cuda"), non_blocking) if isinstance(args[0], torch.Tensor) else None
        source = args[1] if len(args) > 1 else kwargs.get("src")
        if not isinstance(source, torch.Tensor) or not isinstance(args[0], torch.Tensor):
            return None
        return source, args[0].device, non_blocking
    except (TypeError, RuntimeError, ValueError, IndexError):
        return None  # arguments torch itself will reject: let it say so


def _short_path(filename: str) -> str:
    normalized = filename.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/", "/lib/python"):
        if marker in normalized:
            tail = normalized.split(marker, 1)[1]
            return tail.split("/", 1)[1] if marker == "/lib/python" and "/" in tail else tail
    return os.path.basename(filename)


class BatchTracker:
    """Tags the tensors a DataLoader hands out with the loader's index (an attribute on the tensor
    object), so the spy can tell a batch being moved to the device from other copies."""

    def __init__(self) -> None:
        self.enabled = False

    def tag(self, batch, loader: int, depth: int = 0) -> None:
        if not self.enabled or depth > 4:
            return
        if isinstance(batch, torch.Tensor):
            try:
                setattr(batch, BATCH_TAG, loader)
            except (AttributeError, RuntimeError):
                pass
        elif isinstance(batch, (list, tuple)):
            for item in batch[:64]:
                self.tag(item, loader, depth + 1)
        elif isinstance(batch, dict) or (hasattr(batch, "items") and hasattr(batch, "keys")):
            try:
                values = list(batch.values())[:64]
            except Exception:  # a mapping-like object of the user's that does not behave
                return
            for item in values:
                self.tag(item, loader, depth + 1)
