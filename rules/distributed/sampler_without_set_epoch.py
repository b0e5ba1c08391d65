from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext, constant, keyword_value, terminal_name
from loopaudit.rules.data._loaders import is_dataloader, iterated_every_epoch
from loopaudit.rules.distributed._test_code import in_test_code

_SAMPLERS = (
    "torch.utils.data.DistributedSampler",
    "torch.utils.data.distributed.DistributedSampler",
)
# Frameworks that give the samplers their epoch themselves (Lightning calls `set_epoch` on the
# loader's sampler before each epoch; Accelerate's prepared loaders do the same).
_FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate")


def _loader_fed(sampler: cst.Call, ctx: RuleContext) -> list[cst.Call]:
    """The `DataLoader(...)` calls this sampler is handed to, inline or through the name it is bound to
    (`sampler = DistributedSampler(ds) if distributed else None` too). A DataLoader subclass that hands
    it to `super().__init__` stands for each construction of that class in the module."""
    value: cst.BaseExpression = sampler
    parent = ctx.parent(value)
    while isinstance(parent, cst.IfExp):
        value, parent = parent, ctx.parent(parent)
    fed: list[cst.Call] = []
    if isinstance(parent, cst.Arg):
        call = ctx.parent(parent)
        if isinstance(call, cst.Call):
            fed.append(call)
    elif (bound := ctx.steps.bound_name(value)) is not None:
        name, scope = bound
        for site in ctx.index.calls:
            for arg in site.call.args:
                keyword = arg.keyword.value if arg.keyword is not None else None
                if keyword in ("sampler", "batch_sampler") and ctx.steps.refers_to(arg.value, name, scope, site.scope):
                    fed.append(site.call)
    loaders = []
    for call in fed:
        if is_dataloader(call, ctx):
            loaders.append(call)
        elif _initializes_loader(call, ctx):
            owner = ctx.frame.enclosing_class()
            loaders += [
                site.call
                for site in ctx.index.calls
                if owner is not None and isinstance(site.call.func, cst.Name) and site.call.func.value == owner.name
            ]
    return loaders


def _initializes_loader(call: cst.Call, ctx: RuleContext) -> bool:
    """`super().__init__(dataset, sampler=sampler)` in a subclass of DataLoader (pytorch-distributed-
    example's `MNISTDataLoader`)."""
    func = call.func
    if not (
        isinstance(func, cst.Attribute)
        and func.attr.value == "__init__"
        and isinstance(func.value, cst.Call)
        and terminal_name(func.value.func) == "super"
    ):
        return False
    owner = ctx.frame.enclosing_class()
    return owner is not None and any(
        (ctx.qualified_name(base) or terminal_name(base) or "").endswith("DataLoader") for base in owner.bases
    )


class SamplerWithoutSetEpoch(Rule):
    code = "LA705"
    name = "sampler-without-set-epoch"
    summary = "A shuffling `DistributedSampler` never given `set_epoch(epoch)`: the same order every epoch."
    message = "this `DistributedSampler` shuffles, but nothing calls `set_epoch`: every epoch sees the same order"
    suggestion = "call `sampler.set_epoch(epoch)` at the start of each epoch, before iterating the loader"
    what_it_flags = (
        "A `DistributedSampler` (shuffling: `shuffle` not `False`) handed to a `DataLoader` that a training "
        "loop iterates again and again (once per epoch, in this module or in one it is handed to), in a "
        "project where no module calls `.set_epoch(...)` on anything. Lightning and Accelerate set the epoch "
        "themselves, so modules that use them are left alone."
    )
    why_it_costs = (
        "`DistributedSampler` seeds its shuffle with `seed + epoch`, and `epoch` stays 0 until `set_epoch` "
        "changes it: every epoch then walks the data in the same order, on every rank. It costs no time, "
        "but the model sees one fixed order, which usually trains worse (PyTorch's documentation calls the "
        "call necessary). A correctness bug, reported here because it lives in the same loop."
    )
    example = (
        "sampler = DistributedSampler(train_set)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler)\n"
        "for epoch in range(epochs):\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    )
    use_instead = (
        "sampler = DistributedSampler(train_set)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler)\n"
        "for epoch in range(epochs):\n"
        "    sampler.set_epoch(epoch)\n"
        "    for x, y in loader:\n"
        "        train_step(x, y)\n"
    )
    fix_safety = (
        "No automatic fix: the call goes at the top of the epoch loop, which may be in another module than the sampler."
    )
    valid = (
        "import torch\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "sampler = DistributedSampler(train_set)\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler)\n"
        "for epoch in range(epochs):\n"
        "    sampler.set_epoch(epoch)\n"
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # An evaluation loader: its order does not matter.
        "import torch\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "val_loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False))\n"
        "for epoch in range(epochs):\n"
        "    with torch.no_grad():\n"
        "        for x, y in val_loader:\n"
        "            accuracy.update(model(x), y)\n",
        # Iterated once: there is no second epoch to repeat.
        "import torch\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "loader = DataLoader(train_set, sampler=DistributedSampler(train_set))\n"
        "for x, y in loader:\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "from torch.utils.data.distributed import DistributedSampler\n"
        "sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank)  # expect: LA705\n"
        "loader = DataLoader(train_set, batch_size=64, sampler=sampler)\n"
        "for epoch in range(epochs):\n"
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # Chosen when distributed (the pytorch/examples shape, without its `set_epoch`).
        "import torch\n"
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "train_sampler = DistributedSampler(train_set) if args.distributed else None  # expect: LA705\n"
        "loader = DataLoader(train_set, shuffle=(train_sampler is None), sampler=train_sampler)\n"
        "for epoch in range(epochs):\n"
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # A DataLoader subclass hands it on (pytorch-distributed-example's MNISTDataLoader).
        "import torch\n"
        "from torch.utils import data\n"
        "class MNISTDataLoader(data.DataLoader):\n"
        "    def __init__(self, dataset, batch_size, train=True):\n"
        "        sampler = data.DistributedSampler(dataset) if train else None  # expect: LA705\n"
        "        super().__init__(dataset, batch_size=batch_size, shuffle=sampler is None, sampler=sampler)\n"
        "def fit(loader, epochs):\n"
        "    for epoch in range(epochs):\n"
        "        for x, y in loader:\n"
        "            loss = model(x).sum()\n"
        "            loss.backward()\n"
        "            optimizer.step()\n"
        "fit(MNISTDataLoader(train_set, 64), 20)\n",
        # The loader is handed to a function that trains on it, once per epoch.
        "import torch\n"
        "import torch.utils.data as data\n"
        "def train(loader):\n"
        "    for x, y in loader:\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "loader = data.DataLoader(train_set, sampler=data.DistributedSampler(train_set, shuffle=True))  # expect: LA705\n"
        "for epoch in range(epochs):\n"
        "    train(loader)\n",
    )

    node_types = (cst.Call,)
    needs_step = False
    needs_cuda = False  # the order is the same on any device
    text_hint = "DistributedSampler"

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if ctx.qualified_name(node.func) not in _SAMPLERS or in_test_code(ctx.frame):
            return
        shuffle = keyword_value(node, "shuffle")
        if shuffle is not None and constant(shuffle, ctx) is not True:
            return  # `shuffle=False`, or the caller's choice
        if ctx.steps.sets_sampler_epoch() or any(ctx.index.imports.imports_module(name) for name in _FRAMEWORKS):
            return
        if not any(iterated_every_epoch(loader, ctx, training_only=True) for loader in _loader_fed(node, ctx)):
            return
        yield Report(node)
