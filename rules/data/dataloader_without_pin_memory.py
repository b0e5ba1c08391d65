from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from loopaudit.rule_api import (
    TRUE,
    UNKNOWN,
    Fix,
    Report,
    Rule,
    RuleContext,
    constant,
    keyword_value,
    with_keyword,
)
from loopaudit.rules.data._datasets import (
    ASSIGNMENTS,
    dataset_on_device,
    yields_python_data,
)
from loopaudit.rules.data._loaders import (
    accelerate_placement,
    is_dataloader,
    lightning_loader_role,
    loader_argument,
    remote_step_loops,
    returned_step_uses,
    step_loops,
)


class DataLoaderWithoutPinMemory(Rule):
    code = "LA201"
    name = "dataloader-without-pin-memory"
    summary = "`DataLoader(...)` feeding a CUDA training or evaluation loop without `pin_memory=True`."
    message = "this DataLoader feeds a CUDA loop from pageable memory: every batch copy is staged and blocks the host"
    suggestion = (
        "pass `pin_memory=True` to the DataLoader, and move batches with `.to(device, non_blocking=True)` "
        "so the copy overlaps with the GPU's work; a loader handed to `accelerator.prepare(...)` also needs "
        "`Accelerator(dataloader_config=DataLoaderConfiguration(non_blocking=True))` (`accelerate.utils`), "
        "or Accelerate copies its batches blocking"
    )
    what_it_flags = (
        "A `torch.utils.data.DataLoader(...)` call (or a subclass imported under the name `DataLoader`, "
        "such as PyTorch Geometric's) whose result is iterated by a training or evaluation step loop of a "
        "script that targets CUDA, when `pin_memory` is not passed or is `False`. A value that cannot be "
        "read statically (`pin_memory=args.pin_mem`, `**loader_kwargs`) is not flagged, nor is a loader "
        "that no step loop of the file iterates (one handed to a Lightning `Trainer`, say). Nor is a loader "
        "with nothing to pin: a dataset of the module whose `__getitem__` returns only Python data "
        "(strings, numbers, dicts and tuples of them, such as a prompt and its index) with the default "
        "collate, or a dataset whose tensors are already on the GPU (`TensorDataset(x.to(device))`, items "
        "the script replaced with what it encoded on the device), where pinning would raise. A loader "
        "handed to Accelerate's `accelerator.prepare(...)` is copied by Accelerate with "
        "`non_blocking=False` unless the `Accelerator` is made with "
        "`dataloader_config=DataLoaderConfiguration(non_blocking=True)`: the finding then says to set both."
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
        # Nothing to pin: the items are a prompt string and an index (diffusers' PromptDataset).
        "import argparse\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--class_prompt', type=str, default=None)\n"
        "args = parser.parse_args()\n"
        "class PromptDataset(Dataset):\n"
        "    def __init__(self, prompt, num_samples):\n"
        "        self.prompt = prompt\n"
        "        self.num_samples = num_samples\n"
        "    def __len__(self):\n"
        "        return self.num_samples\n"
        "    def __getitem__(self, index):\n"
        "        example = {}\n"
        "        example['prompt'] = self.prompt\n"
        "        example['index'] = index\n"
        "        return example\n"
        "pipeline.to('cuda')\n"
        "loader = DataLoader(PromptDataset(args.class_prompt, 100), batch_size=4)\n"
        "for example in loader:\n"
        "    images = pipeline(example['prompt']).images\n",
        # Already on the GPU: pinning a CUDA tensor raises.
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "device = torch.device('cuda')\n"
        "rgb = torch.from_numpy(image).to(device)\n"
        "loader = DataLoader(TensorDataset(torch.stack([rgb] * 10)), batch_size=2)\n"
        "with torch.no_grad():\n"
        "    for (batch,) in loader:\n"
        "        depth = model(batch)\n",
        # The script replaced the dataset's items with latents it encoded on the device.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "accelerator = Accelerator()\n"
        "class VideoDataset(Dataset):\n"
        "    def __init__(self, videos):\n"
        "        self.videos = videos\n"
        "    def __getitem__(self, index):\n"
        "        return self.videos[index]\n"
        "def encode(video):\n"
        "    video = video.to(accelerator.device)\n"
        "    return vae.encode(video).latent_dist\n"
        "train_dataset = VideoDataset(load_videos())\n"
        "train_dataset.videos = [encode(v) for v in train_dataset.videos]\n"
        "loader = DataLoader(train_dataset, batch_size=2, collate_fn=lambda xs: torch.cat([x.sample() for x in xs]))\n"
        "for latents in loader:\n"
        "    loss = model(latents).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
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
        # Handed to Accelerate, which copies with non_blocking=False unless its DataLoaderConfiguration says otherwise.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "train_dataloader = torch.utils.data.DataLoader(train_dataset, batch_size=16, num_workers=8)  # expect: LA201\n"
        "model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)\n"
        "for batch in train_dataloader:\n"
        "    loss = model(batch['pixel_values']).mean()\n"
        "    accelerator.backward(loss)\n"
        "    optimizer.step()\n",
    )

    confirmed_by = ("LA603",)
    # Assignments too: what the dataset helpers read (`train_dataset.videos = latents`), not checked.
    node_types = (cst.Call, *ASSIGNMENTS)
    needs_step = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if not isinstance(node, cst.Call) or not is_dataloader(node, ctx):
            return
        pin = loader_argument(node, "pin_memory", ctx)
        if pin is UNKNOWN or (pin is not None and constant(pin, ctx) is not False):
            return
        if (
            not step_loops(node, ctx)
            and not remote_step_loops(node, ctx)
            and not returned_step_uses(node, ctx)
            and lightning_loader_role(node, ctx) is None
        ):
            return
        if yields_python_data(node, ctx) or dataset_on_device(node, ctx):
            return  # nothing to pin, or tensors that pinning would refuse
        what = "without `pin_memory=True`" if pin is None else "with `pin_memory=False`"
        # Fixable where the keyword is absent or written as a keyword (not the 8th positional).
        fixable = pin is None or keyword_value(node, "pin_memory") is pin
        placement = accelerate_placement(node, ctx)
        if placement == "blocking":
            why = (
                "`accelerator.prepare` copies each batch to the device with `non_blocking=False` from pageable "
                "memory: pass `pin_memory=True` and make the Accelerator with "
                "`dataloader_config=DataLoaderConfiguration(non_blocking=True)` (`accelerate.utils`) so the "
                "copy overlaps with the GPU's work"
            )
        elif placement == "non-blocking":
            why = (
                "the Accelerator's `non_blocking=True` copy can only overlap with the GPU's work from pinned "
                "memory: pass `pin_memory=True`"
            )
        else:
            why = (
                "every batch is copied from pageable memory through a staging buffer, and the copy cannot "
                "overlap with the GPU's work"
            )
        yield Report(
            node,
            f"`{ctx.source(node.func)}(...)` feeds a CUDA step loop {what}: {why}",
            fix=Fix("pass `pin_memory=True`", ((node, with_keyword(node, "pin_memory", TRUE)),)) if fixable else None,
        )
