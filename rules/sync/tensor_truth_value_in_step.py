from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from loopaudit.rule_api import Report, Rule, RuleContext, iter_subtree

_CONVERSIONS = frozenset({"float", "int", "bool", "complex"})


def _tested(expr: cst.BaseExpression):
    """The operands whose truth value Python computes when it tests `expr` itself."""
    pending = [expr]
    while pending:  # iterative: `a and b and c and ...` can be thousands of operands long
        current = pending.pop()
        if isinstance(current, cst.BooleanOperation):
            pending += [current.right, current.left]
        elif isinstance(current, cst.UnaryOperation) and isinstance(current.operator, cst.Not):
            pending.append(current.expression)
        else:
            yield current


class TensorTruthValueInStep(Rule):
    code = "LA103"
    name = "tensor-truth-value-in-step"
    summary = "A tensor used as a Python bool or number (`if loss < best`, `float(t)`) once per step."
    message = "Python needs this tensor's value on the host: the CPU stalls until the GPU drains, once per step"
    suggestion = (
        "keep the decision on the device (`torch.where`, `torch.clamp`, masks), check it only at the log "
        "interval, or, for a NaN guard, accumulate `torch.isfinite(loss)` and inspect it periodically"
    )
    what_it_flags = (
        "A CUDA tensor turned into a Python value in code that runs once per step: the test of `if`, "
        "`while`, `assert` and conditional expressions; the operands of `and`/`or`/`not`; "
        "`float(t)`, `int(t)`, `bool(t)`; a `math` function applied to a tensor (`math.exp(loss)`); Python's "
        "`max()`/`min()` of a tensor and another value (`N = max(num_pos.sum().float(), 1)`, which compares "
        "them with `<`). "
        "Comparisons count when a side is a tensor (`if loss < best_loss`, `if mask.sum() > 0`), and so do "
        "tensor predicates (`if torch.isnan(loss).any()`). Only expressions that are shown to be tensors are "
        "flagged; shapes (`x.shape[0] > 0`), `is None` checks and Python numbers are not."
    )
    why_it_costs = (
        "`bool(t)` and `float(t)` call `.item()` under the hood (`aten::_local_scalar_dense`): the CPU waits "
        "for every queued kernel and the copy back. In a training step this drains the GPU queue every "
        "step, and the branch keeps the CPU from queuing the rest of the step meanwhile."
    )
    example = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    if torch.isnan(loss):\n"
        "        continue\n"
        "    loss.backward()\n"
    )
    use_instead = (
        "bad_steps = torch.zeros((), device='cuda', dtype=torch.long)\n"
        "for step, (x, y) in enumerate(loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    bad_steps += ~torch.isfinite(loss)\n"
        "    loss = torch.nan_to_num(loss)  # or let GradScaler skip non-finite steps\n"
        "    loss.backward()\n"
        "    if step % 100 == 0 and bad_steps.item():\n"
        "        print('non-finite losses seen')\n"
    )
    fix_safety = (
        "No automatic fix: a branch on a device value needs a device-side formulation, which changes the code's shape."
    )
    valid = (
        # A presence check of an optional value (SlowFast's extra losses: None, or a list of them).
        "import torch\n"
        "model = Net().cuda()\n"
        "for x, y in loader:\n"
        "    loss_extra = None\n"
        "    loss = model(x.cuda(non_blocking=True))\n"
        "    if isinstance(loss, (list, tuple)):\n"
        "        loss, loss_extra = loss\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if loss_extra:\n"
        "        log(loss_extra)\n",
        # The library's version string, read in a model's step (pix2pixHD).
        "import torch\n"
        "model = Net().cuda()\n"
        "for x, y in loader:\n"
        "    if torch.__version__.startswith('0.4'):\n"
        "        x = x.detach()\n"
        "    loss = model(x.cuda(non_blocking=True))\n"
        "    loss.backward()\n",
        # Flags named like tensors (`return_loss`, `return_logits`) are flags.
        "import torch\n"
        "class VAE(torch.nn.Module):\n"
        "    def forward(self, img, return_loss=False, return_logits=False):\n"
        "        logits = self.encoder(img)\n"
        "        if return_logits:\n"
        "            return logits\n"
        "        out = self.decoder(logits)\n"
        "        if not return_loss:\n"
        "            return out\n"
        "        return (out - img).pow(2).mean()\n"
        "model = VAE().cuda()\n"
        "for img, _ in loader:\n"
        "    loss = model(img.cuda(non_blocking=True), return_loss=True)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A parameter the signature declares a flag is one, named like a tensor or not (timm's heads).
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward_head(self, x: torch.Tensor, pre_logits: bool = False, logits_scale=1.0):\n"
        "        x = self.pool(x)\n"
        "        if logits_scale:\n"
        "            x = x * logits_scale\n"
        "        return x if pre_logits else self.fc(x)\n"
        "    def forward(self, x):\n"
        "        return self.forward_head(self.features(x))\n"
        "model = Net().cuda()\n"
        "for x, y in loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Shapes and Python values are host data already.
        "import torch\n"
        "model.cuda()\n"
        "for x, y in train_loader:\n"
        "    if x.shape[0] < batch_size or args.skip_partial:\n"
        "        continue\n"
        "    loss = model(x.cuda()).sum()\n"
        "    if loss is None:\n"
        "        continue\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Checking at the log interval only.
        "import torch\n"
        "for step in range(max_steps):\n"
        "    loss = model(get_batch('cuda')).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 100 == 0:\n"
        "        if loss < best:\n"
        "            best = loss\n",
    )
    invalid = (
        "import math\n"
        "import torch\n"
        "device = 'cuda'\n"
        "for step, (x, y) in enumerate(train_loader):\n"
        "    loss = criterion(model(x.to(device)), y.to(device))\n"
        "    if torch.isnan(loss):  # expect: LA103\n"
        "        continue\n"
        "    loss.backward()\n"
        "    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
        "    if grad_norm > 10.0 and not warmup:  # expect: LA103\n"
        "        skipped += 1\n"
        "    optimizer.step()\n"
        "    history.append(float(loss))  # expect: LA103\n"
        "    ppl = math.exp(loss)  # expect: LA103\n"
        "    n = max((y.to(device) > 0).sum().float(), 1)  # expect: LA103\n"
        "    assert torch.isfinite(loss).all()  # expect: LA103\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.If, cst.While, cst.Assert, cst.IfExp, cst.BooleanOperation, cst.UnaryOperation, cst.Call)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if isinstance(node, (cst.If, cst.While, cst.IfExp, cst.Assert)):
            tested = _tested(node.test)
        elif isinstance(node, cst.BooleanOperation):
            # The left operand is always tested; the right one only when the whole is tested (above).
            tested = _tested(node.left)
        elif isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            tested = _tested(node.expression)
        else:
            tested = ()
        for operand in tested:
            if _may_be_none(operand, ctx):
                continue  # `loss_extra = None` ... `if loss_extra:`: a presence check of an optional value
            if ctx.is_tensor(operand):
                yield Report(
                    operand,
                    f"`{ctx.source(operand)}` is a tensor used as a condition: Python reads its value on the host, so the CPU stalls until the GPU drains, once per step",
                )
        if isinstance(node, cst.Call):
            yield from self._conversion(node, ctx)

    # A number read to be kept (`epoch_loss.append(float(loss))`, `total += float(loss)`) is no decision:
    # the advice is to keep the running value on the device and read it once.
    _KEEP_ON_DEVICE = (
        "keep the value on the device (`total += loss.detach()`, or append `loss.detach()` and "
        "`torch.stack(...)` the list) and read it once, at the log interval or the epoch's end"
    )

    def _conversion(self, node: cst.Call, ctx):
        positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
        if not positional:
            return
        func = node.func
        if isinstance(func, cst.Name) and func.value in _CONVERSIONS and ctx.qualified_name(func) is None:
            if len(positional) == 1 and ctx.is_tensor(positional[0]):
                yield Report(
                    node,
                    f"`{func.value}()` of a tensor reads its value on the host: the CPU stalls until the GPU drains, once per step",
                    suggestion=None if func.value == "bool" else self._KEEP_ON_DEVICE,
                )
            return
        if isinstance(func, cst.Name) and func.value in ("max", "min") and ctx.qualified_name(func) is None:
            # `N = max(num_pos.sum().float(), 1)` (SSD's loss): Python compares the two with `<`,
            # and the comparison's truth value is read on the host
            if len(positional) >= 2 and any(ctx.is_tensor(arg) for arg in positional):
                bound = "min" if func.value == "max" else "max"
                yield Report(
                    node,
                    f"`{func.value}()` compares a tensor with Python's `<`: the truth value is read on the host, so "
                    "the CPU stalls until the GPU drains, once per step",
                    suggestion=f"clamp on the device: `t.clamp({bound}=1)` keeps the result a tensor",
                )
            return
        qualified = ctx.qualified_name(func) or ""
        if qualified.startswith("math.") and any(ctx.is_tensor(arg) for arg in positional):
            yield Report(
                node,
                f"`{qualified}()` converts a tensor to a Python float: the CPU stalls until the GPU drains, once per step",
                suggestion=self._KEEP_ON_DEVICE,
            )


def _may_be_none(operand: cst.BaseExpression, ctx) -> bool:
    """A name bound to `None` and otherwise only unpacked from a container (`loss, loss_extra = loss`):
    testing it asks whether it is set, and what it holds when set (a list of losses?) is not known.
    ConvNeXt's `class_acc = (...).float().mean() if ... else None` stays a 0-dim tensor when set."""
    if not isinstance(operand, cst.Name):
        return False
    found = ctx.scope.lookup(operand.value)
    if found is None:
        return False
    nones = [b for b in found[0] if b.kind == "value" and isinstance(b.value, cst.Name) and b.value.value == "None"]
    others = [b for b in found[0] if b not in nones]
    # (a rebinding made from the name itself, `loss_extra = all_reduce(loss_extra)`, tells no more)
    return bool(nones) and all(b.kind == "element" or _mentions(b.value, operand.value) for b in others)


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in iter_subtree(node))
