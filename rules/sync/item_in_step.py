from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Group, Report, Rule, RuleContext, terminal_name
from loopaudit.rules.sync.data_dependent_shape_in_step import DATA_DEPENDENT_METHODS

# `GradScaler.get_scale()` returns `self._scale.item()`, and `state_dict()` calls it: a sync hidden in
# the scaler (timm's NativeScaler and DeiT/MAE's `loss_scaler.state_dict()["scale"]` go through it).
_SCALER_NAME = re.compile(r"(?i)(^|_)scaler$")
_GRAD_SCALERS = ("torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")


def _is_grad_scaler(receiver: cst.BaseExpression, ctx) -> bool:
    name = terminal_name(receiver)
    if name is None:
        return False
    if isinstance(receiver, cst.Name):
        found = ctx.scope.lookup(name)
        for binding in found[0] if found else ():
            if binding.kind == "value" and isinstance(binding.value, cst.Call):
                qualified = ctx.qualified_name(binding.value.func) or ""
                if qualified in _GRAD_SCALERS or qualified.endswith("NativeScaler"):
                    return True
    return bool(_SCALER_NAME.search(name))


def _reads_in_step(node: cst.CSTNode, ctx) -> Group:
    """The reads of one step body are one problem: each drains the GPU queue, and stacking the values
    into one tensor read once (or reading them every N steps) fixes them all."""
    return Group(
        ctx.one_pass(node),
        noun="read",
        where="in this step",
        advice="stack them (`torch.stack([a, b]).tolist()`) and read once, or read them every N steps",
    )


# PyTorch <= 0.3 had no 0-dim tensors: a loss was a one-element tensor, read with `loss.data[0]`, the
# `.item()` of its day. `x.data[0]` of a batch is its first row, not a read, so the idiom counts only
# where the value is one number by its name (`loss`, `correct`, `mse`) or by its making (a reduction).
_SCALAR_NAME = re.compile(r"(?i)(loss|acc|correct|right|err|mse|nll|kl|prec|psnr|ssim|reward)")
_REDUCTIONS = frozenset({"sum", "mean", "norm", "prod", "std", "var"})


def _legacy_read(node: cst.Subscript, ctx) -> cst.BaseExpression | None:
    """The tensor a PyTorch 0.3 scalar read `loss.data[0]` reads, or None."""
    if not (
        isinstance(node.value, cst.Attribute)
        and node.value.attr.value == "data"
        and len(node.slice) == 1
        and isinstance(node.slice[0].slice, cst.Index)
        and isinstance(node.slice[0].slice.value, cst.Integer)
        and node.slice[0].slice.value.value == "0"
    ):
        return None
    if isinstance(ctx.parent(node), (cst.Attribute, cst.Subscript)):
        return None  # `out.data[0].numpy()`, `x.data[0][0]`: a row used as an array
    tensor = node.value.value
    if isinstance(tensor, cst.Call):
        name = terminal_name(tensor.func)
        scalar = bool(name) and (
            (name in _REDUCTIONS and not tensor.args and isinstance(tensor.func, cst.Attribute))
            or bool(_SCALAR_NAME.search(cast(str, name)))
        )
    else:
        scalar = bool(_SCALAR_NAME.search(terminal_name(tensor) or ""))
    return tensor if scalar and ctx.maybe_tensor(tensor) else None


# A metric logger (SSD's, VideoMAE's) that reads every value it is handed; MARK takes an expect mark.
_METRIC_LOGGER = (
    "import torch\n"
    "class MetricLogger:\n"
    "    def __init__(self):\n"
    "        self.meters = {}\n"
    "    def update(self, **kwargs):\n"
    "        for k, v in kwargs.items():\n"
    "            if isinstance(v, torch.Tensor):\n"
    "                v = v.item()MARK\n"
    "            self.meters[k] = v\n"
    "model = Net().cuda()\n"
    "meters = MetricLogger()\n"
)


class ItemInStep(Rule):
    code = "LA101"
    name = "item-in-step"
    summary = "`.item()` / `.tolist()` (or PyTorch 0.3's `loss.data[0]`) on a tensor once per step."
    message = "`.item()` copies a GPU value to the host: the CPU stalls until the GPU drains, once per step"
    suggestion = (
        "keep the running value on the device (`total += loss.detach()`) and call `.item()` only at the "
        "log interval, e.g. under `if step % log_interval == 0:`"
    )
    what_it_flags = (
        "`.item()` and `.tolist()` on a tensor in code that runs once per training or evaluation step of a "
        "script that targets CUDA, including metric accumulation such as "
        "`correct += (pred == y).sum().item()` and progress bars such as `pbar.set_postfix(loss=loss.item())`, "
        "and the `.item()` hidden in a gradient scaler: `scaler.get_scale()` and `loss_scaler.state_dict()` "
        '(as DeiT and MAE log `loss_scaler.state_dict()["scale"]` every step). '
        "In code written for PyTorch 0.3 and earlier, `loss.data[0]` was the same read; it is flagged where the "
        "value is one number by its name (`loss`, `correct`, `mse`, `acc`) or its making (`F.mse_loss(...)`, "
        "`x.sum()`), not where `.data[0]` takes a batch's first row (`out.data[0].numpy()`). "
        "Calls under a periodic guard (`if step % log_interval == 0:`) and calls on NumPy values are not "
        "flagged. The reads of one step (one loop body or per-step function body) are one finding, at the "
        "first, naming the lines of the others: they are fixed together, by stacking the values and reading "
        "them once."
    )
    why_it_costs = (
        "CUDA kernels run asynchronously: the Python loop normally races ahead and queues the next step's "
        "kernels while the GPU works. `.item()` needs the value on the host, so it blocks until every kernel "
        "queued before it has finished and the copy is done (`aten::_local_scalar_dense` then "
        "`cudaStreamSynchronize` in a profile). Once per step, the queue empties every step and the GPU idles "
        "while Python prepares the next one: the launch overhead of the whole step is no longer hidden."
    )
    example = (
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.item()\n"
    )
    use_instead = (
        'running_loss = torch.zeros((), device="cuda")\n'
        "for step, (x, y) in enumerate(train_loader):\n"
        "    loss = criterion(model(x.cuda()), y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    running_loss += loss.detach()\n"
        "    if step % log_interval == 0:\n"
        "        print(running_loss.item() / (step + 1))\n"
    )
    fix_safety = (
        "No automatic fix: moving the sync changes when values are read, and an accumulator kept on the "
        "device must be detached so it does not keep each step's autograd graph alive."
    )
    valid = (
        # A flag set from a periodic test guards the logging (SfmLearner's `log_losses`).
        "import torch\n"
        "model = Net().cuda()\n"
        "for i, (x, y) in enumerate(train_loader):\n"
        "    log_losses = i > 0 and i % args.print_freq == 0\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    if log_losses:\n"
        "        writer.add_scalar('loss', loss.item(), i)\n",
        # Every arm of an `if`/`elif`/`else` turns the output into a NumPy array: the reads after it
        # read NumPy values (wavenet_vocoder's `batch_wavegen`).
        "import torch\n"
        "model = Net().cuda()\n"
        "for x in test_loader:\n"
        "    with torch.no_grad():\n"
        "        y = model(x.cuda(non_blocking=True))\n"
        "    if mode == 'quantized':\n"
        "        y = y.argmax(1).cpu().numpy()\n"
        "    elif mode == 'mulaw':\n"
        "        y = y.squeeze(1).cpu().numpy()\n"
        "    else:\n"
        "        y = y.cpu().numpy()\n"
        "    peak = y.max().item()\n",
        # A metric logger whose `update(**kwargs)` reads each value, handed only Python numbers.
        _METRIC_LOGGER.replace("MARK", "") + "for step, x in enumerate(train_loader):\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    if step % 100 == 0:\n"
        "        value = loss.item()\n"
        "    meters.update(step=step, lr=optimizer.param_groups[0]['lr'])\n",
        # XLM's `mask_out`: the array the first line makes is replaced by a host tensor in the same
        # block, so the read after the `if` sees only host tensors.
        "import numpy as np\n"
        "import torch\n"
        "model = Net().cuda()\n"
        "def mask_out(x, params):\n"
        "    if params.sample_alpha == 0:\n"
        "        pred_mask = np.random.rand(*x.shape) <= params.word_pred\n"
        "        pred_mask = torch.from_numpy(pred_mask.astype(np.uint8))\n"
        "    else:\n"
        "        pred_mask = torch.zeros(x.shape, dtype=torch.uint8)\n"
        "    n = pred_mask.sum().item()\n"
        "    return pred_mask, n\n"
        "for x in train_loader:\n"
        "    mask, n = mask_out(x, params)\n"
        "    loss = model(x.cuda(non_blocking=True))[mask.cuda(non_blocking=True)].sum()\n"
        "    loss.backward()\n",
        # Periodic logging: the sync happens once per interval, not per step.
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for step, (x, y) in enumerate(train_loader):\n"
        "    loss = model(x.to(device)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 100 == 0:\n"
        "        print(step, loss.item())\n",
        # A CPU-only script: there is no device to wait for.
        "import torch\n"
        "for x, y in train_loader:\n"
        "    loss = model(x).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    total += loss.item()\n",
        # NumPy values are not tensors; dict.items() is not .item().
        "import numpy as np\n"
        "import torch\n"
        "model.cuda()\n"
        "for batch in loader:\n"
        "    stats = np.mean(batch_times).item()\n"
        "    for key, value in metrics.items():\n"
        "        pass\n"
        "    loss = model(batch.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once per epoch, after the step loop, is fine.
        "import torch\n"
        "for epoch in range(10):\n"
        "    total = torch.zeros((), device='cuda')\n"
        "    for x, y in train_loader:\n"
        "        loss = model(x.cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        total += loss.detach()\n"
        "    print(epoch, total.item())\n",
        # A helper that takes numbers or tensors and converts what it is given (DINO's MetricLogger):
        # a sync only where a caller is shown to pass a device tensor, and these callers pass floats.
        "import torch\n"
        "class MetricLogger:\n"
        "    def record(self, **kwargs):\n"
        "        for k, v in kwargs.items():\n"
        "            if isinstance(v, torch.Tensor):\n"
        "                v = v.item()\n"
        "            self.meters[k].update(v)\n"
        "metric_logger = MetricLogger()\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if step % 10 == 0:\n"
        "        loss_value = loss.item()\n"
        "    metric_logger.record(loss=loss_value, lr=optimizer.param_groups[0]['lr'])\n",
        # `.data[0]` of an output is its first image, handed on as an array: no read.
        "import torch\n"
        "model = Net().cuda()\n"
        "for x in loader:\n"
        "    fake = model(x.cuda(non_blocking=True))\n"
        "    images.append(tensor2im(fake.data[0]))\n"
        "    first = fake.data[0].cpu()\n",
        # The scaler's state saved once per epoch, in a checkpoint, is fine; so is the first few steps' look.
        "import torch\n"
        "scaler = torch.cuda.amp.GradScaler()\n"
        "for epoch in range(10):\n"
        "    for i, (x, y) in enumerate(train_loader):\n"
        "        loss = model(x.cuda()).sum()\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "        if i < 3:\n"
        "            print(loss.item())\n"
        "    torch.save({'scaler': scaler.state_dict()}, 'ckpt.pt')\n",
    )
    invalid = (
        # The same logger: a caller passes the loss itself.
        _METRIC_LOGGER.replace("MARK", "  # expect: LA101") + "for x in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    meters.update(loss=loss, lr=optimizer.param_groups[0]['lr'])\n",
        # A count read at once waits twice; the line is one finding (LA105 leaves it to this rule).
        "import torch\n"
        "for x, t in loader:\n"
        "    ts = schedule.timesteps.to('cuda')\n"
        "    index = (ts == t.cuda(non_blocking=True)).nonzero().item()  # expect: LA101\n"
        "    model(x.cuda(non_blocking=True), index).sum().backward()\n"
        "    optimizer.step()\n",
        # The gradient scaler's scale, read every step, is an `.item()` in disguise (DeiT, MAE).
        "import torch\n"
        "loss_scaler = NativeScaler()\n"
        "for samples, targets in data_loader:\n"
        "    samples = samples.cuda(non_blocking=True)\n"
        "    loss = criterion(model(samples), targets)\n"
        "    loss_scaler(loss, optimizer, parameters=model.parameters())\n"
        "    optimizer.step()\n"
        "    metric_logger.update(loss_scale=loss_scaler.state_dict()['scale'])  # expect: LA101\n",
        "import torch\n"
        "device = 'cuda'\n"
        "for epoch in range(10):\n"
        "    running_loss = 0.0\n"
        "    for i, (inputs, labels) in enumerate(trainloader):\n"
        "        outputs = net(inputs.to(device))\n"
        "        loss = criterion(outputs, labels.to(device))\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        running_loss += loss.item()  # expect: LA101\n"
        "        if i % 2000 == 1999:\n"
        "            print(running_loss / 2000)\n",
        # Evaluation steps count too, and .tolist() is the same sync.
        "import torch\n"
        "model = model.cuda()\n"
        "with torch.no_grad():\n"
        "    for data, target in test_loader:\n"
        "        output = model(data.cuda())\n"
        "        pred = output.argmax(dim=1)\n"
        "        correct += (pred == target.cuda()).sum().item()  # expect: LA101\n"
        "        predictions.extend(pred.tolist())  # related: LA101\n",
        # The reads of one step are one finding, at the first, the others its related lines; a read in
        # another body (the loop over the metrics runs its own) is a problem of its own, and a read
        # suppressed on its line is left out of the group.
        "import torch\n"
        "model = model.cuda()\n"
        "for x, y in train_loader:\n"
        "    loss, metrics = model(x.cuda(non_blocking=True), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    meter.update(loss.item())  # noqa: LA101\n"
        "    for name, value in metrics.items():\n"
        "        writer.add_scalar(name, value.item())  # expect: LA101\n"
        "    lr = scheduler.get_last_lr()[0]\n"
        "    pbar.set_postfix(loss=loss.item(), lr=lr)  # expect: LA101\n"
        "    if loss.isfinite().item():  # related: LA101\n"
        "        history.append(metrics['acc'].item())  # related: LA101\n",
        # Reads in the two arms of one `if` never run in the same step: two problems, not one.
        "import torch\n"
        "model = model.cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    if num_gpus > 1:\n"
        "        reduced = reduce_tensor(loss.data, num_gpus).item()  # expect: LA101\n"
        "    else:\n"
        "        reduced = loss.item()  # expect: LA101\n"
        "    print(reduced, loss.grad_fn is None)\n",
        # A progress bar updated every step.
        "import torch\n"
        "from tqdm import tqdm\n"
        "model.to('cuda')\n"
        "pbar = tqdm(train_loader)\n"
        "for batch in pbar:\n"
        "    loss = model(batch.to('cuda')).mean()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    pbar.set_postfix(loss=loss.item())  # expect: LA101\n",
        # PyTorch 0.3's scalar read: the loss was a one-element tensor and `.data[0]` its `.item()`.
        "import torch\n"
        "import torch.nn.functional as F\n"
        "from torch.autograd import Variable\n"
        "model = Net().cuda()\n"
        "for data, target in train_loader:\n"
        "    data, target = Variable(data.cuda()), Variable(target.cuda())\n"
        "    output = model(data)\n"
        "    loss = F.nll_loss(output, target)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    losses.append(loss.data[0])  # expect: LA101\n"
        "    mse.append(F.mse_loss(output, target).data[0])  # related: LA101\n",
        # A Lightning step hook runs once per step on the accelerator.
        "import torch\n"
        "import lightning as L\n"
        "class LitModel(L.LightningModule):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        x, y = batch\n"
        "        loss = torch.nn.functional.cross_entropy(self(x), y)\n"
        "        self.log('train_loss', loss.item())  # expect: LA101\n"
        "        return loss\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.Call, cst.Subscript)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if isinstance(node, cst.Subscript):
            if _legacy_read(node, ctx) is not None:
                yield Report(
                    node,
                    f"`{ctx.source(node)}` is PyTorch 0.3's `.item()`: it copies a GPU value to the host, and the CPU "
                    "stalls until the GPU drains, once per step",
                    group=_reads_in_step(node, ctx),
                    suggestion=(
                        "since PyTorch 0.4 a loss is a 0-dim tensor and `.data[0]` raises: keep the running value on "
                        "the device (`total += loss.detach()`) and call `.item()` only at the log interval"
                    ),
                )
            return
        node = cast(cst.Call, node)  # node_types
        scaler = ctx.method_call(node, "get_scale", "state_dict")
        if scaler is not None and _is_grad_scaler(scaler, ctx):
            yield Report(
                node,
                f"`{ctx.source(node)}` reads the gradient scaler's scale with a hidden `.item()`: the CPU stalls "
                "until the GPU drains, once per step",
                group=_reads_in_step(node, ctx),
            )
            return
        receiver = ctx.method_call(node, "item", "tolist")
        if receiver is None or node.args or not ctx.maybe_tensor(receiver):
            return
        what = "tensor" if cast(cst.Attribute, node.func).attr.value == "tolist" else "value"
        message = (
            f"`{ctx.source(node)}` copies a GPU {what} to the host: the CPU stalls until the GPU drains, once per step"
        )
        if isinstance(receiver, cst.Call) and ctx.method_call(receiver, *DATA_DEPENDENT_METHODS) is not None:
            # `(ts == t).nonzero().item()`: LA105 leaves this line to us, so the message names both waits
            message = (
                f"`{ctx.source(node)}` waits for the GPU twice, once per step: `.{cast(cst.Attribute, receiver.func).attr.value}()` to "
                f"count its elements, `.{cast(cst.Attribute, node.func).attr.value}()` to copy them to the host"
            )
        yield Report(
            node,
            message,
            group=_reads_in_step(node, ctx),
        )
