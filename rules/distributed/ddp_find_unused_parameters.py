from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import DDP_CLASSES, Report, Rule, RuleContext, is_true, keyword_value
from loopaudit.rules.distributed._test_code import in_test_code

# Where `find_unused_parameters=True` is written: DDP itself (DDP_CLASSES), and the wrappers that pass it on.
_PASSED_ON = (
    "lightning.pytorch.strategies.DDPStrategy",
    "lightning.pytorch.strategies.ddp.DDPStrategy",
    "lightning.fabric.strategies.DDPStrategy",
    "pytorch_lightning.strategies.DDPStrategy",
    "pytorch_lightning.strategies.ddp.DDPStrategy",
    "accelerate.DistributedDataParallelKwargs",
    "accelerate.utils.DistributedDataParallelKwargs",
    "accelerate.utils.dataclasses.DistributedDataParallelKwargs",
)
_TRAINERS = (
    "lightning.pytorch.Trainer",
    "lightning.Trainer",
    "pytorch_lightning.Trainer",
    "lightning.pytorch.trainer.trainer.Trainer",
)
_STRATEGY = "ddp_find_unused_parameters_true"


class DdpFindUnusedParameters(Rule):
    code = "LA701"
    name = "ddp-find-unused-parameters"
    summary = "DDP with `find_unused_parameters=True`: an extra walk of the autograd graph every step."
    message = "`find_unused_parameters=True` makes DDP walk the autograd graph after every forward pass"
    suggestion = (
        "drop `find_unused_parameters=True` if every parameter gets a gradient each step; if the same ones are "
        "unused every step, keep it off and pass `static_graph=True`; else make the unused branch take part "
        "(or freeze what it holds)"
    )
    what_it_flags = (
        "`DistributedDataParallel(model, ..., find_unused_parameters=True)` (however `torch.nn.parallel` is "
        "imported), and the same setting passed on by the wrappers: Lightning's `DDPStrategy(find_unused_parameters"
        '=True)` or `Trainer(strategy="ddp_find_unused_parameters_true")`, Accelerate\'s '
        "`DistributedDataParallelKwargs(find_unused_parameters=True)`. Only a literal `True` is flagged (a value "
        "read from a configuration is the user's switch), and not with `static_graph=True`, which replaces the "
        "per-step search."
    )
    why_it_costs = (
        "With `find_unused_parameters=True`, after every forward pass DDP traverses the autograd graph from the "
        "outputs to find the parameters that will get no gradient, so that their buckets can be marked ready "
        "(torch's reducer warns that this is an extra traversal every iteration). On a large model that is "
        "milliseconds of Python-free but serial host work per step, before the backward can start reducing; "
        "and when every parameter is in fact used, it buys nothing. `static_graph=True` finds the unused set "
        "once and reuses it."
    )
    example = (
        "model = DistributedDataParallel(model.to(rank), device_ids=[rank], find_unused_parameters=True)\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x.to(rank)), y.to(rank))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "# every parameter is used: the default\n"
        "model = DistributedDataParallel(model.to(rank), device_ids=[rank])\n"
        "# the same parameters are unused every step: found once\n"
        "model = DistributedDataParallel(model.to(rank), device_ids=[rank], static_graph=True)\n"
    )
    fix_safety = (
        "No automatic fix: if some parameter really gets no gradient, DDP without the flag stops with "
        '"Expected to have finished reduction in the prior iteration"; only a run shows which case it is.'
    )
    valid = (
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model.cuda(), device_ids=[rank])\n",
        # Found once, not every step.
        "import torch\n"
        "model = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True, static_graph=True)\n",
        # The user's configuration decides.
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "model = DistributedDataParallel(model, find_unused_parameters=args.find_unused)\n",
        # Some other class of the same name.
        "from mylib import DistributedDataParallel\n"
        "model = DistributedDataParallel(model, find_unused_parameters=True)\n",
        # A test of a model with unused parameters sets it on purpose.
        "import torch\n"
        "class TestUnusedParameters(TestCase):\n"
        "    def test_dynamic_unused(self):\n"
        "        ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)\n",
    )
    invalid = (
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model.cuda(), device_ids=[rank], find_unused_parameters=True)  # expect: LA701\n",
        "import torch\n"
        "import torch.nn as nn\n"
        "model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)  # expect: LA701\n",
        "import torch\n"
        "import lightning.pytorch as pl\n"
        "from lightning.pytorch.strategies import DDPStrategy\n"
        "trainer = pl.Trainer(strategy=DDPStrategy(find_unused_parameters=True))  # expect: LA701\n"
        'other = pl.Trainer(strategy="ddp_find_unused_parameters_true")  # expect: LA701\n',
        "import torch\n"
        "from accelerate import Accelerator, DistributedDataParallelKwargs\n"
        "kwargs = DistributedDataParallelKwargs(find_unused_parameters=True)  # expect: LA701\n"
        "accelerator = Accelerator(kwargs_handlers=[kwargs])\n",
    )

    node_types = (cst.Call,)
    needs_step = False
    needs_cuda = False
    text_hint = "find_unused_parameters"

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        name = ctx.qualified_name(node.func)
        if name is None or in_test_code(ctx.frame):
            return
        if name in _TRAINERS:
            strategy = keyword_value(node, "strategy")
            if isinstance(strategy, cst.SimpleString) and strategy.evaluated_value == _STRATEGY:
                yield Report(
                    node, f'`strategy="{_STRATEGY}"` makes DDP walk the autograd graph after every forward pass'
                )
            return
        if name not in DDP_CLASSES and name not in _PASSED_ON:
            return
        if not is_true(keyword_value(node, "find_unused_parameters")) or is_true(keyword_value(node, "static_graph")):
            return
        yield Report(node)
