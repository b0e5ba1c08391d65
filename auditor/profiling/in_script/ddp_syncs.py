"""How many times DDP all-reduces the gradients in one optimizer step, and after which backward.

DDP decides in its forward whether the coming backward all-reduces: it does when autograd is on and
`require_backward_grad_sync` is set (`no_sync()` clears it). So the count of such forwards in a step
is the count of gradient all-reduces the step pays; more than one means accumulated micro-batches
each reduced (LA702's problem). Each backward called after such a forward is noted at the user's line
that called it, where the scan reports LA702.

Wrapping `DistributedDataParallel.forward` and `Tensor.backward` costs a Python call per forward and
backward, nothing per operator; registering a communication hook would see the reductions
themselves, but DDP takes only one, and a script that registers its own would then fail.
"""

from __future__ import annotations

import functools
import threading

import torch
from torch.nn.parallel import DistributedDataParallel

from loopaudit.profiling.in_script.report import SiteRecord
from loopaudit.profiling.in_script.sites import user_site


class DdpSyncCounter:
    """Installed when the measured window opens, removed when it closes."""

    def __init__(self) -> None:
        self.sites: dict[tuple[str, int], SiteRecord] = {}
        self.synced_forwards = 0  # in the step now running
        self._armed = 0  # synced forwards whose backward has not run yet
        self._thread = threading.get_ident()
        self._restore: list[tuple[object, str, object]] = []

    def install(self) -> None:
        counter = self
        forward = DistributedDataParallel.forward
        backward = torch.Tensor.backward

        @functools.wraps(forward)
        def watched_forward(module, *args, **kwargs):
            if (
                threading.get_ident() == counter._thread
                and torch.is_grad_enabled()
                and module.training
                and module.require_backward_grad_sync
            ):
                counter.synced_forwards += 1
                counter._armed += 1
            return forward(module, *args, **kwargs)

        @functools.wraps(backward)
        def watched_backward(tensor, *args, **kwargs):
            if counter._armed and threading.get_ident() == counter._thread:
                counter._armed -= 1
                site = user_site()
                if site is not None:
                    record = counter.sites.get(site)
                    if record is None:
                        record = counter.sites[site] = SiteRecord(
                            "ddp gradient sync", "DistributedDataParallel", site[0], site[1]
                        )
                    record.seen()
            return backward(tensor, *args, **kwargs)

        for owner, name, wrapped in (
            (DistributedDataParallel, "forward", watched_forward),
            (torch.Tensor, "backward", watched_backward),
        ):
            self._restore.append((owner, name, getattr(owner, name)))
            setattr(owner, name, wrapped)

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def end_step(self) -> int:
        """A measured step ended: its backward sites count. Returns the gradient all-reduces it made."""
        for record in self.sites.values():
            record.commit()
        synced, self.synced_forwards, self._armed = self.synced_forwards, 0, 0
        return synced

    def discard_step(self) -> None:
        for record in self.sites.values():
            record.discard()
        self.synced_forwards = self._armed = 0
