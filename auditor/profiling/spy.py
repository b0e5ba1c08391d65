"""A dispatch-level spy that sees every operator that makes the host wait for the GPU.

`.item()`, `float(t)` and `if t:` all reach `aten::_local_scalar_dense`; `nonzero`, `masked_select`,
`unique` and boolean-mask indexing must learn an output size from the device; `.cpu()` and blocking
`.to("cuda")` from pageable memory wait for the copy. A TorchDispatchMode sees each of them with its
arguments, so it can tell a CUDA tensor from a CPU one, and the interpreter's stack at that moment
names the user's line.

On CUDA a site is a sync only when its input lives on the GPU. On a machine without CUDA nothing
can sync, and every site is reported as one that would synchronize on CUDA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .sites import user_site

_aten = torch.ops.aten
# Operators whose output needs a value (or a size) that only the device knows.
_SCALAR = {_aten._local_scalar_dense.default: "item"}
_DATA_DEPENDENT = {
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten._unique2.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.unique_consecutive.default: "unique_consecutive",
    _aten.repeat_interleave.Tensor: "repeat_interleave",
}
_INDEXING = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default}
_COPIES = {_aten._to_copy.default, _aten.copy_.default}


@dataclass
class SiteRecord:
    kind: str  # item, nonzero, boolean-mask index, device-to-host copy, ...
    file: str
    line: int
    count: int = 0
    seconds: float = 0.0  # time spent inside the operator (the stall, on CUDA)


def _is_cuda(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_cuda


class SyncSpy(TorchDispatchMode):
    def __init__(self, cuda: bool) -> None:
        super().__init__()
        self.cuda = cuda
        self.sites: dict[tuple[str, str, int], SiteRecord] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = self._sync_kind(func, args, kwargs or {})
        if kind is None:
            return func(*args, **(kwargs or {}))
        started = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self._record(kind, time.perf_counter() - started)

    def _record(self, kind: str, seconds: float) -> None:
        site = user_site(skip=2)
        if site is None:
            return
        key = (kind, site[0], site[1])
        record = self.sites.get(key)
        if record is None:
            record = self.sites[key] = SiteRecord(kind, site[0], site[1])
        record.count += 1
        record.seconds += seconds

    def _sync_kind(self, func, args, kwargs) -> str | None:
        name = _SCALAR.get(func) or _DATA_DEPENDENT.get(func)
        if name is not None:
            return name if self._on_device(args) else None
        if func in _INDEXING:
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(i, torch.Tensor) and i.dtype is torch.bool for i in indices or ()):
                return "boolean-mask index" if self._on_device(args) else None
            return None
        if func in _COPIES and self.cuda:
            return self._blocking_copy(func, args, kwargs)
        return None

    def _on_device(self, args) -> bool:
        """On CUDA: is the input on the GPU? Without CUDA every site counts (it would sync there)."""
        if not self.cuda:
            return True
        return bool(args) and _is_cuda(args[0])

    @staticmethod
    def _blocking_copy(func, args, kwargs) -> str | None:
        if func is _aten._to_copy.default:
            source = args[0] if args else None
            target = kwargs.get("device")
            non_blocking = kwargs.get("non_blocking", False)
        else:  # copy_(destination, source, non_blocking)
            source = args[1] if len(args) > 1 else None
            target = args[0].device if args else None
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        if not isinstance(source, torch.Tensor) or target is None:
            return None
        target = torch.device(target)
        if source.is_cuda and target.type == "cpu":
            return None if non_blocking else "device-to-host copy"
        if not source.is_cuda and target.type == "cuda" and not (non_blocking and source.is_pinned()):
            return "blocking host-to-device copy"
        return None
