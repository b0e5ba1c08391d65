from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import UNKNOWN, Report, Rule, RuleContext, iter_subtree, setting_value
from loopaudit.rules.data._loaders import is_dataloader, loader_argument
from loopaudit.rules.distributed._test_code import in_test_code

_SYNC_BATCHNORM = (
    "apex.parallel.convert_syncbn_model",
    "apex.parallel.SyncBatchNorm",
    "torch.nn.SyncBatchNorm",
    "torch.nn.modules.batchnorm.SyncBatchNorm",
    "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
    "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
)
# A batch per GPU from which BatchNorm's own statistics are good: below it, syncing them is the point.
LARGE_BATCH = 32
# A test that switches SyncBatchNorm on (`if args.sync_bn:`, `if cfg.MODEL.SYNC_BN and distributed:`).
_SWITCH = re.compile(r"sync|_bn|bn_|batchnorm", re.IGNORECASE)


def _switched_off_by_default(call: cst.Call, ctx: RuleContext) -> bool:
    """Is the call under a switch for SyncBatchNorm that is not on by default (an option whose default
    is False, or one whose default cannot be read)?"""
    node: cst.CSTNode | None = call
    while node is not None:
        parent = ctx.parent(node)
        if isinstance(parent, (cst.If, cst.IfExp)) and node is not parent.test:
            called = {
                id(part) for n in iter_subtree(parent.test) if isinstance(n, cst.Call) for part in iter_subtree(n.func)
            }
            for part in iter_subtree(parent.test):
                # a setting (`args.sync_bn`), not a function (`utils.has_batchnorms(model)`, EsViT's)
                if not isinstance(part, (cst.Name, cst.Attribute)) or id(part) in called:
                    continue
                if not _SWITCH.search(ctx.source(part, 200)):
                    continue
                if setting_value(part, ctx) is not True:
                    return True
                break
        node = parent
    return False


def _small_batches(ctx: RuleContext) -> bool:
    """Does this module have loaders, every one shown to use a batch below LARGE_BATCH?"""
    sizes = []
    for site in ctx.index.calls:
        if not is_dataloader(site.call, ctx):
            continue
        size = loader_argument(site.call, "batch_size", ctx)
        value = setting_value(size, ctx) if size is not None and size is not UNKNOWN else None
        if type(value) is not int:
            return False
        sizes.append(value)
    return bool(sizes) and max(sizes) < LARGE_BATCH


class SyncBatchnorm(Rule):
    code = "LA704"
    name = "sync-batchnorm"
    summary = "`SyncBatchNorm` on by default: a blocking all-reduce in every BatchNorm layer's forward."
    message = (
        "`SyncBatchNorm` all-reduces each BatchNorm layer's statistics in every forward, and blocks the host "
        "while it does"
    )
    suggestion = (
        "with a large batch per GPU, plain `BatchNorm` statistics are good enough: make SyncBatchNorm opt-in "
        "(`if args.sync_bn:`), and keep it where each GPU sees only a few samples"
    )
    what_it_flags = (
        "`torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)` or `nn.SyncBatchNorm(...)`, however `torch.nn` "
        "is imported (and apex's `convert_syncbn_model` / `SyncBatchNorm`), that runs by default: not under a switch for it (`if args.sync_bn:`, `cfg.SYNC_BN`) whose "
        "default is off or unknown. Not flagged either when every `DataLoader` of the module is shown to use a "
        f"batch below {LARGE_BATCH} (detection and segmentation, where syncing the statistics is the point). "
        "This is a note to weigh, not an error: SyncBatchNorm is sometimes what the method needs."
    )
    why_it_costs = (
        "Each SyncBatchNorm layer all-reduces its batch mean and variance across the ranks in the forward pass, "
        "and the CPU waits for the result before it can queue the next layer (pytorch/pytorch#36452): a "
        "ResNet-50 pays about fifty round trips per forward and as many in the backward. Reported costs range "
        "from about 25% more time per epoch to forwards 4x slower. With 32 or more samples per GPU, each "
        "GPU's own statistics are usually as good."
    )
    example = (
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DDP(model.cuda(), device_ids=[rank])\n"
    )
    use_instead = (
        "if args.sync_bn:  # for small batches per GPU\n"
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "model = DDP(model.cuda(), device_ids=[rank])\n"
    )
    fix_safety = "No automatic fix: whether the statistics need syncing depends on the batch per GPU and the method."
    valid = (
        # Opt-in, off by default.
        "import argparse\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--sync-bn', action='store_true')\n"
        "args = parser.parse_args()\n"
        "if args.sync_bn:\n"
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n",
        # Two images per GPU: syncing the statistics is what makes BatchNorm work at all.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"
        "loader = DataLoader(coco, batch_size=2, collate_fn=collate)\n",
    )
    invalid = (
        "import torch\n"
        "import torch.nn as nn\n"
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # expect: LA704\n"
        "model = nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[rank])\n",
        "import torch\n"
        "from torch import nn\n"
        "class Head(nn.Module):\n"
        "    def __init__(self, dim):\n"
        "        super().__init__()\n"
        "        self.layers = nn.Sequential(nn.Linear(dim, dim), nn.SyncBatchNorm(dim), nn.ReLU())  # expect: LA704\n",
        # A switch that is on unless told otherwise.
        "import argparse\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--sync-bn', type=bool, default=True)\n"
        "args = parser.parse_args()\n"
        "if args.sync_bn:\n"
        "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # expect: LA704\n",
        # A test of the model, not a setting: on whenever the model has BatchNorm (EsViT).
        "import torch\n"
        "if utils.has_batchnorms(student):\n"
        "    student = torch.nn.SyncBatchNorm.convert_sync_batchnorm(student)  # expect: LA704\n",
    )

    node_types = (cst.Call,)
    needs_step = False
    needs_cuda = False  # (SyncBatchNorm itself runs only on CUDA; a CPU job never converts)
    text_hint = "SyncBatchNorm"

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if ctx.qualified_name(node.func) not in _SYNC_BATCHNORM or in_test_code(ctx.frame):
            return
        if _switched_off_by_default(node, ctx):
            return
        if _small_batches(ctx):
            return
        yield Report(node)
