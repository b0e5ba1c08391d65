from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    Report,
    Rule,
    RuleContext,
    collective_of,
    is_computation,
    is_true,
    iter_subtree,
    keyword_value,
    terminal_name,
)
from loopaudit.rules.distributed._test_code import in_test_code

# Lightning's logging calls, and the hooks in which `on_step` defaults to True.
_LIGHTNING_LOG = ("log", "log_dict")
_ON_STEP_BY_DEFAULT = ("training_step",)
# What Accelerate and Fabric gather or reduce across ranks.
_FRAMEWORK_COLLECTIVES = ("gather", "gather_for_metrics", "reduce", "all_reduce", "all_gather")
_FRAMEWORK_OBJECTS = ("accelerator", "fabric")
# Turning a tensor into a Python number: the host waits for the collective's result.
_TO_NUMBER = ("item", "tolist", "cpu", "numpy")


def _framework_collective(expr: cst.BaseExpression) -> cst.Call | None:
    """`accelerator.gather(loss)` somewhere in a chain (`accelerator.gather(loss).mean()`)."""
    while isinstance(expr, (cst.Call, cst.Attribute, cst.Subscript)):
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            receiver = (terminal_name(expr.func.value) or "").lower()
            if expr.func.attr.value in _FRAMEWORK_COLLECTIVES and any(name in receiver for name in _FRAMEWORK_OBJECTS):
                return expr
        expr = expr.func if isinstance(expr, cst.Call) else expr.value
    return None


# Collectives that write their result into their first argument.
_IN_PLACE = ("all_reduce", "reduce", "broadcast")


def _written_names(call: cst.Call, name: str | None, ctx: RuleContext) -> set[str]:
    """The names that hold the collective's result: what its statement assigns, and for an in-place
    collective (`dist.all_reduce(t)`) the tensor it reduces."""
    names = set()
    if name in _IN_PLACE and call.args and isinstance(call.args[0].value, cst.Name):
        names.add(call.args[0].value.value)
    node: cst.CSTNode | None = call
    while node is not None and not isinstance(node, cst.BaseSmallStatement):
        node = ctx.parent(node)
    if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
        names |= _assigned(node)
    return names


def _assigned(statement: cst.Assign | cst.AugAssign | cst.AnnAssign) -> set[str]:
    """Every name in an assignment's targets (`d` of `d[k] = v` too: the container holds the value)."""
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    return {n.value for t in targets for n in iter_subtree(t) if isinstance(n, cst.Name)}


def _feeds_training(call: cst.Call, name: str | None, ctx: RuleContext) -> bool:
    """Does the collective's result flow, in the code after it, into a backward: part of the loss
    (SwAV's `q = distributed_sinkhorn(out)` in its swapped prediction) rather than a reported value?"""
    tainted = _written_names(call, name, ctx)
    if not tainted:
        return False
    function = ctx.frame.enclosing_function()
    code = function.node.body if function is not None else ctx.index.module
    after = False
    for node in iter_subtree(code):
        if node is call:
            after = True
            continue
        if not after:
            continue
        if isinstance(node, (cst.Assign, cst.AugAssign)):
            value = node.value
            if any(isinstance(n, cst.Name) and n.value in tainted for n in iter_subtree(value)):
                tainted |= _assigned(node)
        elif isinstance(node, cst.Call) and _trains(node, ctx):
            if any(isinstance(n, cst.Name) and n.value in tainted for n in iter_subtree(node)):
                return True
    return False


def _trains(call: cst.Call, ctx: RuleContext) -> bool:
    """`loss.backward()`, `accelerator.backward(loss)`, or a function of the project that runs one
    (timm's local `_backward(scaled_loss)`)."""
    if "backward" in (terminal_name(call.func) or ""):
        return True
    site = ctx.steps.call_site(call)
    return site is not None and any(ctx.steps.trains(function) for function in ctx.steps.resolve(site))


class CollectiveInStep(Rule):
    code = "LA703"
    name = "collective-in-step"
    summary = "A collective (`all_reduce`, `barrier`, `sync_dist=True`) every step to log a metric."
    message = "a collective runs on every step: every rank waits for the slowest, and the host for the device"
    suggestion = (
        "keep the metric on each rank and reduce it under the logging interval (`if step % log_interval == 0:`) "
        "or once at the epoch's end"
    )
    what_it_flags = (
        "On the per-step path (training or evaluation), a blocking collective from `torch.distributed` "
        "(`all_reduce`, `reduce`, `barrier`, `monitored_barrier`, `all_gather_object`, `gather_object`, "
        "`broadcast_object_list`), or a call of a helper that runs one for its caller (`reduce_dict(loss_dict)`, "
        "`reduce_tensor(loss)`, in any module: the finding goes on the step's call, where the fix goes); "
        "`accelerator.gather(...)` / `fabric.all_reduce(...)` turned into a Python number; Lightning's "
        "`self.log(..., sync_dist=True)` logged on every step (`on_step=True`, the default in `training_step`). "
        "Not flagged: under a logging guard or at the epoch's end; inside a forward, a loss or an autograd "
        "function (a collective the computation needs, such as DETR's `all_reduce(num_boxes)`); tensor "
        "`all_gather` (a contrastive loss's negatives); `async_op=True`."
    )
    why_it_costs = (
        "A collective returns only when every rank has reached it: each step then waits for the slowest rank, "
        "and the round trip over the interconnect sits on the critical path. On CUDA the host also waits for "
        "the device before it can read the reduced value, so the next step's kernels are not queued in time. "
        "For a number that is only logged, reducing once per logging interval costs the same information "
        "(timm and ms-swift moved exactly these reductions under their log interval)."
    )
    example = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    dist.all_reduce(loss, op=dist.ReduceOp.AVG)\n"
        "    losses.update(loss.item())\n"
    )
    use_instead = (
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % log_interval == 0:\n"
        "        reported = loss.detach().clone()\n"
        "        dist.all_reduce(reported, op=dist.ReduceOp.AVG)\n"
        "        print(step, reported.item())\n"
    )
    fix_safety = (
        "No automatic fix: where the reduction goes depends on what the code logs, and a value that every rank "
        "must agree on (a stopping test) needs its collective."
    )
    valid = (
        # Under the logging guard.
        "import torch\n"
        "import torch.distributed as dist\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 100 == 0:\n"
        "        dist.all_reduce(loss)\n"
        "        print(loss.item())\n",
        # The loss needs it: a criterion's forward normalizes by the boxes of all ranks (DETR).
        "import torch\n"
        "import torch.distributed as dist\n"
        "class SetCriterion(torch.nn.Module):\n"
        "    def forward(self, outputs, targets):\n"
        "        num_boxes = torch.as_tensor([len(targets)], device=outputs.device)\n"
        "        dist.all_reduce(num_boxes)\n"
        "        return outputs.sum() / num_boxes\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The reduced value is part of the loss (SwAV's Sinkhorn-Knopp codes).
        "import torch\n"
        "import torch.distributed as dist\n"
        "def distributed_sinkhorn(out):\n"
        "    Q = torch.exp(out).t()\n"
        "    dist.all_reduce(Q)\n"
        "    return Q.t()\n"
        "for x in loader:\n"
        "    out = model(x)\n"
        "    with torch.no_grad():\n"
        "        q = distributed_sinkhorn(out.detach())\n"
        "    loss = -torch.mean(torch.sum(q * torch.log_softmax(out, dim=1), dim=1))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Negatives gathered from every rank for a contrastive loss.
        "import torch\n"
        "import torch.distributed as dist\n"
        "for x in loader:\n"
        "    z = model(x)\n"
        "    gathered = [torch.zeros_like(z) for _ in range(world_size)]\n"
        "    dist.all_gather(gathered, z)\n"
        "    loss = contrastive(z, torch.cat(gathered))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Lightning reduces an epoch-level metric once, at the epoch's end.
        "import torch\n"
        "import lightning.pytorch as pl\n"
        "class Model(pl.LightningModule):\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        loss = self.net(batch).mean()\n"
        "        self.log('val_loss', loss, sync_dist=True)\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        loss = self.net(batch).mean()\n"
        "        self.log('train_loss', loss, on_step=False, on_epoch=True, sync_dist=True)\n"
        "        return loss\n",
    )
    invalid = (
        "import torch\n"
        "import torch.distributed as dist\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    dist.all_reduce(loss)  # expect: LA703\n"
        "    dist.barrier()  # expect: LA703\n"
        "    print(loss.item())\n",
        # A helper reduces for its caller: the step's call is reported (DETR's engine).
        "import torch\n"
        "import torch.distributed as dist\n"
        "def reduce_dict(values):\n"
        "    stacked = torch.stack(list(values.values()))\n"
        "    dist.all_reduce(stacked)\n"
        "    return dict(zip(values, stacked / dist.get_world_size()))\n"
        "for x, y in loader:\n"
        "    loss_dict = criterion(model(x), y)\n"
        "    loss = sum(loss_dict.values())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    reduced = reduce_dict(loss_dict)  # expect: LA703\n"
        "    metric_logger.update(**reduced)\n",
        # Accelerate gathers every rank's loss to print one number.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "for x, y in loader:\n"
        "    loss = model(x).sum()\n"
        "    accelerator.backward(loss)\n"
        "    optimizer.step()\n"
        "    avg = accelerator.gather(loss.detach()).mean().item()  # expect: LA703\n",
        # Lightning syncs a value logged on every training step.
        "import torch\n"
        "import lightning.pytorch as pl\n"
        "class Model(pl.LightningModule):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        loss = self.net(batch).mean()\n"
        "        self.log('train_loss', loss, sync_dist=True)  # expect: LA703\n"
        "        return loss\n"
        "    def validation_step(self, batch, batch_idx):\n"
        "        loss = self.net(batch).mean()\n"
        "        self.log('val_loss', loss, on_step=True, sync_dist=True)  # expect: LA703\n",
    )

    confirmed_by = ("LA606",)  # measured by `loopaudit run`, on any device (gloo on CPU)
    node_types = (cst.Call,)
    needs_cuda = False  # gloo's round trip costs a CPU job too

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        function = ctx.frame.enclosing_function()
        if is_computation(function) or in_test_code(ctx.frame):
            return
        if function is not None and ctx.frame.innermost_loop() is None and ctx.steps.has_step_loop(function):
            # Before or after the function's own step loop (LAVIS's barrier after its evaluation loop):
            # once per pass over the data, whatever loop calls the function.
            return
        name = collective_of(node, ctx.index)
        if name is not None:
            if is_true(keyword_value(node, "async_op")):
                return
            if function is not None and ctx.steps.communication_helper(function) is not None:
                return  # reported where the step calls the helper
            if _feeds_training(node, name, ctx):
                return
            yield Report(node, f"`{ctx.source(node)}` runs a blocking `{name}` across all ranks on every step")
            return
        receiver = ctx.method_call(node, *_TO_NUMBER)
        if receiver is not None:
            gathered = _framework_collective(receiver)
            if gathered is not None:
                yield Report(
                    gathered,
                    f"`{ctx.source(gathered)}` gathers from every rank on every step, and `.{cast(cst.Attribute, node.func).attr.value}()` "
                    "then waits for the result",
                )
            return
        if ctx.method_call(node, *_LIGHTNING_LOG) is not None:
            yield from _synced_log(node, function, ctx)
            return
        site = ctx.steps.call_site(node)
        if (
            site is not None
            and (name := ctx.steps.collective_called(site)) is not None
            and not _feeds_training(node, None, ctx)
        ):
            yield Report(
                node,
                f"`{ctx.source(node)}` runs a blocking `{name}` across all ranks on every step, to report a value",
            )


def _synced_log(call: cst.Call, function, ctx: RuleContext) -> Iterator[Report]:
    """`self.log(..., sync_dist=True)` logged on every step of a Lightning hook."""
    if terminal_name(cast(cst.Attribute, call.func).value) != "self" or not is_true(keyword_value(call, "sync_dist")):
        return
    on_step = keyword_value(call, "on_step")
    if on_step is None:
        if function is None or function.name not in _ON_STEP_BY_DEFAULT:
            return
    elif not is_true(on_step):
        return
    yield Report(call, "`sync_dist=True` on a value logged every step: Lightning all-reduces it on every step")
