from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    CPU_COUNT,
    UNKNOWN,
    Report,
    Rule,
    RuleContext,
    command_line_default,
    constant,
    counts_cpus,
)
from loopaudit.rules.data._loaders import (
    is_dataloader,
    iterated_every_epoch,
    lightning_loader_role,
    loader_argument,
)


class WorkersRespawnedEachEpoch(Rule):
    code = "LA204"
    name = "workers-respawned-each-epoch"
    summary = "`DataLoader(..., num_workers>0)` iterated every epoch without `persistent_workers=True`."
    message = (
        "this DataLoader starts its worker processes again at every epoch: the training loop waits while they start"
    )
    suggestion = "pass `persistent_workers=True` so the workers (and the dataset copies they hold) live across epochs"
    what_it_flags = (
        "A `DataLoader(...)`, on any device, with a `num_workers` that is a positive number (a literal, "
        "a name bound only to one, or a command-line option whose `add_argument(..., default=4)` the "
        "script declares, or whose default counts the CPUs, `mp.cpu_count() - 1`; also a helper's parameter that every caller, in this module or another of the "
        "scanned project, fills with such a value, and simple arithmetic on it such as "
        "`int(num_workers / 2)`; arguments gathered in a dict literal or `dict(...)` and passed as "
        '`**loader_args` are read too; so is a configuration key, `config["num_workers"]` or `cfg.num_workers`, '
        "that at least three in four of the repository's YAML files setting it set to a positive number), "
        "when `persistent_workers` is not passed or is `False`, and a step loop "
        "iterates the same loader object again and again: inside an epoch loop, or in a function called "
        "from one. Also the loaders a LightningModule or LightningDataModule returns from "
        "`train_dataloader()` / `val_dataloader()`. A loader built anew at each call (inside "
        "`validate()`) is not flagged: its workers could not be kept anyway. Values that cannot be "
        "read statically (`num_workers=cfg.workers` with no YAML file that sets it, `persistent_workers=args.persistent`) are not "
        "flagged."
    )
    why_it_costs = (
        "Each `for batch in loader:` calls `iter(loader)`. With `num_workers > 0` and "
        "`persistent_workers=False` (the default) that creates a new multi-process iterator: it starts "
        "`num_workers` processes, sends each a copy of the dataset (pickled under the `spawn` and "
        "`forkserver` start methods), runs `worker_init_fn`, and waits for the first `prefetch_factor` "
        "batches, and at the end of the epoch shuts all of them down. The training loop, on a GPU or a CPU, "
        "has nothing to do during that start-up, every epoch, and datasets that open files or build indexes lazily redo that work in "
        "every new worker. With `persistent_workers=True` the workers are started on the first epoch and "
        "reused."
    )
    example = (
        "train_loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=8, pin_memory=True)\n"
        "for epoch in range(epochs):\n"
        "    for images, labels in train_loader:\n"
        "        ...\n"
    )
    use_instead = (
        "train_loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=8, pin_memory=True,\n"
        "                          persistent_workers=True)\n"
    )
    fix_safety = (
        "Safe for ordinary datasets: shuffling and samplers still run anew each epoch "
        "(`DistributedSampler.set_epoch` included). Workers keep their state across epochs, so a dataset "
        "that changes between epochs in the main process (curriculum schedules, `dataset.epoch = e`) is not "
        "seen by persistent workers, and the workers keep holding their memory between epochs."
    )
    valid = (
        # A loader built inside test() and handed once to an evaluation function: each call makes a new
        # one, even though validation() itself also runs every epoch (with another loader).
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def validation(model, loader):\n"
        "    for x, y in loader:\n"
        "        out = model(x.cuda(non_blocking=True))\n"
        "def test(model):\n"
        "    for name in ('a', 'b'):\n"
        "        loader = DataLoader(datasets[name], num_workers=4, pin_memory=True)\n"
        "        validation(model, loader)\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = model(x.cuda(non_blocking=True)).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    validation(model, valid_loader)\n"
        "test(model)\n",
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, num_workers=8, pin_memory=True, persistent_workers=True)\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # Iterated once: nothing is started twice.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_set, batch_size=64, num_workers=8, pin_memory=True)\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # No workers, or a count read from the command line.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "a_loader = DataLoader(train_set, batch_size=64, num_workers=0, pin_memory=True)\n"
        "b_loader = DataLoader(train_set, batch_size=64, num_workers=args.workers, pin_memory=True)\n"
        "for epoch in range(10):\n"
        "    for x, y in zip(a_loader, b_loader):\n"
        "        loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # Built anew at each call of validate(): there are no workers to keep between calls.
        "import torch\n"
        "model = Net().cuda()\n"
        "def validate(dataset):\n"
        "    loader = torch.utils.data.DataLoader(dataset, num_workers=4, pin_memory=True)\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            model(x.cuda(non_blocking=True))\n"
        "for epoch in range(90):\n"
        "    validate(val_set)\n",
    )
    invalid = (
        # Loaders in a dict, walked phase by phase (wavenet_vocoder's `data_loaders.items()`).
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def train_loop(model, data_loaders, epochs):\n"
        "    for epoch in range(epochs):\n"
        "        for phase, data_loader in data_loaders.items():\n"
        "            for x in data_loader:\n"
        "                model(x.cuda(non_blocking=True)).sum().backward()\n"
        "data_loaders = {\n"
        "    'train': DataLoader(train_set, batch_size=8, num_workers=2, pin_memory=True),  # expect: LA204\n"
        "}\n"
        "train_loop(Net().cuda(), data_loaders, 100)\n",
        # Loaders kept in a dict and handed to a trainer class, which iterates one every epoch
        # (ParallelWaveGAN's `data_loader = {"train": ..., "dev": ...}`); the "dev" one is never iterated.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "class Trainer:\n"
        "    def __init__(self, data_loader, model):\n"
        "        self.data_loader = data_loader\n"
        "        self.model = model\n"
        "    def run(self, epochs):\n"
        "        for epoch in range(epochs):\n"
        "            for batch in self.data_loader['train']:\n"
        "                self.model(batch.cuda(non_blocking=True)).sum().backward()\n"
        "def main(dataset):\n"
        "    data_loader = {\n"
        "        'train': DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True),  # expect: LA204\n"
        "        'dev': DataLoader(dataset, batch_size=8, num_workers=4, pin_memory=True),\n"
        "    }\n"
        "    Trainer(data_loader=data_loader, model=torch.nn.Linear(2, 2).cuda()).run(100)\n",
        # Keyword arguments gathered with `dict(...)` (Pytorch-UNet).
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "loader_args = dict(batch_size=16, num_workers=4, pin_memory=True)\n"
        "train_loader = DataLoader(train_set, shuffle=True, **loader_args)  # expect: LA204\n"
        "for epoch in range(5):\n"
        "    for images, masks in train_loader:\n"
        "        loss = model(images.cuda(non_blocking=True)).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # The worker count reaches the loader through a helper's parameter (YOLOv3's _create_data_loader).
        "import argparse\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def create_loader(path, batch_size, n_cpu):\n"
        "    loader = DataLoader(Images(path), batch_size=batch_size, num_workers=n_cpu, pin_memory=True)  # expect: LA204\n"
        "    return loader\n"
        "def create_test_loader(path, batch_size, n_cpu):\n"
        "    return DataLoader(Images(path), batch_size=batch_size, num_workers=int(n_cpu / 2), pin_memory=True)  # expect: LA204\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--n_cpu', type=int, default=8)\n"
        "args = parser.parse_args()\n"
        "loader = create_loader('train.txt', 16, args.n_cpu)\n"
        "test_loader = create_test_loader('test.txt', 16, args.n_cpu)\n"
        "for epoch in range(100):\n"
        "    for imgs, targets in loader:\n"
        "        loss = model(imgs.cuda(non_blocking=True)).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    for imgs, targets in test_loader:\n"
        "        out = model(imgs.cuda(non_blocking=True))\n",
        # A loader made by a helper and handed back in a tuple (tacotron2's prepare_dataloaders).
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def prepare_dataloaders(hparams):\n"
        "    train_loader = DataLoader(trainset, num_workers=2, shuffle=True, pin_memory=True)  # expect: LA204\n"
        "    return train_loader, valset\n"
        "train_loader, valset = prepare_dataloaders(hparams)\n"
        "for epoch in range(100):\n"
        "    for x, y in train_loader:\n"
        "        loss = model(x.cuda(non_blocking=True)).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # An endless generator over a loader starts its workers again at every pass.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "def cycle(dl):\n"
        "    while True:\n"
        "        for data in dl:\n"
        "            yield data\n"
        "dl = cycle(DataLoader(dataset, batch_size=32, shuffle=True, num_workers=4, pin_memory=True))  # expect: LA204\n"
        "for step in range(100000):\n"
        "    data = next(dl).cuda(non_blocking=True)\n"
        "    loss = model(data).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=8, pin_memory=True)  # expect: LA204\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # The loader is iterated in a function called once per epoch.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "WORKERS = 4\n"
        "def validate(model, loader):\n"
        "    with torch.no_grad():\n"
        "        for x, y in loader:\n"
        "            out = model(x.cuda(non_blocking=True))\n"
        "val_loader = DataLoader(val_set, batch_size=256, num_workers=WORKERS, pin_memory=True,  # expect: LA204\n"
        "                        persistent_workers=False)\n"
        "for epoch in range(10):\n"
        "    train_one_epoch(model)\n"
        "    validate(model, val_loader)\n",
        # Keyword arguments gathered in a dict, the pytorch/examples way.
        "import torch\n"
        "use_cuda = torch.cuda.is_available()\n"
        "train_kwargs = {'batch_size': 64}\n"
        "cuda_kwargs = {'num_workers': 1, 'pin_memory': True, 'shuffle': True} if use_cuda else {}\n"
        "train_kwargs.update(cuda_kwargs)\n"
        "train_loader = torch.utils.data.DataLoader(dataset, **train_kwargs)  # expect: LA204\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # Lightning iterates the loaders its hooks return: the training one at every epoch.
        "import lightning as L\n"
        "from torch.utils.data import DataLoader\n"
        "class Data(L.LightningDataModule):\n"
        "    def train_dataloader(self):\n"
        "        return DataLoader(self.train_set, batch_size=64, shuffle=True, num_workers=8, pin_memory=True)  # expect: LA204\n"
        "class Model(L.LightningModule):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        return self.loss(batch)\n"
        "L.Trainer(accelerator='gpu').fit(Model(), Data())\n",
        # The worker count comes from the command line, whose declared default is 4.
        "import argparse\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('-j', '--workers', type=int, default=4)\n"
        "args = parser.parse_args()\n"
        "loader = torch.utils.data.DataLoader(dataset, num_workers=args.workers, pin_memory=True)  # expect: LA204\n"
        "model = Net().cuda()\n"
        "for epoch in range(90):\n"
        "    for x, y in loader:\n"
        "        loss = model(x.cuda(non_blocking=True)).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # A progress bar on the first rank only: the loop walks `tqdm(loader)` or the loader itself.
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from tqdm import tqdm\n"
        "train_loader = DataLoader(train_set, batch_size=8, num_workers=2, pin_memory=True)  # expect: LA204\n"
        "model = Net().cuda()\n"
        "for epoch in range(100):\n"
        "    bar = tqdm(train_loader) if local_rank == 0 else train_loader\n"
        "    for x, c in bar:\n"
        "        model(x.cuda(non_blocking=True)).mean().backward()\n"
        "        optimizer.step()\n",
        # A script that trains on the CPU unless told otherwise, with one worker per CPU but one.
        "import argparse\n"
        "import multiprocessing as mp\n"
        "import torch\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--device', type=str, default='cpu')\n"
        "parser.add_argument('--num-workers', type=int, default=mp.cpu_count() - 1)\n"
        "args = parser.parse_args()\n"
        "train_loader = torch.utils.data.DataLoader(train_set, batch_size=128, num_workers=args.num_workers)  # expect: LA204\n"
        "model = VQVAE().to(args.device)\n"
        "for epoch in range(100):\n"
        "    for images, _ in train_loader:\n"
        "        model(images.to(args.device)).mean().backward()\n"
        "        optimizer.step()\n",
    )

    node_types = (cst.Call,)
    needs_step = False
    needs_cuda = False  # starting the workers again stalls a CPU training loop as much as a GPU one

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if not is_dataloader(node, ctx):
            return
        workers = loader_argument(node, "num_workers", ctx)
        if workers is None or workers is UNKNOWN:
            return
        count = constant(workers, ctx)
        from_command_line = count is UNKNOWN
        if from_command_line:
            count = command_line_default(workers, ctx)  # `num_workers=args.workers`, default 4
        # `num_workers=cpu_count()`, or an option whose default counts the CPUs
        per_cpu = count == CPU_COUNT or (type(count) is not int and counts_cpus(workers, ctx))
        if not per_cpu and (type(count) is not int or count <= 0):
            return
        persistent = loader_argument(node, "persistent_workers", ctx)
        if persistent is UNKNOWN or (persistent is not None and constant(persistent, ctx) is not False):
            return
        if lightning_loader_role(node, ctx) is None and not iterated_every_epoch(node, ctx):
            return
        if per_cpu or from_command_line:
            workers_text = ctx.source(workers)
            how_many = "one per CPU" if per_cpu else f"{count} by default"
            yield Report(
                node,
                f"`{ctx.source(node.func)}(..., num_workers={workers_text})` is iterated every epoch without "
                f"`persistent_workers=True`: its worker processes ({how_many}) are started again at "
                f"each epoch; pass `persistent_workers={'True' if per_cpu else workers_text + ' > 0'}`",
            )
            return
        yield Report(
            node,
            f"`{ctx.source(node.func)}(..., num_workers={count})` is iterated every epoch without "
            f"`persistent_workers=True`: its {count} worker process{'es are' if count != 1 else ' is'} started again at each epoch",
        )
