"""Does this module put work on a CUDA device?

A host-device sync only costs something when there is a device to wait for. A module targets CUDA
when it calls `.cuda()` or passes `non_blocking=True` / `pin_memory=True` (options that only matter
with a GPU); wraps a model in `DataParallel` or `DistributedDataParallel(device_ids=...)`;
lets a framework pick the accelerator (accelerate's `Accelerator`, Lightning's `Fabric` or a
`LightningModule`, an HF `Trainer` subclass); or both names CUDA (a `"cuda"`/`"cuda:0"`/
`f"cuda:{rank}"`/`"nccl"` literal, any use of `torch.cuda`) and moves something to a device
(`.to(...)`, a `device=` argument). A script with none of these runs on the CPU (or on
MPS/XLA, whose costs differ), and the LA1xx rules stay silent there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from loopaudit.analysis.distributed import DDP_CLASSES
from loopaudit.analysis.module_index import ModuleIndex

if TYPE_CHECKING:
    from loopaudit.analysis.stepmodel import StepModel

_ACCELERATOR_CLASSES = (
    "accelerate.Accelerator",
    "accelerate.accelerator.Accelerator",
    "lightning.Fabric",
    "lightning.fabric.Fabric",
    "lightning_fabric.Fabric",
)


# Questions a CPU-capable script asks too; alone they do not mean the script uses the GPU.
_CUDA_PROBES = frozenset(
    {
        "torch.cuda.is_available",
        "torch.cuda.device_count",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "torch.cuda.is_initialized",
        "torch.cuda.get_device_name",
    }
)
_CUDA_ONLY_WRAPPERS = ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel")


def _pins_cpu(call: cst.Call) -> bool:
    """`Trainer(accelerator="cpu")`, `Fabric(accelerator="cpu")`, `Accelerator(cpu=True)`."""
    for arg in call.args:
        if arg.keyword is None:
            continue
        value = arg.value
        if (
            arg.keyword.value == "accelerator"
            and isinstance(value, cst.SimpleString)
            and value.value.strip("'\"") == "cpu"
        ):
            return True
        if arg.keyword.value == "cpu" and isinstance(value, cst.Name) and value.value == "True":
            return True
    return False


def targets_cuda(index: ModuleIndex, steps: StepModel) -> bool:
    if index.cuda_method_calls or index.gpu_only_options:
        return True
    framework_device = steps.has_framework_classes()
    for call in index.constructor_calls:
        qualified = index.imports.qualify(call.func) or ""
        if qualified in _CUDA_ONLY_WRAPPERS:
            return True
        if qualified in DDP_CLASSES and any(arg.keyword and arg.keyword.value == "device_ids" for arg in call.args):
            return True
        if qualified in _ACCELERATOR_CLASSES:
            framework_device = True
    # A framework picks the accelerator, unless the script pins it to the CPU (a Lightning example
    # run with `Trainer(accelerator="cpu")` never touches a GPU).
    if framework_device and not any(_pins_cpu(call) for call in index.constructor_calls):
        return True
    cuda_uses = [index.imports.qualify(attribute) or "" for attribute in index.cuda_attributes]
    cuda_uses += index.imports.imported_names()  # `from torch.cuda import synchronize`
    if any(use.startswith("torch.cuda.") and use not in _CUDA_PROBES for use in cuda_uses):
        return True  # torch.cuda.synchronize, set_device, Event, amp: CUDA-only APIs
    # A "cuda" string or a torch.cuda call only matters if something is put on a device: the
    # CIFAR-10 tutorial defines `device = "cuda:0" if ...` and only prints it.
    if not index.moves_to_device:
        return False
    return names_cuda(index)


def names_cuda(index: ModuleIndex) -> bool:
    """Does the module name CUDA (a "cuda" literal, any `torch.cuda` use) or let torch pick the
    accelerator (`torch.accelerator.current_accelerator()`, the official examples' idiom since
    PyTorch 2.6)? With a move to a device, here or in another module of the project (`args.device =
    torch.device("cuda")` in main.py, `.to(device=args.device)` in agent.py), the code runs on CUDA."""
    if index.cuda_strings:
        return True
    uses = [index.imports.qualify(attribute) or "" for attribute in index.cuda_attributes]
    uses += index.imports.imported_names()
    return any(use.startswith(("torch.cuda", "torch.accelerator")) for use in uses)
