from __future__ import annotations

import libcst as cst

from loopaudit.rule import Report, Rule


def _is_cpu_device(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """"cpu", torch.device("cpu"), or a name bound only to one of those (`cpu_device`)."""
    if isinstance(expr, cst.SimpleString):
        return expr.evaluated_value == "cpu"
    if isinstance(expr, cst.Call) and ctx.qualified_name(expr.func) == "torch.device" and expr.args:
        return _is_cpu_device(expr.args[0].value, ctx, depth)
    if isinstance(expr, cst.Name) and depth < 2:
        found = ctx.scope.lookup(expr.value)
        bindings = found[0] if found else []
        return bool(bindings) and all(
            b.kind == "value" and _is_cpu_device(b.value, ctx, depth + 1) for b in bindings
        )
    return False


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((arg.value for arg in call.args if arg.keyword and arg.keyword.value == name), None)


def _is_true(expr: cst.BaseExpression | None) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "True"


class DeviceToHostInStep(Rule):
    code = "LA102"
    name = "device-to-host-copy-in-step"
    summary = "`.cpu()`, `.to(\"cpu\")` or `.numpy(force=True)` of a tensor once per step."
    message = "`.cpu()` waits for the GPU and copies to pageable host memory: the CPU stalls until the GPU drains, once per step"
    suggestion = (
        "keep per-step results on the device (append the tensor, or accumulate it) and move them to the "
        "host once, after the loop or at the log interval; if you need the copy every step, use "
        "`.to('cpu', non_blocking=True)` into pinned memory and read it a step later"
    )
    what_it_flags = (
        "A device-to-host copy of a tensor in code that runs once per step of a CUDA script: `.cpu()`, "
        "`.to(\"cpu\")`, `.to(device=\"cpu\")`, `.to(torch.device(\"cpu\"))` and `.numpy(force=True)`, "
        "typically in `preds.append(out.argmax(1).cpu().numpy())`. A line with both `.cpu()` and "
        "`.numpy()` is one finding. A plain `.numpy()` is not flagged: on a CUDA tensor it raises, so in a "
        "working script it reads a tensor that is already on the host (the copy that put it there is the "
        "finding). Copies with `non_blocking=True` are not flagged, nor are copies in a branch only a CPU run "
        "takes (`if mode == \"cpu\":`, `if not torch.cuda.is_available():`)."
    )
    why_it_costs = (
        "A blocking device-to-host copy is queued behind every kernel already launched, and the CPU waits "
        "for it (`Memcpy DtoH` and `cudaStreamSynchronize` in a profile). Once per step, the GPU's queue "
        "drains every step, and the copy into pageable memory goes through a staging buffer."
    )
    example = (
        "for images, labels in val_loader:\n"
        "    logits = model(images.cuda())\n"
        "    all_preds.append(logits.argmax(1).cpu().numpy())\n"
    )
    use_instead = (
        "for images, labels in val_loader:\n"
        "    logits = model(images.cuda())\n"
        "    all_preds.append(logits.argmax(1))\n"
        "all_preds = torch.cat(all_preds).cpu().numpy()  # one copy, after the loop\n"
    )
    fix_safety = "No automatic fix: what the host code does with the values decides where the copy can go."
    valid = (
        # A branch that only a CPU run takes (YOLOX's fallback after running out of GPU memory).
        "import torch\n"
        "def assign(boxes, preds, mode='gpu'):\n"
        "    if mode == 'cpu':\n"
        "        boxes, preds = boxes.cpu().float(), preds.cpu().float()\n"
        "    return match(boxes, preds)\n"
        "model = Net().cuda()\n"
        "for x, boxes in train_loader:\n"
        "    preds = model(x.cuda(non_blocking=True))\n"
        "    loss = assign(boxes.cuda(non_blocking=True), preds).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, after the loop.
        "import torch\n"
        "preds = []\n"
        "for x, y in val_loader:\n"
        "    preds.append(model(x.cuda()).argmax(1))\n"
        "preds = torch.cat(preds).cpu().numpy()\n",
        # A non-blocking copy does not stall the host.
        "import torch\n"
        "for x, y in val_loader:\n"
        "    out = model(x.cuda())\n"
        "    host = out.to('cpu', non_blocking=True)\n",
        # A plain .numpy() reads a host tensor (on a CUDA tensor it would raise).
        "import torch\n"
        "model.cuda()\n"
        "for x, y in loader:\n"
        "    histogram.update(y.numpy())\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # A conversion helper called once per step: its `return` ends the call, not the loop.
        "import numpy as np\n"
        "import torch\n"
        "def tonumpy(data):\n"
        "    if isinstance(data, np.ndarray):\n"
        "        return data\n"
        "    if isinstance(data, torch.Tensor):\n"
        "        return data.detach().cpu().numpy()  # expect: LA102\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(tonumpy(loss))\n",
        "import torch\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "for images, labels in val_loader:\n"
        "    logits = model(images.to(device))\n"
        "    all_preds.append(logits.argmax(1).cpu().numpy())  # expect: LA102\n"
        "    all_probs.append(logits.softmax(1).to('cpu'))  # expect: LA102\n"
        "    feats.append(logits.to(torch.device('cpu')))  # expect: LA102\n"
        "    raw.append(logits.numpy(force=True))  # expect: LA102\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.Call,)

    def check(self, node, ctx):
        receiver = ctx.method_call(node, "cpu")
        if receiver is not None:
            if ctx.maybe_tensor(receiver):
                yield Report(node, f"`{ctx.source(node)}` waits for the GPU and copies to pageable host memory: the CPU stalls until the GPU drains, once per step")
            return
        receiver = ctx.method_call(node, "to")
        if receiver is not None:
            target = node.args[0].value if node.args and node.args[0].keyword is None else _keyword(node, "device")
            if (
                target is not None
                and _is_cpu_device(target, ctx)
                and not _is_true(_keyword(node, "non_blocking"))
                and ctx.maybe_tensor(receiver)
            ):
                yield Report(node, f"`{ctx.source(node)}` waits for the GPU and copies to the host: the CPU stalls until the GPU drains, once per step")
            return
        receiver = ctx.method_call(node, "numpy")
        if receiver is not None and _is_true(_keyword(node, "force")) and ctx.maybe_tensor(receiver):
            yield Report(node, "`.numpy(force=True)` copies a GPU tensor to the host: the CPU stalls until the GPU drains, once per step")
