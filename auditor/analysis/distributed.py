"""What a module says about data-parallel training: does it wrap a model in DDP, does it give its
samplers an epoch. Both are project-wide questions (DDP is built in `main.py`, the accumulation loop
lives in `engine.py`; the sampler is made in a data factory, `set_epoch` called in the entry script),
so each module's answer goes into its summary and the project's into every module's facts."""

from __future__ import annotations

import libcst as cst

from loopaudit.analysis.module_index import FunctionInfo, ModuleIndex
from loopaudit.analysis.names import dotted_name

DDP_CLASSES = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)
# Wrappers that put the model in DDP when the job runs on several processes.
_PREPARES = ("prepare", "prepare_model", "setup")  # accelerator.prepare(model), fabric.setup(model)
_FRAMEWORKS = ("accelerate", "lightning", "lightning_fabric", "pytorch_lightning")


def wraps_ddp(index: ModuleIndex) -> bool:
    """The module wraps a model in torch's DistributedDataParallel, or hands it to Accelerate or
    Fabric to wrap (`accelerator.prepare(model, ...)`), which do so on several processes."""
    frameworks = any(index.imports.imports_module(name) for name in _FRAMEWORKS)
    for site in index.calls:
        func = site.call.func
        if index.imports.qualify(func) in DDP_CLASSES:
            return True
        if frameworks and isinstance(func, cst.Attribute) and func.attr.value in _PREPARES:
            receiver = (dotted_name(func.value) or "").lower()
            if "accelerator" in receiver or "fabric" in receiver:
                return True
    return False


def sets_sampler_epoch(index: ModuleIndex) -> bool:
    """The module calls `.set_epoch(...)` on something (a sampler, a loader, a batch sampler): where
    the project does, its samplers are taken to get their epoch."""
    return any(
        isinstance(site.call.func, cst.Attribute) and site.call.func.attr.value == "set_epoch" for site in index.calls
    )


# Collectives that wait for every rank: what a step pays for a metric it reduces. Gathers of tensors
# into a list (`all_gather(out, t)`) are left out: they build a contrastive loss's negatives as often
# as they collect a metric, and the gathered batch is then part of the step's computation.
COLLECTIVES = frozenset(
    f"torch.distributed.{name}"
    for name in (
        "all_reduce",
        "reduce",
        "barrier",
        "all_gather_object",
        "gather_object",
        "broadcast_object_list",
        "monitored_barrier",
    )
)
# Libraries' communication helpers, and the collective each runs for its caller.
LIBRARY_HELPERS = {
    "timm.utils.reduce_tensor": "all_reduce",
    "timm.utils.distributed.reduce_tensor": "all_reduce",
    "detectron2.utils.comm.reduce_dict": "reduce",
    "detectron2.utils.comm.synchronize": "barrier",
    "detectron2.utils.comm.all_gather": "all_gather_object",
    "detectron2.utils.comm.gather": "gather_object",
}
# Code whose collectives the computation needs: a module's forward, a loss, an autograd function.
_COMPUTATION = ("forward", "backward", "__call__")


def collective_of(call: cst.Call, index: ModuleIndex) -> str | None:
    """`"all_reduce"` for `dist.all_reduce(t)` (however torch.distributed is imported), else None."""
    name = index.imports.qualify(call.func)
    return name.rpartition(".")[2] if name in COLLECTIVES else None


def is_computation(function: FunctionInfo | None) -> bool:
    """Does the function compute the step's result (a forward, a loss, an autograd function), so that
    a collective in it is part of the computation (DETR's `all_reduce(num_boxes)` normalizes the loss)?"""
    while function is not None:
        if function.name in _COMPUTATION or "loss" in function.name.lower():
            return True
        outer = function.frame.parent
        function = outer.enclosing_function() if outer is not None else None
    return False


def helper_collective(function: FunctionInfo, index: ModuleIndex) -> str | None:
    """The collective a communication helper runs (`reduce_tensor`, `reduce_dict`, `all_reduce_mean`):
    a function outside the computation that calls one (StepModel.communication_helper also asks
    that it neither trains nor runs a step loop). A step that calls it
    pays for the collective at the call, which is where the finding goes."""
    if is_computation(function):
        return None
    for site in function.all_calls:
        if site.frame.enclosing_function() is function and (name := collective_of(site.call, index)) is not None:
            return name
    return None


def library_collective(call: cst.Call, index: ModuleIndex) -> str | None:
    """The collective a library's helper runs (`timm.utils.reduce_tensor`), named through the imports or
    through a star import of the library (`from timm.utils import *`, then `reduce_tensor(...)`)."""
    name = index.imports.qualify(call.func)
    if name in LIBRARY_HELPERS:
        return LIBRARY_HELPERS[name]
    if name is None and isinstance(call.func, cst.Name) and index.module_scope.lookup(call.func.value) is None:
        for module in index.imports.star_modules:
            if (found := LIBRARY_HELPERS.get(f"{module}.{call.func.value}")) is not None:
                return found
    return None
