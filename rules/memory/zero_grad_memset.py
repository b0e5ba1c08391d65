from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Fix, Report, Rule, RuleContext, without_argument


def _is_false(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


class ZeroGradMemset(Rule):
    code = "LA404"
    name = "zero-grad-memset"
    summary = "`zero_grad(set_to_none=False)` once per step: a memset of every gradient."
    message = "`zero_grad(set_to_none=False)` writes zeros into every gradient tensor, once per step"
    suggestion = (
        "call `optimizer.zero_grad()` (since PyTorch 2.0 `set_to_none=True` is the default): gradients are "
        "dropped, and the next backward writes them fresh instead of adding into zeros"
    )
    what_it_flags = (
        "`optimizer.zero_grad(set_to_none=False)` and `model.zero_grad(set_to_none=False)` (or a positional "
        "`False`) in code that runs once per training step, on any device. `zero_grad()` and "
        "`zero_grad(set_to_none=True)` are not flagged, nor is a module that captures CUDA graphs "
        "(`torch.cuda.graph`, `make_graphed_callables`), where gradients must keep their addresses."
    )
    why_it_costs = (
        "With `set_to_none=False`, `zero_grad` runs `grad.zero_()` on every parameter's gradient: one fill "
        "kernel (or a foreach fill) over as many bytes as the model has parameters, every step. The next "
        "backward then reads those zeros and adds into them (`AccumulateGrad` accumulates in place) instead "
        "of simply storing the new gradient. With `set_to_none=True` (the default of "
        "`Optimizer.zero_grad` and `Module.zero_grad` since PyTorch 2.0) the gradients are released, no "
        "memset runs, and backward allocates each gradient when it first produces it; memory between "
        "`step()` and the next backward also drops by one model-sized buffer."
    )
    example = (
        "for x, y in loader:\n"
        "    optimizer.zero_grad(set_to_none=False)\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    optimizer.zero_grad()  # set_to_none=True\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    fix_safety = (
        "Fixed by `--fix` (safe) when the module never reads `.grad`: the argument is dropped and "
        "gradients are set to None, PyTorch's default since 2.0. Where the module reads `.grad` the fix is "
        "unsafe (`--unsafe-fixes`): code that reads `p.grad` between `zero_grad` and backward (or sums "
        "`p.grad` for parameters that get no gradient) must handle `None` once gradients are set to None."
    )
    valid = (
        # The default since PyTorch 2.0 sets gradients to None.
        "import torch\n"
        "for x, y in train_loader:\n"
        "    optimizer.zero_grad()\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, before training, costs nothing per step.
        "import torch\n"
        "optimizer.zero_grad(set_to_none=False)\n"
        "for x, y in train_loader:\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # CUDA graph capture needs gradients at fixed addresses.
        "import torch\n"
        "g = torch.cuda.CUDAGraph()\n"
        "for x, y in train_loader:\n"
        "    optimizer.zero_grad(set_to_none=False)\n"
        "    static_x.copy_(x)\n"
        "    g.replay()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "model = model.to('cuda')\n"
        "for epoch in range(10):\n"
        "    for x, y in train_loader:\n"
        "        optimizer.zero_grad(set_to_none=False)  # expect: LA404\n"
        "        loss = criterion(model(x.cuda()), y.cuda())\n"
        "        loss.backward()\n"
        "        optimizer.step()\n",
        # A step function called from the training loop, and a positional False.
        "import torch\n"
        "def train_step(model, optimizer, batch):\n"
        "    model.zero_grad(False)  # expect: LA404\n"
        "    loss = model(batch.cuda()).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "for batch in train_loader:\n"
        "    train_step(model, optimizer, batch)\n",
    )

    node_types = (cst.Call,)
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        if ctx.method_call(node, "zero_grad") is None:
            return
        for position, arg in enumerate(node.args):
            keyword = arg.keyword.value if arg.keyword is not None else None
            if (keyword == "set_to_none" or (keyword is None and position == 0 and not arg.star)) and _is_false(
                arg.value
            ):
                if _captures_cuda_graphs(ctx):
                    return
                # Gradients become None instead of zeros: safe unless the module reads `.grad` itself.
                reads_grads = _READS_GRAD.search(ctx.index.module.code) is not None
                fix = Fix(
                    "drop `set_to_none=False` (gradients are set to None)",
                    ((node, without_argument(node, position)),),
                    safe=not reads_grads,
                )
                yield Report(
                    node, f"`{ctx.source(node)}` writes zeros into every gradient tensor, once per step", fix=fix
                )
                return


_READS_GRAD = re.compile(r"\.grad\b")
_GRAPH_APIS = ("torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables", "torch.cuda.graphs.")


def _captures_cuda_graphs(ctx) -> bool:
    """Does the module capture CUDA graphs? Captured backward passes need gradients that keep their memory."""
    return any((ctx.qualified_name(site.call.func) or "").startswith(_GRAPH_APIS) for site in ctx.index.calls)
