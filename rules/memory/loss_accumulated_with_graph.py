from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    FORWARD_CALLEE,
    Fix,
    FrameKind,
    Report,
    Rule,
    RuleContext,
    Scope,
    iter_subtree,
    terminal_name,
)

# Tensor methods whose result is still part of the autograd graph of their receiver.
_DIFFERENTIABLE_METHODS = frozenset(
    {
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "prod",
        "std",
        "var",
        "norm",
        "abs",
        "exp",
        "log",
        "sqrt",
        "pow",
        "neg",
        "sigmoid",
        "softmax",
        "log_softmax",
        "relu",
        "tanh",
        "float",
        "double",
        "half",
        "bfloat16",
        "to",
        "cuda",
        "cpu",
        "clone",
        "contiguous",
        "view",
        "view_as",
        "reshape",
        "flatten",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "t",
        "expand",
        "repeat",
        "type_as",
        "gather",
        "index_select",
        "clamp",
        "clip",
        "add",
        "sub",
        "mul",
        "div",
        "matmul",
        "square",
        "masked_fill",
        "masked_select",
    }
)
# Callees named like a forward pass that compute metrics, which carry no graph.
_LOSS_CALLEE_EXCLUDED = ("metric", "accuracy", "acc")


class LossAccumulatedWithGraph(Rule):
    code = "LA403"
    name = "loss-accumulated-with-graph"
    summary = "A loss accumulated across steps without `.detach()`/`.item()`: every step's graph stays alive."
    message = (
        "accumulating a loss that requires grad keeps every step's autograd graph alive until the accumulator dies"
    )
    suggestion = (
        "keep what the step computed without its graph: `total += loss.detach()` (stays on the device, no sync; "
        "read `total.item()` once per epoch), `losses.append(loss.detach())`; not `loss.item()` every step, "
        "which waits for the GPU (LA101)"
    )
    what_it_flags = (
        "In a loop that trains (calls `backward()` or `optimizer.step()`), outside `torch.no_grad()`: "
        "`total += loss` (or `-=`) and `losses.append(loss)` where the accumulator is bound before the "
        "loop, so it outlives the step, and the value is the result of a forward pass or a loss "
        "(`model(x)`, `criterion(out, y)`, `F.cross_entropy(...)`, `outputs.loss`, arithmetic on those) "
        "that was not detached. Values passed through `.detach()`, `.item()`, `.data`, `float()`, "
        "comparisons or `argmax` are not flagged, nor is an accumulator that is itself backpropagated "
        "(`total.backward()`, `torch.stack(losses).sum().backward()`: gradient accumulation on purpose). "
        "Any device. (`total += loss.item()` and `losses.append(float(loss))` keep no graph, but read the "
        "loss on the host every step: LA101 and LA103.) The message names the change for its shape: a running "
        "sum accumulates `loss.detach()` and is read once per epoch; a list appends `.detach()`, and a list "
        "of losses is reduced on the device once per epoch (`torch.stack(losses).mean()`)."
    )
    why_it_costs = (
        "A tensor that requires grad holds its `grad_fn`, and through it the whole autograd graph that "
        "produced it. `total += loss` makes `total` a new tensor whose graph is the previous `total`'s "
        "graph plus this step's, so the accumulator keeps every step's graph alive until it dies (the "
        'PyTorch FAQ, "Don\'t accumulate history across your training loop"). `backward()` frees the '
        "saved activations of the graph it runs through, but not its nodes: host memory grows by one "
        "graph per step for the whole epoch, and each step's loss tensor stays allocated on the device. "
        "A value that backward never runs through (an output kept with `outputs.append(logits)`, a loss of "
        "a part of the model that is not backpropagated, `retain_graph=True`) also keeps its saved "
        "activations, a step's worth of activation memory per element, until the out-of-memory error. "
        "Every later operation on the accumulator (`total / n`) is recorded in the graph too."
    )
    example = (
        "total_loss = 0.0\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    total_loss += loss\n"
    )
    use_instead = (
        "total_loss = torch.zeros((), device=device)\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    total_loss += loss.detach()\n"
    )
    fix_safety = (
        "Fixed only with `--unsafe-fixes`: the accumulated value becomes `value.detach()`. That is right "
        "whenever the accumulator is only read (logged, averaged): detaching changes nothing but the graph. "
        "It is wrong where the sum is meant to be backpropagated, which this rule already leaves alone when "
        "it sees the backward, but cannot rule out when the backward is elsewhere."
    )
    valid = (
        # Detached, converted to a number, or a metric: no graph is kept.
        "import torch\n"
        "model.cuda()\n"
        "running_loss, correct, losses = 0.0, 0, []\n"
        "for x, y in train_loader:\n"
        "    outputs = model(x.cuda())\n"
        "    loss = criterion(outputs, y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.detach()\n"
        "    correct += (outputs.argmax(1) == y.cuda()).sum()\n"
        "    losses.append(loss.item())\n",
        # Gradient accumulation on purpose: the sum is backpropagated.
        "import torch\n"
        "for batch in train_loader:\n"
        "    total = 0\n"
        "    for chunk in batch.split(4):\n"
        "        total += model(chunk.cuda()).mean()\n"
        "    total.backward()\n"
        "    optimizer.step()\n",
        # Reset every step: the accumulator dies with the step.
        "import torch\n"
        "for x, y in train_loader:\n"
        "    losses = []\n"
        "    for head in heads:\n"
        "        losses.append(criterion(head(x.cuda()), y.cuda()))\n"
        "    loss = sum(losses)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A number per step carries no graph: these are per-step syncs (LA103, LA101), not kept graphs.
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for epoch in range(10):\n"
        "    epoch_loss, total = [], 0.0\n"
        "    for x, y in train_loader:\n"
        "        loss = criterion(model(x.to(device)), y.to(device))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        epoch_loss.append(float(loss))\n"
        "        total += loss.item()\n",
        # Evaluation under no_grad records no graph.
        "import torch\n"
        "total = 0.0\n"
        "with torch.no_grad():\n"
        "    for x, y in val_loader:\n"
        "        total += criterion(model(x.cuda()), y.cuda())\n",
    )
    invalid = (
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for epoch in range(10):\n"
        "    epoch_loss = 0.0\n"
        "    for x, y in train_loader:\n"
        "        optimizer.zero_grad()\n"
        "        loss = criterion(model(x.to(device)), y.to(device))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        epoch_loss += loss  # expect: LA403\n"
        "    print(epoch, epoch_loss / len(train_loader))\n",
        # A list of losses, and a model output kept across steps.
        "import torch\n"
        "import torch.nn.functional as F\n"
        "model.cuda()\n"
        "train_losses, all_logits = [], []\n"
        "for step, batch in enumerate(train_loader):\n"
        "    out = model(**batch)\n"
        "    loss = F.cross_entropy(out.logits, batch['labels'])\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    train_losses.append(loss)  # expect: LA403\n"
        "    all_logits.append(out.logits)  # expect: LA403\n",  # A running difference, and a loss computed straight into the list.
        "import torch\n"
        "import torch.nn.functional as F\n"
        "model.cuda()\n"
        "for epoch in range(10):\n"
        "    reward, step_losses = 0.0, []\n"
        "    for x, y in train_loader:\n"
        "        out = model(x.cuda())\n"
        "        loss = F.cross_entropy(out, y.cuda())\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        reward -= loss  # expect: LA403\n"
        "        step_losses.append(F.cross_entropy(out, y.cuda()))  # expect: LA403\n",
    )

    node_types = (cst.AugAssign, cst.Call)
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast("cst.AugAssign | cst.Call", node)  # node_types
        if isinstance(node, cst.AugAssign):
            if not isinstance(node.operator, (cst.AddAssign, cst.SubtractAssign)) or not isinstance(
                node.target, cst.Name
            ):
                return
            accumulator, value = node.target.value, node.value
        else:
            receiver = ctx.method_call(node, "append")
            if not isinstance(receiver, cst.Name) or len(node.args) != 1 or node.args[0].keyword or node.args[0].star:
                return
            accumulator, value = receiver.value, node.args[0].value
        loop = _training_loop(ctx)
        if loop is None or ctx.steps.under_no_grad(ctx.frame):
            return
        if not _outlives(accumulator, ctx.scope, loop.node, ctx):
            return
        if not _carries_graph(value, ctx, ctx.scope, 0, set()):
            return
        if _backpropagated(accumulator, ctx.scope, ctx):
            return
        detached = _detached(value)
        kept = ctx.source(detached, 40)
        if isinstance(node, cst.Call):
            # A list keeps each step's tensor, and with it that step's graph.
            read = (
                f" and reduce the list once per epoch (`torch.stack({accumulator}).mean()`)"
                if _looks_like_loss(value)
                else ""
            )
            message = (
                f"`{accumulator}.append({ctx.source(value, 24)})` keeps each step's autograd graph alive in "
                f"`{accumulator}` until the list dies: append `{kept}`{read}"
            )
        else:
            # A running sum chains each step's graph onto the previous ones.
            operator = "+=" if isinstance(node.operator, cst.AddAssign) else "-="
            message = (
                f"`{accumulator} {operator} {ctx.source(value, 24)}` chains each step's autograd graph onto "
                f"`{accumulator}`, which keeps them all alive until it dies: accumulate `{kept}` (on the "
                f"device, no sync) and read `{accumulator}` once per epoch"
            )
        yield Report(node, message, fix=Fix("accumulate `.detach()`", ((value, detached),), safe=False))


def _looks_like_loss(value: cst.BaseExpression) -> bool:
    """`loss`, `outputs.loss`, `criterion(out, y)`: a scalar per step, which a list of is stacked;
    not `out.logits`, a batch of outputs."""
    name = terminal_name(value.func if isinstance(value, cst.Call) else value) or ""
    return any(word in name.lower() for word in ("loss", "criterion", "entropy", "nll", "mse"))


def _detached(value: cst.BaseExpression) -> cst.Call:
    """`value.detach()`, with parentheses where `value` is an operation (`(a + b).detach()`)."""
    if not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
        value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Call(func=cst.Attribute(value=value, attr=cst.Name("detach")))


def _training_loop(ctx):
    """The innermost loop around the node, in the same function, when it is a step loop that trains."""
    frame = ctx.frame
    while frame is not None and frame.kind is not FrameKind.FUNCTION:
        if frame.kind is FrameKind.LOOP:
            loop = frame.loop
            if not ctx.steps.is_step_loop(loop):
                return None
            trains = loop.trains_directly or any(
                ctx.steps.trains(f) for site in loop.direct_calls for f in ctx.steps.resolve(site)
            )
            return loop if trains else None
        frame = frame.parent
    return None


def _inside(node: cst.CSTNode, root: cst.CSTNode, ctx) -> bool:
    # The nodes under `root`, gathered once per analysis: the tree lives as long as the analysis does.
    return id(node) in ctx.memoized(f"nodes under {id(root)}", lambda: {id(n) for n in iter_subtree(root)})


def _outlives(name: str, scope: Scope, loop_node: cst.CSTNode, ctx) -> bool:
    """Is `name` bound before the loop (outside it) and never re-bound inside it?"""
    found = scope.lookup(name)
    if found is None:
        return False
    bindings = [b for b in found[0] if b.kind in ("value", "element", "with")]
    if not bindings:
        return False
    outside = [b for b in bindings if not _inside(b.value, loop_node, ctx)]
    return bool(outside) and len(outside) == len(bindings)


def _carries_graph(expr: cst.BaseExpression, ctx, scope: Scope, depth: int, busy: set) -> bool:
    """Is `expr` shown to be a forward output or a loss that still requires grad?"""
    if depth > 8:
        return False
    if isinstance(expr, cst.Name):
        found = scope.lookup(expr.value)
        if found is None or (id(found[1]), expr.value) in busy:
            return False
        bindings, owner = found
        busy = busy | {(id(owner), expr.value)}
        return any(
            b.kind in ("value", "augment", "element")
            and not _computed_without_grad(b.value, ctx)
            and _carries_graph(b.value, ctx, b.scope, depth + 1, busy)
            for b in bindings
        )
    if isinstance(expr, cst.Attribute):
        if expr.attr.value in ("loss", "logits"):
            return _carries_graph(expr.value, ctx, scope, depth + 1, busy)
        return False  # `.data`, `.grad`, `.shape`, and attributes we know nothing about
    if isinstance(expr, cst.Subscript):
        return _carries_graph(expr.value, ctx, scope, depth + 1, busy)
    if isinstance(expr, cst.BinaryOperation):
        return _carries_graph(expr.left, ctx, scope, depth + 1, busy) or _carries_graph(
            expr.right, ctx, scope, depth + 1, busy
        )
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return _carries_graph(expr.expression, ctx, scope, depth + 1, busy)
    if isinstance(expr, cst.Call):
        func = expr.func
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("torch.nn.functional.") or qualified in (
            "torch.mean",
            "torch.sum",
            "torch.stack",
            "torch.cat",
        ):
            return any(
                _carries_graph(arg.value, ctx, scope, depth + 1, busy) for arg in expr.args if arg.keyword is None
            )
        if qualified:
            return False
        if isinstance(func, cst.Name):
            return _forward_callee(func.value, ctx)
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _DIFFERENTIABLE_METHODS:
                return _carries_graph(func.value, ctx, scope, depth + 1, busy)
            if isinstance(func.value, cst.Name) and func.value.value == "self":
                return _forward_callee(method, ctx)
    return False


def _forward_callee(name: str, ctx) -> bool:
    lowered = name.lower()
    if name in ctx.index.classes or any(word in lowered for word in _LOSS_CALLEE_EXCLUDED):
        return False
    return bool(FORWARD_CALLEE.search(name)) and name != "self"


def _computed_without_grad(value: cst.CSTNode, ctx) -> bool:
    """Was this value computed inside `with torch.no_grad():` (a teacher's output, a target)?"""
    return any(_inside(value, with_node.body, ctx) for with_node in _no_grad_blocks(ctx))


def _no_grad_blocks(ctx) -> list:
    return ctx.memoized(
        "no-grad blocks",
        lambda: [
            node
            for node in iter_subtree(ctx.index.module)
            if isinstance(node, cst.With) and any(ctx.steps.disables_grad(item.item) for item in node.items)
        ],
    )


def _backpropagated(name: str, scope: Scope, ctx) -> bool:
    """Does the module backpropagate through the accumulator: `total.backward()`,
    `sum(losses).backward()`, `loss = torch.stack(losses).mean(); loss.backward()`?"""
    derived = {name}
    derived |= set(_bindings_mentioning(name, scope))
    for site in ctx.index.calls:
        func = site.call.func
        if (isinstance(func, cst.Attribute) and func.attr.value == "backward") or (
            terminal_name(func) in ("grad",) and (ctx.qualified_name(func) or "").startswith("torch.autograd")
        ):
            if any(isinstance(n, cst.Name) and n.value in derived for n in iter_subtree(site.call)):
                return True
    return False


def _bindings_mentioning(name: str, scope: Scope):
    """Names of `scope` assigned from an expression that mentions `name`."""
    for other, bindings in scope.assignments.items():
        for binding in bindings:
            if binding.kind in ("value", "augment", "element") and any(
                isinstance(n, cst.Name) and n.value == name for n in iter_subtree(binding.value)
            ):
                yield other
                break
