from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext


class GcCollectInStep(Rule):
    code = "LA402"
    name = "gc-collect-in-step"
    summary = "`gc.collect()` once per step."
    message = "`gc.collect()` walks every object the Python process tracks, once per step"
    suggestion = (
        "remove it from the step: tensors are freed as soon as their last reference goes (reference "
        "counting); if reference cycles pile up, call it every N steps or once per epoch"
    )
    what_it_flags = (
        "`gc.collect()` (or `from gc import collect`) in code that runs once per training or evaluation "
        "step, on any device. Calls under a periodic guard, at epoch level, after the loop or in an "
        "exception handler are not flagged."
    )
    why_it_costs = (
        "A full collection (generation 2) traverses every container object the interpreter tracks, which in "
        "a training process means the model's modules and parameters, the dataset's Python objects, "
        "the autograd and framework bookkeeping: typically tens to hundreds of milliseconds, with the "
        "training loop stopped, and the GPU idles once the queued kernels are done. It frees nothing that "
        "reference counting had not already freed, except objects in reference cycles; PyTorch tensors "
        "are released by reference counting the moment the last reference goes (`del loss`, leaving "
        "scope), so per-step collections rarely free any GPU memory."
    )
    example = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    del loss\n"
        "    gc.collect()\n"
    )
    use_instead = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    del loss\n"
        "    if step % 1000 == 0:\n"
        "        gc.collect()  # only if cycles are known to accumulate\n"
    )
    fix_safety = (
        "No automatic fix, but removing the call does not change results: objects in cycles are still "
        "collected by the automatic generational collector."
    )
    valid = (
        # Once per epoch, and every 500 steps.
        "import gc\n"
        "import torch\n"
        "for epoch in range(epochs):\n"
        "    for step, (x, y) in enumerate(train_loader):\n"
        "        loss = model(x).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        if step % 500 == 0:\n"
        "            gc.collect()\n"
        "    gc.collect()\n",
    )
    invalid = (
        # A CPU script pays too: the collector runs on the host.
        "import gc\n"
        "import torch\n"
        "from gc import collect\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "for x, y in train_loader:\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    del loss\n"
        "    gc.collect()  # expect: LA402\n"
        "    collect()  # expect: LA402\n",
    )

    node_types = (cst.Call,)
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if (ctx.qualified_name(node.func) or "") == "gc.collect":
            yield Report(node)
