from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from loopaudit.rule_api import UNKNOWN, Report, Rule, RuleContext, command_line_default, constant
from loopaudit.rules.data._datasets import (
    ASSIGNMENTS,
    dataset_in_memory,
    dataset_on_device,
)
from loopaudit.rules.data._loaders import (
    enclosing_function_name,
    is_dataloader,
    lightning_loader_role,
    loader_argument,
    loop_trains,
    remote_step_loops,
    returned_step_uses,
    step_loops,
)

_TRAIN_NAME = re.compile(r"(?i)train")
_IN_MEMORY_DATASETS = frozenset({"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"})


def _bound_name(call: cst.Call, ctx) -> str:
    bound = ctx.index.bound_names.get(id(call))
    return bound[0] if bound else ""


def _in_memory_dataset(call: cst.Call, ctx) -> bool:
    """`DataLoader(TensorDataset(x, y))`: indexing tensors already in memory, where workers buy little."""
    dataset = next((a.value for a in call.args if a.keyword is None or a.keyword.value == "dataset"), None)
    if isinstance(dataset, cst.Name):
        found = ctx.scope.lookup(dataset.value)
        values = [b.value for b in found[0] if b.kind == "value"] if found else []
        dataset = values[0] if len(values) == 1 else dataset
    return isinstance(dataset, cst.Call) and (ctx.qualified_name(dataset.func) or "") in _IN_MEMORY_DATASETS


def is_training_loader(call: cst.Call, ctx) -> bool:
    """Iterated by a step loop that trains, or by a step loop in a function named like `train`, or bound
    to a name like `train_loader`."""
    if lightning_loader_role(call, ctx) == "train":
        return True
    loops = step_loops(call, ctx)
    remote = remote_step_loops(call, ctx)  # handed to a training loop in another module
    returned = returned_step_uses(call, ctx)  # returned, then iterated elsewhere
    if not loops and not remote and not returned:
        return False
    if any(loop_trains(loop, ctx) for loop in loops) or any(t for _, t in remote) or any(t for t, _ in returned):
        return True
    if any(_TRAIN_NAME.search(enclosing_function_name(loop)) for loop in loops):
        return True
    return bool(_TRAIN_NAME.search(_bound_name(call, ctx)))


class TrainingLoaderWithoutWorkers(Rule):
    code = "LA203"
    name = "training-loader-without-workers"
    summary = "A training `DataLoader(...)` with `num_workers` missing or 0: batches load in the training process."
    message = "this training DataLoader loads every batch in the training process: the GPU waits while Python decodes and collates"
    suggestion = (
        "pass `num_workers=` (start with the number of CPU cores per GPU, e.g. 4 to 8) so worker processes "
        "prepare the next batches while the GPU trains"
    )
    what_it_flags = (
        "A `DataLoader(...)` of a CUDA script that feeds a training loop (a step loop that calls "
        "`backward()` or `optimizer.step()`, directly or through a function it calls; or a step loop in a "
        "function named like `train`; or a loader bound to a name like `train_loader`), when "
        "`num_workers` is not passed or is 0 (also a command-line option whose declared default is 0). "
        "The loader a LightningModule or LightningDataModule returns from `train_dataloader()` counts. "
        "Values that cannot be read statically (`num_workers=cfg.workers`) are not flagged, nor are "
        "loaders over a `TensorDataset`, whose samples are slices of tensors already in memory, or over a "
        "dataset of the module held in memory the same way: its `__getitem__` only indexes what `__init__` "
        "prepared (no file opened, read or decoded, no transform applied; calls limited to builtins, "
        "string and container methods, random choices and tensor conversions), and the `collate_fn`, if "
        "any, only stacks. Nor are loaders over tensors already on the GPU (`TensorDataset(x.to(device))`, "
        "items the script replaced with what it encoded on the device), which worker processes cannot use."
    )
    why_it_costs = (
        "With `num_workers=0` (the default) the DataLoader fetches, decodes, augments and collates each "
        "batch in the main process, on the same Python thread that launches the GPU's kernels. While it "
        "does, no new work is queued: once the GPU has finished the step it sits idle until the next batch "
        "is ready, so loading time adds to step time instead of overlapping with it. With "
        "`num_workers > 0` PyTorch starts that many worker processes, each preparing whole batches ahead "
        "of time (`prefetch_factor` batches per worker, 2 by default), and the training loop only "
        "receives finished batches."
    )
    example = (
        "train_loader = DataLoader(train_set, batch_size=128, shuffle=True)\n"
        "for images, labels in train_loader:\n"
        "    loss = criterion(model(images.cuda()), labels.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "train_loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=8,\n"
        "                          pin_memory=True, persistent_workers=True)\n"
    )
    fix_safety = (
        "Usually safe, but workers are separate processes: the dataset must be picklable (no lambdas or "
        "open handles in it) under the `spawn` start method, augmentations that draw from NumPy's global "
        "random generator need per-worker seeding (`worker_init_fn`), and on "
        'Windows and macOS the script\'s entry point must be guarded by `if __name__ == "__main__":`.'
    )
    valid = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=8, pin_memory=True)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Read from the command line; and an evaluation loader does not train.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, num_workers=args.workers, pin_memory=True)\n"
        "val_loader = DataLoader(val_set, batch_size=256, pin_memory=True)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "with torch.no_grad():\n"
        "    for x, y in val_loader:\n"
        "        out = model(x.cuda(non_blocking=True))\n",
        # Tensors already in memory: a worker would only slice them.
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "dataset = TensorDataset(features, targets)\n"
        "loader = DataLoader(dataset, batch_size=64, shuffle=True, pin_memory=True)\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A dataset of the script's own, transformed once in __init__: __getitem__ only indexes.
        "import torch\n"
        "from PIL import Image\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class DreamBoothDataset(Dataset):\n"
        "    def __init__(self, paths, prompt, transform):\n"
        "        self.pixel_values = [transform(Image.open(p).convert('RGB')) for p in paths]\n"
        "        self.prompt = prompt\n"
        "    def __len__(self):\n"
        "        return len(self.pixel_values)\n"
        "    def __getitem__(self, index):\n"
        "        example = {}\n"
        "        example['instance_images'] = self.pixel_values[index % len(self.pixel_values)]\n"
        "        example['instance_prompt'] = self.prompt\n"
        "        return example\n"
        "def collate_fn(examples):\n"
        "    pixel_values = torch.stack([e['instance_images'] for e in examples])\n"
        "    return {'pixel_values': pixel_values.to(memory_format=torch.contiguous_format).float()}\n"
        "train_dataset = DreamBoothDataset(paths, 'a photo', transform)\n"
        "train_loader = DataLoader(train_dataset, batch_size=4, shuffle=True, collate_fn=collate_fn, pin_memory=True)\n"
        "for batch in train_loader:\n"
        "    loss = model(batch['pixel_values'].cuda(non_blocking=True)).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Items the script replaced with latents it encoded on the GPU: worker processes could not use them.
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class LatentDataset(Dataset):\n"
        "    def __init__(self, clips, captions):\n"
        "        self.clips, self.captions = clips, captions\n"
        "    def __len__(self):\n"
        "        return len(self.clips)\n"
        "    def __getitem__(self, index):\n"
        "        return {'latents': self.clips[index], 'caption': self.captions[index]}\n"
        "train_dataset = LatentDataset(read_clips(root), read_captions(root))\n"
        "encoded = [None] * len(train_dataset)\n"
        "for i, clip in enumerate(train_dataset.clips):\n"
        "    encoded[i] = vae.encode(clip.cuda()).latent_dist\n"
        "train_dataset.clips = encoded\n"
        "train_loader = DataLoader(train_dataset, batch_size=2, shuffle=True, collate_fn=sample_latents)\n"
        "for batch in train_loader:\n"
        "    loss = model(batch['latents'], batch['caption']).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, shuffle=True, pin_memory=True)  # expect: LA203\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # `num_workers=0` spelled out, and training inside a function the loop calls.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def train_step(x, y):\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "loader = DataLoader(images, batch_size=32, num_workers=0, pin_memory=True)  # expect: LA203\n"
        "for x, y in loader:\n"
        "    train_step(x, y)\n",
        # Lightning iterates the loaders its hooks return: the training one at every epoch.
        "import lightning as L\n"
        "from torch.utils.data import DataLoader\n"
        "class Data(L.LightningDataModule):\n"
        "    def train_dataloader(self):\n"
        "        return DataLoader(self.train_set, batch_size=64, shuffle=True, pin_memory=True)  # expect: LA203\n"
        "class Model(L.LightningModule):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.loss(batch)\n"
        "L.Trainer(accelerator='gpu').fit(Model(), Data())\n",
        # Prepared in __init__, but __getitem__ still opens and transforms the class images.
        "import torch\n"
        "from PIL import Image\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class DreamBoothDataset(Dataset):\n"
        "    def __init__(self, paths, class_paths, transform):\n"
        "        self.pixel_values = [transform(Image.open(p)) for p in paths]\n"
        "        self.class_paths = class_paths\n"
        "        self.transform = transform\n"
        "    def __getitem__(self, index):\n"
        "        example = {'instance_images': self.pixel_values[index % len(self.pixel_values)]}\n"
        "        class_image = Image.open(self.class_paths[index % len(self.class_paths)])\n"
        "        example['class_images'] = self.transform(class_image)\n"
        "        return example\n"
        "train_dataset = DreamBoothDataset(paths, class_paths, transform)\n"
        "train_loader = DataLoader(train_dataset, batch_size=4, shuffle=True, pin_memory=True)  # expect: LA203\n"
        "for batch in train_loader:\n"
        "    loss = model(batch['instance_images'].cuda(non_blocking=True)).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The worker count comes from the command line, whose declared default is 0.
        "import argparse\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--workers', type=int, default=0)\n"
        "args = parser.parse_args()\n"
        "train_loader = torch.utils.data.DataLoader(dataset, num_workers=args.workers, pin_memory=True)  # expect: LA203\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )

    confirmed_by = ("LA602",)
    # Assignments too: what the dataset helpers read (`train_dataset.videos = latents`), not checked.
    node_types = (cst.Call, *ASSIGNMENTS)
    needs_step = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if not isinstance(node, cst.Call) or not is_dataloader(node, ctx):
            return
        workers = loader_argument(node, "num_workers", ctx)
        if workers is UNKNOWN:
            return
        if workers is not None:
            count = constant(workers, ctx)
            if count is UNKNOWN:
                count = command_line_default(workers, ctx)  # `num_workers=args.workers`, default 0
            if count != 0:
                return
        if _in_memory_dataset(node, ctx) or not is_training_loader(node, ctx):
            return
        if dataset_in_memory(node, ctx) or dataset_on_device(node, ctx):
            return  # nothing to load, or tensors workers cannot share
        if workers is None:
            what = "without `num_workers`"
        elif isinstance(workers, cst.Integer) or constant(workers, ctx) == 0:
            what = "with `num_workers=0`"
        else:
            what = f"with `num_workers={ctx.source(workers)}`, 0 by default"
        yield Report(
            node,
            f"`{ctx.source(node.func)}(...)` feeds a training loop {what}: every batch is loaded in the "
            "training process, and the GPU waits while it is",
        )
