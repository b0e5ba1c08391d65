from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    UNKNOWN,
    FrameKind,
    LoopInfo,
    Report,
    Rule,
    RuleContext,
    is_training_call,
    iter_subtree,
    runs_a_model,
    setting_value,
    terminal_name,
)
from loopaudit.rules.distributed._test_code import in_test_code

# Context managers that skip DDP's gradient all-reduce for what runs inside them: DDP's own, and the
# wrappers' (Accelerate's `accumulate` decides per step; Fabric's `no_backward_sync`).
_SKIPS_SYNC = ("no_sync", "accumulate", "no_backward_sync")


def _backward(call: cst.Call) -> bool:
    """`loss.backward()`, `scaler.scale(loss).backward()`, `accelerator.backward(loss)`."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value != "backward":
        return False
    if call.args:
        # `x.backward(loss)`: Accelerate's accelerator, or a DeepSpeed engine (which handles it)
        return "accelerator" in (terminal_name(func.value) or "").lower()
    return True


def _optimizer_step(call: cst.Call, ctx: RuleContext) -> bool:
    """`optimizer.step()`, `scaler.step(optimizer)`, `self.optimizer.step()`: a training call that steps."""
    return _steps_anything(call) and is_training_call(call, ctx.index.imports)


def _every_iteration(frame, loop: LoopInfo) -> bool:
    """Does code in `frame` run on every iteration of `loop`, not under a guard or rare branch?"""
    while frame is not None and frame is not loop.frame:
        if frame.kind in (FrameKind.PERIODIC, FrameKind.RARE, FrameKind.DEFERRED):
            return False
        frame = frame.parent
    return frame is loop.frame


def _guards(frame, loop: LoopInfo) -> list[cst.CSTNode]:
    """The periodic guards (`if (i + 1) % k == 0:`) between `frame` and the body of `loop`."""
    found = []
    while frame is not None and frame is not loop.frame:
        if frame.kind is FrameKind.PERIODIC and frame.node is not None:
            found.append(frame.node)
        frame = frame.parent
    return found


def _divisor(node: cst.CSTNode) -> cst.BaseExpression | None:
    """`k` in a test `(i + 1) % k == 0` (in an `if`, or an expression passed as an argument)."""
    test = node.test if isinstance(node, cst.If) else node
    for inner in iter_subtree(test):
        if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Modulo):
            return inner.right
    return None


def _count(loop: LoopInfo) -> cst.BaseExpression | None:
    """`k` in `for micro_step in range(k):`."""
    node = loop.node
    if isinstance(node, cst.For) and isinstance(node.iter, cst.Call) and terminal_name(node.iter.func) == "range":
        args = node.iter.args
        if len(args) == 1:
            return args[0].value
        if len(args) == 2 and isinstance(args[0].value, cst.Integer) and args[0].value.value == "0":
            return args[1].value
    return None


def _splits_a_batch(loop: LoopInfo) -> bool:
    """`for chunk in batch.split(n):`, `for x in torch.chunk(batch, k):`, `split_args_and_kwargs(...)`."""
    node = loop.node
    if not isinstance(node, cst.For):
        return False
    return any(
        isinstance(part, cst.Call)
        and any(word in (terminal_name(part.func) or "").lower() for word in ("split", "chunk"))
        for part in iter_subtree(node.iter)
    )


def _steps_anything(call: cst.Call) -> bool:
    """Any `.step(...)`: an optimizer's, a scaler's, or one of a wrapper whose name does not say."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"


def _accumulates(factor: cst.BaseExpression | None, ctx: RuleContext) -> tuple[bool, str]:
    """Is the accumulation factor more than 1, or unknown (a configuration's)? And how to name it."""
    if factor is None:
        return True, "several micro-batches"
    value = _setting(factor, ctx)
    if type(value) is int:
        return value > 1, f"{value} micro-batches"
    return True, f"`{ctx.source(factor)}` micro-batches"


def _setting(expr: cst.BaseExpression, ctx: RuleContext, depth: int = 0) -> object:
    """The value a setting has by default: a literal, a command-line option's default, or either of
    them through the one local name it was assigned to (MAE's `accum_iter = args.accum_iter`)."""
    value = setting_value(expr, ctx)
    if value is UNKNOWN and isinstance(expr, cst.Name) and depth < 2:
        found = ctx.scope.lookup(expr.value)
        if found is not None and len(found[0]) == 1 and found[0][0].kind == "value":
            return _setting(found[0][0].value, ctx, depth + 1)
    return value


def _skipping_block(frame) -> cst.With | None:
    """The innermost `with model.no_sync():` (or Accelerate's / Fabric's kin) around `frame`."""
    while frame is not None and frame.kind not in (FrameKind.FUNCTION, FrameKind.MODULE):
        if frame.kind is FrameKind.WITH and isinstance(frame.node, cst.With):
            for item in frame.node.items:
                if any(
                    isinstance(node, cst.Attribute) and node.attr.value in _SKIPS_SYNC
                    for node in iter_subtree(item.item)
                ):
                    return frame.node
        frame = frame.parent
    return None


def _sets_grad_sync(code: cst.CSTNode) -> bool:
    """`model.require_backward_grad_sync = (micro_step == last)`: nanoGPT's way to skip the all-reduce."""
    return any(
        isinstance(node, cst.Attribute) and node.attr.value == "require_backward_grad_sync"
        for node in iter_subtree(code)
    )


def _runs_forward(code: cst.CSTNode) -> bool:
    """Does the code run a forward pass: a model call (`model(x)`), or an assignment of the tensor that a
    backward in it then differentiates (`loss = self.imagen(...)`; `loss.backward()`)?"""
    assigned: set[str] = set()
    for node in iter_subtree(code):
        if isinstance(node, cst.Call) and runs_a_model(node):
            return True
        if isinstance(node, (cst.Assign, cst.AugAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            assigned.update(t.value for t in targets if isinstance(t, cst.Name))
        if isinstance(node, cst.Call) and _backward(node):
            operand = node.args[0].value if node.args else cast(cst.Attribute, node.func).value
            if any(isinstance(n, cst.Name) and n.value in assigned for n in iter_subtree(operand)):
                return True
    return False


class AccumulationWithoutNoSync(Rule):
    code = "LA702"
    name = "accumulation-without-no-sync"
    summary = "Gradient accumulation under DDP without `no_sync()`: an all-reduce on every micro-batch."
    message = (
        "the optimizer steps once every few micro-batches, but DDP all-reduces the gradients after every "
        "micro-batch's backward"
    )
    suggestion = (
        "run the forward and backward of every micro-batch but the last inside `with model.no_sync():` "
        "(or set `model.require_backward_grad_sync` per micro-batch, or use `accelerator.accumulate(model)`)"
    )
    what_it_flags = (
        "Gradient accumulation in a project that wraps its model in `DistributedDataParallel` (in any module, "
        "directly or through Accelerate's `prepare`): a step loop whose backward runs on every iteration "
        "while every optimizer step sits under `if (i + 1) % k == 0:`, or whose backward runs in an inner "
        "`for micro_step in range(k):` loop with the optimizer step after it, or in a loop over micro-batches cut "
        "from one batch (`for chunk in batch.split(n):`) that steps nothing, or which hands the step "
        "boundary to a loss scaler (`loss_scaler(loss, optimizer, update_grad=(i + 1) % k == 0)`), with "
        "no `no_sync()` around the micro-batch and no `require_backward_grad_sync`. A `no_sync()` that "
        "covers the backward but not the forward is flagged too. Not flagged when `k` is 1 (a literal, or "
        "the command-line option's default)."
    )
    why_it_costs = (
        "DDP starts the gradient all-reduce from hooks that fire during `backward()`, on every backward "
        "call: accumulating k micro-batches pays k all-reduces of the whole model's gradients where one "
        "would do. Accelerate measured 2.0 s against 0.91 s per batch on two nodes (0.50 against 0.41 s on "
        "one). DDP decides whether to reduce when the forward runs, so a `no_sync()` around the backward "
        "alone changes nothing: the forward must be inside it too."
    )
    example = (
        "model = DistributedDataParallel(model, device_ids=[rank])\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y) / accumulation_steps\n"
        "    loss.backward()\n"
        "    if (i + 1) % accumulation_steps == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    use_instead = (
        "for i, (x, y) in enumerate(loader):\n"
        "    boundary = (i + 1) % accumulation_steps == 0\n"
        "    with contextlib.nullcontext() if boundary else model.no_sync():\n"
        "        loss = criterion(model(x), y) / accumulation_steps\n"
        "        loss.backward()\n"
        "    if boundary:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    fix_safety = (
        "No automatic fix: the forward and backward must move into a `with` block, and which micro-batch is "
        "the last depends on how the loop counts."
    )
    valid = (
        # No DDP anywhere: accumulation costs nothing extra.
        "import torch\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum() / accum\n"
        "    loss.backward()\n"
        "    if (i + 1) % accum == 0:\n"
        "        optimizer.step()\n",
        # The forward and the backward skip the all-reduce except at the boundary.
        "import contextlib\n"
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model)\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    boundary = (i + 1) % accum == 0\n"
        "    with contextlib.nullcontext() if boundary else model.no_sync():\n"
        "        loss = model(x).sum() / accum\n"
        "        loss.backward()\n"
        "    if boundary:\n"
        "        optimizer.step()\n",
        # nanoGPT: the flag DDP reads at the forward.
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model)\n"
        "for step in range(max_steps):\n"
        "    for micro_step in range(grad_accum_steps):\n"
        "        model.require_backward_grad_sync = micro_step == grad_accum_steps - 1\n"
        "        loss = model(x, y)\n"
        "        loss.backward()\n"
        "    optimizer.step()\n",
        # One micro-batch per step by default: nothing is accumulated.
        "import argparse\n"
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--accum-iter', type=int, default=1)\n"
        "args = parser.parse_args()\n"
        "model = DDP(model)\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum() / args.accum_iter\n"
        "    loss.backward()\n"
        "    if (i + 1) % args.accum_iter == 0:\n"
        "        optimizer.step()\n",
        # Accelerate decides per step.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator(gradient_accumulation_steps=4)\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
        "for x, y in loader:\n"
        "    with accelerator.accumulate(model):\n"
        "        loss = model(x).sum()\n"
        "        accelerator.backward(loss)\n"
        "        optimizer.step()\n",
        # A GAN: the discriminator steps every iteration, the generator every few.
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "netD, netG = DDP(netD), DDP(netG)\n"
        "for i, x in enumerate(loader):\n"
        "    d_loss = netD(x).mean()\n"
        "    d_loss.backward()\n"
        "    optimizerD.step()\n"
        "    if i % n_critic == 0:\n"
        "        g_loss = -netD(netG(z)).mean()\n"
        "        g_loss.backward()\n"
        "        optimizerG.step()\n",
    )
    invalid = (
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model, device_ids=[rank])\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x), y) / 4\n"
        "    loss.backward()  # expect: LA702\n"
        "    if (i + 1) % 4 == 0:\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n",
        # The micro-steps in an inner loop (nanoGPT's shape, without its flag).
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model)\n"
        "for step in range(max_steps):\n"
        "    for micro_step in range(grad_accum_steps):\n"
        "        loss = model(x, y) / grad_accum_steps\n"
        "        scaler.scale(loss).backward()  # expect: LA702\n"
        "    scaler.step(optimizer)\n"
        "    scaler.update()\n",
        # MAE's loss scaler runs the backward and steps at the boundary it is handed.
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "model = DistributedDataParallel(model)\n"
        "for data_iter_step, (samples, _) in enumerate(data_loader):\n"
        "    loss = model(samples)\n"
        "    loss /= accum_iter\n"
        "    loss_scaler(loss, optimizer, update_grad=(data_iter_step + 1) % accum_iter == 0)  # expect: LA702\n",
        # Micro-batches cut from one batch, each with its own backward, stepped after the loop.
        "import torch\n"
        "from accelerate import Accelerator\n"
        "accelerator = Accelerator()\n"
        "model, optimizer = accelerator.prepare(model, optimizer)\n"
        "for batch in loader:\n"
        "    for chunk in batch.split(micro_batch_size):\n"
        "        loss = model(chunk).mean()\n"
        "        accelerator.backward(loss)  # expect: LA702\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n",
        # `no_sync()` around the backward alone: DDP decided at the forward.
        "import torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "model = DDP(model)\n"
        "for i, (x, y) in enumerate(loader):\n"
        "    loss = model(x).sum()\n"
        "    if (i + 1) % 8 != 0:\n"
        "        with model.no_sync():\n"
        "            loss.backward()  # expect: LA702\n"
        "    else:\n"
        "        loss.backward()\n"
        "    if (i + 1) % 8 == 0:\n"
        "        optimizer.step()\n",
    )

    confirmed_by = ("LA607",)  # measured by `loopaudit run`, on any device (gloo on CPU)
    node_types = (cst.Call,)
    # The loop runs per step; a backward under `if (i + 1) % k != 0: with model.no_sync():` is judged
    # too, though the per-step model reads that branch as periodic.
    needs_step = False
    needs_cuda = False  # gloo's all-reduce over the network costs a CPU job as much

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        handed_boundary = _handed_boundary(node)
        if not _backward(node) and handed_boundary is None:
            return
        loop = ctx.frame.innermost_loop()
        if (
            loop is None
            or in_test_code(ctx.frame)
            or ctx.steps.reason(loop.frame) is None
            or not ctx.steps.wraps_ddp()
            or _lightning(ctx)
        ):
            return
        if handed_boundary is not None:
            if any(_backward(site.call) for site in loop.all_calls):
                return  # the loop runs its own backward: that call is the one to judge
            factor: cst.BaseExpression | None = _divisor(handed_boundary)
            micro_steps: cst.CSTNode = loop.node
        else:
            shape = _accumulation(loop, ctx)
            if shape is None:
                return
            factor, micro_steps = shape
        accumulates, how_many = _accumulates(factor, ctx)
        if not accumulates or _sets_grad_sync(micro_steps):
            return
        skipped = [site for site in loop.all_calls if _backward(site.call) and _skipping_block(site.frame) is not None]
        if skipped:
            # The loop skips the all-reduce somewhere: judge that block, not the boundary's own backward.
            block = _skipping_block(ctx.frame)
            if block is not None and not _runs_forward(block.body):
                yield Report(
                    node,
                    "`no_sync()` covers this backward but not the forward: DDP decides at the forward whether to "
                    "all-reduce, so every micro-batch still pays one",
                )
            return
        yield Report(
            node,
            f"the optimizer steps once every {how_many}, but DDP all-reduces the gradients after every "
            "micro-batch's backward: no `no_sync()` covers the micro-batches in between",
        )


def _handed_boundary(call: cst.Call) -> cst.BaseExpression | None:
    """The accumulation boundary a call is handed (`update_grad=(i + 1) % accum_iter == 0`), with the
    loss and an optimizer: a loss scaler that runs the backward and steps only at the boundary."""
    if not any(terminal_name(arg.value) and "optim" in (terminal_name(arg.value) or "").lower() for arg in call.args):
        return None
    for arg in call.args:
        value = arg.value
        if (
            isinstance(value, cst.Comparison)
            and _divisor(value) is not None
            and any(isinstance(c.operator, cst.Equal) for c in value.comparisons)
        ):
            return value
    return None


def _accumulation(loop: LoopInfo, ctx: RuleContext):
    """(factor, the code of one micro-step) when the backward in this loop accumulates gradients over
    several iterations: a backward runs on every iteration, and the loop steps the optimizer only under
    `% k` guards, or steps it after this inner loop. None when every iteration steps (or nothing does)."""
    if not any(
        _backward(site.call) and (_every_iteration(site.frame, loop) or _skipping_block(site.frame) is not None)
        for site in loop.all_calls
    ):
        return None
    steps_here = [site for site in loop.all_calls if _optimizer_step(site.call, ctx)]
    if steps_here:
        guards = [_guards(site.frame, loop) for site in steps_here]
        if not all(guards):
            return None  # some optimizer steps every iteration
        factor = next((d for found in guards for guard in found if (d := _divisor(guard)) is not None), None)
        return (factor, loop.node) if factor is not None else None
    if not _runs_forward(loop.node.body):
        return None
    if _splits_a_batch(loop) and not any(_steps_anything(site.call) for site in loop.all_calls):
        # micro-batches cut from one batch (imagen-pytorch's `split_args_and_kwargs(..., split_size=...)`):
        # the step comes after the loop, in this function or its caller
        return None, loop.node
    outer = loop.parent_loop
    if outer is None or outer.function is not loop.function:
        return None
    stepping = [site for site in outer.all_calls if _optimizer_step(site.call, ctx)]
    if not stepping or not all(_every_iteration(site.frame, outer) for site in stepping):
        return None
    return _count(loop), loop.node


def _lightning(ctx: RuleContext) -> bool:
    """Lightning runs the accumulation (`accumulate_grad_batches`) and skips the sync itself."""
    return ctx.index.imports.imports_module("lightning") or ctx.index.imports.imports_module("pytorch_lightning")
