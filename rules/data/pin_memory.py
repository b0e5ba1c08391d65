from __future__ import annotations

import libcst as cst

from loopaudit.call_edits import TRUE, keyword_value, with_keyword
from loopaudit.rule import Fix, Report, Rule

from ._loaders import UNKNOWN, constant, is_dataloader, lightning_loader_role, loader_argument, remote_step_loops, returned_step_uses, step_loops


class DataLoaderWithoutPinMemory(Rule):
    code = "LA201"
    name = "dataloader-without-pin-memory"
    summary = "`DataLoader(...)` feeding a CUDA training or evaluation loop without `pin_memory=True`."
    message = "this DataLoader feeds a CUDA loop from pageable memory: every batch copy is staged and blocks the host"
    suggestion = (
        "pass `pin_memory=True` to the DataLoader, and move batches with `.to(device, non_blocking=True)` "
        "so the copy overlaps with the GPU's work"
    )
    what_it_flags = (
        "A `torch.utils.data.DataLoader(...)` call (or a subclass imported under the name `DataLoader`, "
        "such as PyTorch Geometric's) whose result is iterated by a training or evaluation step loop of a "
        "script that targets CUDA, when `pin_memory` is not passed or is `False`. A value that cannot be "
        "read statically (`pin_memory=args.pin_mem`, `**loader_kwargs`) is not flagged, nor is a loader "
        "that no step loop of the file iterates (one handed to a Lightning `Trainer`, say)."
    )
    why_it_costs = (
        "Without `pin_memory=True` a DataLoader yields tensors in ordinary pageable host memory. The GPU's "
        "DMA engine can only read page-locked memory, so CUDA first copies each pageable batch into a "
        "pinned staging buffer on the CPU and then transfers it: two copies instead of one, with the host "
        "thread doing the first. PyTorch's `non_blocking=True` also only overlaps a copy with computation "
        "when the source is pinned; from pageable memory the copy cannot run asynchronously. With "
        "`pin_memory=True` the loader's pin-memory thread page-locks each batch in the background, so the "
        "training loop's `.to(device, non_blocking=True)` is a single asynchronous DMA transfer."
    )
    example = (
        "train_loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=8)\n"
        "for x, y in train_loader:\n"
        "    x, y = x.to(device), y.to(device)\n"
    )
    use_instead = (
        "train_loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=8, pin_memory=True)\n"
        "for x, y in train_loader:\n"
        "    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)\n"
    )
    fix_safety = (
        "Fixed by `--fix` (safe): `pin_memory=True` is added, or `pin_memory=False` becomes True; the "
        "batches' values do not change. Safe for loaders that yield host tensors. Pinned memory is page-locked RAM that the operating "
        "system cannot swap: with very large batches and many workers, watch host memory. A dataset whose "
        "tensors already live on the GPU cannot be pinned (PyTorch raises): such a loader needs no pinning."
    )
    valid = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "device = torch.device('cuda')\n"
        "train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A value read from the command line: the author chose it.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, pin_memory=args.pin_mem)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A CPU-only script: there is no device to copy to.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A loader no step loop of the file iterates (a framework iterates it).
        "import torch\n"
        "import lightning as L\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_set, batch_size=64)\n"
        "trainer = L.Trainer(accelerator='cuda')\n"
        "trainer.fit(model, loader)\n",
    )
    invalid = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "device = torch.device('cuda')\n"
        "train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=4)  # expect: LA201\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # Evaluation loops count too, `pin_memory=False` is the same, and so is a loader passed to a function.
        "import torch\n"
        "import torch.utils.data as data\n"
        "model = Net().cuda()\n"
        "def evaluate(model, loader):\n"
        "    with torch.no_grad():\n"
        "        for images, labels in loader:\n"
        "            logits = model(images.cuda(non_blocking=True))\n"
        "test_loader = data.DataLoader(test_set, batch_size=512, pin_memory=False)  # expect: LA201\n"
        "evaluate(model, test_loader)\n",
        # Lightning iterates the loaders its hooks return: the training one at every epoch.
        "import lightning as L\n"
        "from torch.utils.data import DataLoader\n"
        "class Data(L.LightningDataModule):\n"
        "    def train_dataloader(self):\n"
        "        return DataLoader(self.train_set, batch_size=64, shuffle=True, num_workers=8, persistent_workers=True)  # expect: LA201\n"
        "class Model(L.LightningModule):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.loss(batch)\n"
        "L.Trainer(accelerator='gpu').fit(Model(), Data())\n",
    )

    confirmed_by = ("LA603",)
    node_types = (cst.Call,)
    needs_step = False

    def check(self, node, ctx):
        if not is_dataloader(node, ctx):
            return
        pin = loader_argument(node, "pin_memory", ctx)
        if pin is UNKNOWN or (pin is not None and constant(pin, ctx) is not False):
            return
        if (
            not step_loops(node, ctx) and not remote_step_loops(node, ctx) and not returned_step_uses(node, ctx)
            and lightning_loader_role(node, ctx) is None
        ):
            return
        what = "without `pin_memory=True`" if pin is None else "with `pin_memory=False`"
        # Fixable where the keyword is absent or written as a keyword (not the 8th positional).
        fixable = pin is None or keyword_value(node, "pin_memory") is pin
        yield Report(
            node,
            f"`{ctx.source(node.func)}(...)` feeds a CUDA step loop {what}: every batch is copied from "
            "pageable memory through a staging buffer, and the copy cannot overlap with the GPU's work",
            fix=Fix("pass `pin_memory=True`", ((node, with_keyword(node, "pin_memory", TRUE)),)) if fixable else None,
        )
