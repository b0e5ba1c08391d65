"""Does this module put work on a CUDA device?

A host-device sync only costs something when there is a device to wait for. A module targets CUDA
when it says so anywhere: a `.cuda()` call, a `"cuda"`/`"cuda:0"`/`f"cuda:{rank}"` or `"nccl"`
literal, any use of `torch.cuda` (`torch.cuda.is_available()`, `torch.cuda.set_device`), or a
framework that picks the accelerator for it (accelerate's `Accelerator`, Lightning's `Fabric` or a
`LightningModule`, an HF `Trainer` subclass). A script with none of these runs on the CPU (or on
MPS/XLA, whose costs differ), and the LA1xx rules stay silent there.
"""

from __future__ import annotations

from .module_index import ModuleIndex
from .stepmodel import StepModel

_ACCELERATOR_CLASSES = (
    "accelerate.Accelerator",
    "accelerate.accelerator.Accelerator",
    "lightning.Fabric",
    "lightning.fabric.Fabric",
    "lightning_fabric.Fabric",
)


def targets_cuda(index: ModuleIndex, steps: StepModel) -> bool:
    if index.cuda_strings or index.cuda_method_calls:
        return True
    for attribute in index.cuda_attributes:
        qualified = index.imports.qualify(attribute) or ""
        if qualified == "torch.cuda" or qualified.startswith("torch.cuda."):
            return True
    for call in index.constructor_calls:
        if (index.imports.qualify(call.func) or "") in _ACCELERATOR_CLASSES:
            return True
    return steps.has_framework_classes()
