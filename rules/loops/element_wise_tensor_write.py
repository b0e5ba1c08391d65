from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import FrameKind, Report, Rule, RuleContext
from loopaudit.rules.loops._batch import (
    TENSORS,
    body_assigned_from,
    is_ragged,
    is_recurrence,
    sized_range_loop,
    slice_names,
    step_like,
    target_names,
    tensor_kind,
)
from loopaudit.rules.loops._per_sample import per_sample_work


class ElementWiseTensorWrite(Rule):
    code = "LA302"
    name = "element-wise-tensor-write"
    summary = "Element-by-element writes into a tensor in a Python loop over its size, once per step."
    message = "this writes one element of a tensor per loop iteration: one indexing kernel per element, every step"
    suggestion = (
        "write all elements at once: `t[idx] = values`, `t.index_add_(0, idx, values)`, "
        "`t.scatter_(dim, idx, values)`, `torch.where(mask, a, b)`, or build the tensor with one operation"
    )
    what_it_flags = (
        "An assignment or augmented assignment to a tensor element (`t[i] = v`, `t[i, j] += v`, "
        "`t[:, i] = v`, `t[ids[i]] += v`) inside a `for` loop over "
        "`range(<a tensor's size>)` (`range(x.size(1))`, `range(len(labels))`, `range(n)` with "
        "`n = x.shape[0]`, nested loops over two dimensions), in code that runs once per step on any "
        "device. The tensor written must be shown to be a tensor (`torch.zeros(...)`, a model output). "
        "Not flagged: writes into Python lists, step loops, loops with a stride, recurrences that read "
        "the previous iteration's result (`h = cell(x[t], h)`) and ragged loops that slice each row to "
        "its own length (`padded[i, :lengths[i]] = seq`). Nor are the writes of a loop that does other "
        "work on each sample of the batch (`idx = ids[b].item()` then `totals[idx] += probs[b]`): LA301 "
        "reports that loop, and its writes are part of the one problem."
    )
    why_it_costs = (
        "Each `t[i] = v` is a separate `aten::copy_` or `aten::index_put_` call dispatched from Python: on "
        "a GPU one kernel launch per element (several microseconds each), on a CPU the same per-op "
        "dispatch overhead, where one vectorized write would handle the whole batch in one launch. When "
        "the value or index comes from `.item()` on a device tensor, every iteration also waits for the GPU."
    )
    example = (
        "for x, y in loader:\n"
        "    logits = model(x.cuda())\n"
        "    onehot = torch.zeros(y.size(0), num_classes, device='cuda')\n"
        "    for i in range(y.size(0)):\n"
        "        onehot[i, y[i]] = 1.0\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    logits = model(x.cuda())\n"
        "    onehot = F.one_hot(y.cuda(), num_classes).float()\n"
        "    # or: onehot.scatter_(1, y.cuda().unsqueeze(1), 1.0)\n"
    )
    fix_safety = (
        "No automatic fix: with repeated indices, `t[idx] = v` keeps one of the values and `t[idx] += v` "
        "adds only once; use `index_add_`/`scatter_add_` when indices can repeat."
    )
    valid = (
        # A loop that reads each sample's index back (`.item()`) and writes with it: LA301's finding.
        "import torch\n"
        "model.cuda()\n"
        "totals = torch.zeros(num_items, 10, device='cuda')\n"
        "for x, ids in val_loader:\n"
        "    probs = model(x.cuda()).softmax(dim=1)\n"
        "    for b in range(len(ids)):\n"
        "        idx = ids[b].item()\n"
        "        totals[idx] += probs[b]\n",
        # Each pathway of a multi-pathway batch (a list) replaced by its copy on the device (SlowFast).
        "import torch\n"
        "model = Net().cuda()\n"
        "for inputs, labels in loader:\n"
        "    for i in range(len(inputs)):\n"
        "        inputs[i] = inputs[i].cuda(non_blocking=True)\n"
        "    loss = model(inputs).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The batch turned into a numpy array before the helper writes it row by row: the name is
        # read where the block last bound it, not merged with the tensors it is bound to later.
        "import torch\n"
        "def scale_rows(batch_data):\n"
        "    for b in range(batch_data.shape[0]):\n"
        "        batch_data[b, :, :] *= 2.0\n"
        "    return batch_data\n"
        "for points, target in train_loader:\n"
        "    points = points.numpy()\n"
        "    points = scale_rows(points)\n"
        "    points = torch.Tensor(points).cuda(non_blocking=True)\n"
        "    loss = model(points).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # One vectorized write.
        "import torch\n"
        "import torch.nn.functional as F\n"
        "for x, y in train_loader:\n"
        "    y = y.cuda()\n"
        "    target = torch.zeros(y.size(0), 10, device='cuda')\n"
        "    target.scatter_(1, y.unsqueeze(1), 1.0)\n"
        "    loss = F.mse_loss(model(x.cuda()), target)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A Python list, a recurrence writing its outputs per time step, and a ragged padding loop.
        "import torch\n"
        "device = 'cuda'\n"
        "for x, lengths in train_loader:\n"
        "    x = x.to(device)\n"
        "    names = [None] * len(x)\n"
        "    outputs = torch.zeros_like(x)\n"
        "    padded = torch.zeros(x.size(0), 50, device=device)\n"
        "    h = torch.zeros(x.size(1), 64, device=device)\n"
        "    for i in range(len(x)):\n"
        "        names[i] = str(i)\n"
        "    for t in range(x.size(0)):\n"
        "        h = cell(x[t], h)\n"
        "        outputs[t] = h\n"
        "    for i in range(x.size(0)):\n"
        "        padded[i, :lengths[i]] = x[i, :lengths[i]]\n"
        "    loss = model(outputs).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for images, labels in train_loader:\n"
        "    images, labels = images.to(device), labels.to(device)\n"
        "    onehot = torch.zeros(labels.size(0), 10, device=device)\n"
        "    for i in range(labels.size(0)):\n"
        "        onehot[i, labels[i]] = 1.0  # expect: LA302\n"
        "    loss = criterion(model(images), onehot)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Nested loops over two dimensions, and a scatter through an index read per element.
        "import torch\n"
        "model.cuda()\n"
        "totals = torch.zeros(num_items, 10, device='cuda')\n"
        "with torch.no_grad():\n"
        "    for step, (x, ids) in enumerate(val_loader):\n"
        "        probs = model(x.cuda()).softmax(dim=1)\n"
        "        B, C = probs.shape\n"
        "        for b in range(B):\n"
        "            for c in range(C):\n"
        "                probs[b, c] += prior[c]  # expect: LA302\n"
        "        for b in range(len(ids)):\n"
        "            totals[ids[b]] += probs[b]  # expect: LA302\n",
    )

    node_types = (cst.Assign, cst.AugAssign)
    needs_cuda = False

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast("cst.Assign | cst.AugAssign", node)  # node_types
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        for target in targets:
            if not isinstance(target, cst.Subscript) or tensor_kind(target.value, ctx) not in TENSORS:
                continue
            if _replaces_with_moved_copy(target, node.value):
                continue  # `inputs[i] = inputs[i].cuda()`: a list of tensors, each replaced by its copy
            loop = self._element_loop(target, ctx)
            if loop is not None:
                header = ctx.source(loop.iter, 36)
                yield Report(
                    node,
                    f"`{ctx.source(target, 30)}` is written once per iteration of `for ... in {header}`: "
                    "one indexing kernel per element, every step, where one vectorized write would do",
                )
                return

    def _element_loop(self, target: cst.Subscript, ctx) -> cst.For | None:
        """The enclosing loop over a tensor's size whose variable (or a value read per element) indexes `target`."""
        written = slice_names(target)
        if any(isinstance(loop, cst.For) and per_sample_work(loop, ctx) is not None for loop in _enclosing_loops(ctx)):
            return None  # inside a loop over the batch's samples: LA301 reports it, writes and all
        frame = ctx.frame
        while frame is not None and frame.kind is not FrameKind.FUNCTION:
            if frame.kind is FrameKind.LOOP:
                loop = frame.node
                if step_like(loop, ctx):
                    return None  # loops around the step loop run once per epoch
                if isinstance(loop, cst.For) and sized_range_loop(loop, ctx, frame.loop.scope) is not None:
                    indices = set(target_names(loop.target))
                    if indices and written & body_assigned_from(loop, indices):
                        if is_recurrence(loop) or is_ragged(loop, indices):
                            return None
                        return loop
            frame = frame.parent
        return None


def _enclosing_loops(ctx) -> list[cst.CSTNode]:
    """The loops around the node being checked, inside its function, innermost first, up to the
    step loop (the loops around that one run once per epoch)."""
    loops, frame = [], ctx.frame
    while frame is not None and frame.kind is not FrameKind.FUNCTION:
        if frame.kind is FrameKind.LOOP:
            if step_like(frame.node, ctx):
                break
            loops.append(frame.node)
        frame = frame.parent
    return loops


def _replaces_with_moved_copy(target: cst.Subscript, value: cst.BaseExpression | None) -> bool:
    """`inputs[i] = inputs[i].cuda(non_blocking=True)`: the slot gets a moved copy of what it held.
    On a tensor that would be a no-op, so the container is a list (SlowFast's multi-pathway inputs)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in ("cuda", "to", "float", "half", "contiguous"):
            value = value.func.value
        else:
            return False
    return isinstance(value, cst.Subscript) and value.deep_equals(target)
