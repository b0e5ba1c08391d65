from __future__ import annotations

import re
from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import Group, Kind, Report, Rule, RuleContext

_TORCH_FUNCTIONS = {
    "torch.nonzero": "torch.nonzero",
    "torch.argwhere": "torch.argwhere",
    "torch.masked_select": "torch.masked_select",
    "torch.unique": "torch.unique",
    "torch.unique_consecutive": "torch.unique_consecutive",
}
# Tensor methods whose output size depends on the data (also read by LA101, item.py).
DATA_DEPENDENT_METHODS = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"})
_MASK_METHODS = frozenset(
    {
        "eq",
        "ne",
        "gt",
        "ge",
        "lt",
        "le",
        "isnan",
        "isinf",
        "isfinite",
        "logical_and",
        "logical_or",
        "logical_not",
        "bool",
    }
)
# Methods that reshape a tensor and keep its elements: a reshaped mask is a mask.
_RESHAPES = (
    "unsqueeze",
    "expand",
    "expand_as",
    "view",
    "view_as",
    "reshape",
    "squeeze",
    "flatten",
    "repeat",
    "permute",
    "transpose",
    "contiguous",
)
# Node-split masks of full-batch graph training: PyG's `data.train_mask` and DGL's
# `g.ndata["train_mask"]` are boolean tensors by convention. Other `*_mask` names (an int64
# `attention_mask`, GAT's integer `mask_train`) are not assumed to be boolean.
_SPLIT_MASK = re.compile(r"^(train|val|valid|validation|test|eval)_mask$")
_MASK_FUNCTIONS = frozenset(
    {
        "torch.isnan",
        "torch.isinf",
        "torch.isfinite",
        "torch.logical_and",
        "torch.logical_or",
        "torch.logical_not",
        "torch.eq",
        "torch.ne",
        "torch.gt",
        "torch.lt",
        "torch.ge",
        "torch.le",
    }
)


class DataDependentShapeInStep(Rule):
    code = "LA105"
    name = "data-dependent-shape-in-step"
    summary = "An op whose output size depends on tensor values (`nonzero`, `unique`, `x[mask]`) once per step."
    message = "the output's size depends on the data, so the CPU waits for the GPU to count it: a sync once per step"
    suggestion = (
        "keep shapes static: `torch.where(mask, x, 0)` or `x * mask` instead of `x[mask]`, a masked mean "
        "`(x * mask).sum() / mask.sum()` instead of `x[mask].mean()`, or `nonzero_static(size=...)`"
    )
    what_it_flags = (
        "In code that runs once per step of a CUDA script: `torch.nonzero`/`.nonzero()`, "
        "`torch.argwhere`, `torch.masked_select`, `torch.unique`/`.unique()`, `unique_consecutive`, "
        "one-argument `torch.where(cond)`, and boolean-mask indexing `x[mask]` where the mask is a comparison "
        "written inline (`logits[labels != -100]`), assigned from one in the same function or returned as one by a "
        "function of the module (`fg_mask, _ = self.in_boxes(...)`), also along another dimension (`x[:, mask]`), or a graph "
        'split mask (`out[data.train_mask]`, `g.ndata["val_mask"]`: boolean in PyG and DGL). Writing '
        "through a mask (`x[mask] = 0`) is not flagged: PyTorch turns it into a `masked_fill_` without a sync. "
        "The uses of one mask in one step (until it is assigned again) are one finding, at the first, naming "
        "the lines of the others: its indices, found once, serve them all with one sync."
    )
    why_it_costs = (
        "The size of the result is only known once the GPU has evaluated the mask. PyTorch must allocate the "
        "output on the host's say-so, so it copies the count back and waits for it (`aten::nonzero` followed "
        "by `cudaStreamSynchronize` or a blocking `Memcpy DtoH` in a profile). Every later kernel of the step "
        "is launched only after that."
    )
    example = (
        "for batch in loader:\n"
        "    logits = model(batch['input_ids'].cuda())\n"
        "    labels = batch['labels'].cuda()\n"
        "    active = labels != -100\n"
        "    loss = F.cross_entropy(logits[active], labels[active])\n"
    )
    use_instead = (
        "for batch in loader:\n"
        "    logits = model(batch['input_ids'].cuda())\n"
        "    labels = batch['labels'].cuda()\n"
        "    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)\n"
    )
    fix_safety = "No automatic fix: the static-shape formulation depends on what the selected values are used for."
    valid = (
        # Counted and read at once (diffusers' `get_sigmas`): one place that waits, reported by LA101.
        "import torch\n"
        "for x, t in loader:\n"
        "    ts = schedule.timesteps.to('cuda')\n"
        "    index = (ts == t.cuda(non_blocking=True)).nonzero().item()\n"
        "    model(x.cuda(non_blocking=True), index).sum().backward()\n"
        "    optimizer.step()\n",
        # A name that says mask, made by a method of a value here: nothing says it is boolean.
        "import torch\n"
        "def gather_feat(feat, mask):\n"
        "    mask = mask.unsqueeze(2).expand_as(feat)\n"
        "    return feat[mask]\n"
        "for x, m in loader:\n"
        "    out = gather_feat(model(x.cuda(non_blocking=True)), m.cuda(non_blocking=True))\n"
        "    out.sum().backward()\n"
        "    optimizer.step()\n",
        # Counting on the host: the sizes are Python numbers made into a CPU tensor (DINO's multi-crop).
        "import torch\n"
        "class MultiCrop(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        idx = torch.cumsum(torch.unique_consecutive(torch.tensor([i.shape[-1] for i in x]), return_counts=True)[1], 0)\n"
        "        return [self.backbone(torch.cat(x[a:b])) for a, b in zip([0, *idx[:-1]], idx)]\n"
        "model = MultiCrop().cuda()\n"
        "for images, _ in train_loader:\n"
        "    loss = model([im.cuda(non_blocking=True) for im in images])[0].sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Static-shape formulations.
        "import torch\n"
        "model.cuda()\n"
        "for x, y in loader:\n"
        "    out = model(x.cuda())\n"
        "    mask = y.cuda() > 0\n"
        "    kept = torch.where(mask, out, 0)\n"
        "    out[mask] = 0\n"
        "    loss = (out * mask).sum() / mask.sum().clamp(min=1)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, before training.
        "import torch\n"
        "classes = torch.unique(torch.tensor(dataset.targets))\n"
        "for x, y in loader:\n"
        "    loss = model(x.cuda()).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # SSD's MultiBoxLoss: the mask of positive priors, reshaped to the boxes' shape, indexes both.
        "import torch\n"
        "for images, targets in train_loader:\n"
        "    loc_data, conf_data = model(images.cuda(non_blocking=True))\n"
        "    targets = targets.cuda(non_blocking=True)\n"
        "    conf_t, loc_t = targets[..., 0], targets[..., 1:]\n"
        "    pos = conf_t > 0\n"
        "    pos_idx = pos.unsqueeze(pos.dim()).expand_as(loc_data)\n"
        "    loc_p = loc_data[pos_idx].view(-1, 4)  # expect: LA105\n"
        "    loc_g = loc_t[pos_idx].view(-1, 4)  # related: LA105\n"
        "    loss = torch.nn.functional.smooth_l1_loss(loc_p, loc_g)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A mask another module's function returns: its code is not read here, its name says what it is
        # (SSD's box loss); a method of a local value named `mask` is not enough.
        "import torch\n"
        "from ssd.utils import box_utils\n"
        "class MultiBoxLoss(torch.nn.Module):\n"
        "    def forward(self, confidence, labels):\n"
        "        with torch.no_grad():\n"
        "            loss = -torch.log_softmax(confidence, dim=2)[:, :, 0]\n"
        "            mask = box_utils.hard_negative_mining(loss, labels, 3)\n"
        "        confidence = confidence[mask, :]  # expect: LA105\n"
        "        return torch.nn.functional.cross_entropy(confidence, labels[mask])  # related: LA105\n"
        "criterion = MultiBoxLoss().cuda()\n"
        "for images, labels in train_loader:\n"
        "    loss = criterion(model(images.cuda(non_blocking=True)), labels.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A mask of what `.sort()` returns (its elements are tensors), read where the block rebinds it.
        "import torch\n"
        "def query_ball_point(nsample, xyz):\n"
        "    n = xyz.shape[1]\n"
        "    group_idx = torch.arange(n, device=xyz.device).repeat(xyz.shape[0], 1)\n"
        "    group_idx = group_idx.sort(dim=-1)[0][:, :nsample]\n"
        "    group_first = group_idx[:, :1].repeat(1, nsample)\n"
        "    mask = group_idx == n\n"
        "    group_idx[mask] = group_first[mask]  # expect: LA105\n"
        "    return group_idx\n"
        "for x, y in loader:\n"
        "    idx = query_ball_point(32, x.cuda(non_blocking=True))\n"
        "    loss = model(x, idx).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A mask computed by a helper and returned, and a mask along the second dimension (YOLOX's head);
        # the uses of one mask in one body are one finding, at the first.
        "import torch\n"
        "class Head(torch.nn.Module):\n"
        "    def in_boxes(self, centers, boxes):\n"
        "        inside = (centers[:, None] - boxes[None]).abs().sum(dim=-1) < 1\n"
        "        anchors = inside.sum(dim=0) > 0\n"
        "        return anchors, inside\n"
        "    def forward(self, preds, centers, boxes):\n"
        "        fg_mask, inside = self.in_boxes(centers, boxes)\n"
        "        fg = preds[fg_mask]  # expect: LA105\n"
        "        return inside[:, fg_mask].sum() + fg.sum()  # related: LA105\n"
        "head = Head().cuda()\n"
        "for x, centers, boxes in train_loader:\n"
        "    loss = head(model(x.cuda(non_blocking=True)), centers.cuda(non_blocking=True), boxes.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch\n"
        "import torch.nn.functional as F\n"
        "device = 'cuda'\n"
        "for batch in train_loader:\n"
        "    logits = model(batch['input_ids'].to(device))\n"
        "    labels = batch['labels'].to(device)\n"
        "    active = labels != -100\n"
        "    loss = F.cross_entropy(logits[active], labels[active])  # expect: LA105\n"
        "    idx = torch.nonzero(labels)  # expect: LA105\n"
        "    seen = labels.unique()  # expect: LA105\n"
        "    pos = torch.where(labels > 0)  # expect: LA105\n"
        "    picked = torch.masked_select(logits, logits > 0)  # expect: LA105\n"
        "    node_loss = F.cross_entropy(logits[data.train_mask], labels[data.train_mask])  # expect: LA105\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )

    confirmed_by = ("LA601",)
    node_types = (cst.Call, cst.Subscript)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        if isinstance(node, cst.Subscript):
            yield from self._mask_index(node, ctx)
            return
        node = cast(cst.Call, node)  # node_types
        qualified = ctx.qualified_name(node.func) or ""
        if qualified in _TORCH_FUNCTIONS:
            first = next((arg.value for arg in node.args if arg.keyword is None and not arg.star), None)
            if first is not None and ctx.kind(first) in (Kind.HOST_TENSOR, Kind.NOT_TENSOR):
                return  # counting on the host: `torch.unique(torch.tensor(sizes))` waits for no GPU
            yield Report(
                node,
                f"`{qualified}` returns a data-dependent number of elements: the CPU waits for the GPU to count them, once per step",
            )
            return
        if qualified == "torch.where":
            if len(node.args) == 1 and node.args[0].keyword is None:
                yield Report(
                    node,
                    "one-argument `torch.where` is `nonzero`: the CPU waits for the GPU to count the matches, once per step",
                )
            return
        receiver = ctx.method_call(node, *DATA_DEPENDENT_METHODS)
        if receiver is not None and _read_at_once(node, ctx):
            return  # `(ts == t).nonzero().item()`: one place that waits, reported once, by LA101
        if receiver is not None and ctx.maybe_tensor(receiver) and not _is_static_nonzero(node):
            method = cast(cst.Attribute, node.func).attr.value
            yield Report(
                node,
                f"`.{method}()` returns a data-dependent number of elements: the CPU waits for the GPU to count them, once per step",
            )

    def _mask_index(self, node: cst.Subscript, ctx):
        if id(node) in ctx.index.stored_subscripts:
            return
        # `x[mask]`, or a mask along another dimension with whole slices around it: `x[:, mask]`
        indexes = [e.slice for e in node.slice if not _is_whole_slice(e.slice)]
        if len(indexes) != 1 or not isinstance(indexes[0], cst.Index):
            return
        element = indexes[0]
        if self._is_mask(element.value, ctx, depth=0) and ctx.maybe_tensor(node.value):
            yield Report(
                node,
                f"`{ctx.source(node)}` indexes with a boolean mask: the result's size depends on the data, so the CPU waits for the GPU to count it, once per step",
                group=_uses_of_mask(node, element.value, ctx),
            )

    def _is_mask(self, expr: cst.BaseExpression, ctx, depth: int) -> bool:
        if depth > 5:
            return False
        if isinstance(expr, cst.Comparison):
            plain = all(
                isinstance(
                    c.operator,
                    (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual),
                )
                for c in expr.comparisons
            )
            return plain and ctx.is_tensor(expr)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert):
            return self._is_mask(expr.expression, ctx, depth + 1)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)):
            return self._is_mask(expr.left, ctx, depth + 1) or self._is_mask(expr.right, ctx, depth + 1)
        if isinstance(expr, cst.Call):
            if (ctx.qualified_name(expr.func) or "") in _MASK_FUNCTIONS:
                return True
            receiver = ctx.method_call(expr, *_MASK_METHODS)
            if receiver is not None:
                return ctx.is_tensor(receiver)
            # `pos.unsqueeze(pos.dim()).expand_as(loc_data)` (SSD's MultiBoxLoss): the same mask, reshaped
            receiver = ctx.method_call(expr, *_RESHAPES)
            return receiver is not None and self._is_mask(receiver, ctx, depth + 1)
        if isinstance(expr, (cst.Name, cst.Attribute)) and _SPLIT_MASK.match(
            expr.value if isinstance(expr, cst.Name) else expr.attr.value
        ):
            return True
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            key = getattr(expr.slice[0].slice, "value", None)
            if isinstance(key, cst.SimpleString) and _SPLIT_MASK.match(key.value.strip("'\"")):
                return True  # g.ndata["train_mask"]
        if isinstance(expr, cst.Name):
            found = ctx.scope.lookup(expr.value)
            if found is None or found[1] is not ctx.scope:
                return False  # the mask must be computed in the same function
            bindings, scope = found
            if not bindings and expr.value in scope.params:
                return self._parameter_is_mask(expr.value, scope, ctx, depth)
            if _MASK_NAME.match(expr.value) and any(_made_elsewhere(b, ctx) for b in bindings):
                return True  # `mask = box_utils.hard_negative_mining(loss, labels, 3)`: named for what it is
            return any(self._binding_is_mask(b, ctx, depth) for b in bindings)
        return False

    def _returns_mask(self, binding, ctx, depth: int) -> bool:
        """Does the function of this module that the binding's call enters return a mask there (the
        whole value, or the binding's element of a returned tuple)?"""
        site = ctx.steps.call_site(binding.value)
        returned = []
        for function in ctx.steps.resolve(site) if site is not None else ():
            for value in function.returns:
                if binding.kind == "element":
                    if not isinstance(value, cst.Tuple) or binding.position >= len(value.elements):
                        continue
                    value = value.elements[binding.position].value
                returned.append((value, function.scope))
        return self._any_mask(returned, ctx, depth)

    def _parameter_is_mask(self, name: str, scope, ctx, depth: int) -> bool:
        """`def evaluate(..., mask, ...)` called as `evaluate(..., val_mask, ...)`: on that call's path the
        function indexes with a boolean mask, whatever other call sites pass."""
        function = ctx.steps.function_info(scope.function) if scope.function is not None else None
        return self._any_mask(ctx.tensors.arguments_for(name, function) if function is not None else [], ctx, depth)

    def _any_mask(self, candidates, ctx, depth: int) -> bool:
        """Is one of these (expression, scope it is read in) a mask? The rule's context reads each in its scope."""
        saved = ctx.scope
        try:
            for expr, scope in candidates:
                ctx.scope = scope
                if expr is not None and self._is_mask(expr, ctx, depth + 1):
                    return True
        finally:
            ctx.scope = saved
        return False

    def _binding_is_mask(self, binding, ctx, depth: int) -> bool:
        if (
            binding.kind in ("value", "element")
            and isinstance(binding.value, cst.Call)
            and self._returns_mask(binding, ctx, depth)
        ):
            return True  # `fg_mask, matched = self.get_in_boxes_info(...)`, which computes the mask it returns
        if binding.kind == "value":
            return self._is_mask(binding.value, ctx, depth + 1)
        if binding.kind == "loop" and isinstance(binding.value, (cst.List, cst.Tuple)):
            # for mask in [data.train_mask, data.val_mask, data.test_mask]:
            elements = [element.value for element in binding.value.elements]
            return bool(elements) and all(self._is_mask(e, ctx, depth + 1) for e in elements)
        return False


def _read_at_once(node: cst.Call, ctx) -> bool:
    """Is the op's result read on the host right away (`.nonzero().item()`, `.unique().tolist()`)? The
    read waits for the GPU anyway; LA101 reports the line once, naming both waits."""
    attribute = ctx.parent(node)
    call = ctx.parent(attribute) if isinstance(attribute, cst.Attribute) else None
    return (
        isinstance(call, cst.Call)
        and call.func is attribute
        and cast(cst.Attribute, attribute).attr.value in ("item", "tolist")
        and not call.args
    )


# A name that says it holds a mask: `mask`, `pos_mask`, `mask_neg`.
_MASK_NAME = re.compile(r"(?i)^(\w+_)?mask(_\w+)?$")


def _made_elsewhere(binding, ctx) -> bool:
    """Is the binding's value what a function of another module returns (`box_utils.f(...)`)? Its
    code is not read here; the name the script gives it is the evidence left."""
    value = binding.value
    if binding.kind != "value" or not isinstance(value, cst.Call):
        return False
    qualified = ctx.qualified_name(value.func)  # an imported function, not a method of a local value
    if qualified is None or qualified.startswith(("torch.", "numpy.")):
        return False  # (a torch function says what it returns: read by the rules above)
    site = ctx.steps.call_site(value)
    return site is not None and not ctx.steps.resolve(site)


def _uses_of_mask(use: cst.CSTNode, mask: cst.BaseExpression, ctx) -> Group:
    """The uses of one mask in one step body are one problem: each counts the mask again, with a
    sync, where counting it once (its indices) would do for all of them."""
    return Group(
        (ctx.one_pass(use), _mask_identity(mask, ctx)),
        noun="use",
        where="of this mask in this step",
        advice="find its indices once (`idx = mask.nonzero(as_tuple=True)`, then `x[idx]`), one sync for all",
    )


def _mask_identity(mask: cst.BaseExpression, ctx) -> tuple:
    """Which mask: its code, and for a name the last assignment before the read in the source (a
    mask assigned again between two uses is two masks)."""
    code = " ".join(ctx.index.module.code_for_node(mask).split())
    use = ctx.index.uses.get(id(mask)) if isinstance(mask, cst.Name) else None
    found = ctx.scope.lookup(cast(cst.Name, mask).value) if use is not None else None
    if not found:
        return (code,)
    return code, max((b for b in found[0] if b.order < cast(tuple, use)[0]), key=lambda b: b.order, default=None)


def _is_whole_slice(element: cst.BaseSlice) -> bool:
    """`:` (or `...`) in a subscript: the whole of that dimension."""
    if isinstance(element, cst.Slice):
        return element.lower is None and element.upper is None and element.step is None
    return isinstance(element, cst.Index) and isinstance(element.value, cst.Ellipsis)


def _is_static_nonzero(node: cst.Call) -> bool:
    return cast(cst.Attribute, node.func).attr.value == "nonzero" and any(
        arg.keyword and arg.keyword.value == "size" for arg in node.args
    )
