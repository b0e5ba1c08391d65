from __future__ import annotations

import libcst as cst

from loopaudit.analysis import FORWARD_CALLEE, iter_subtree, Kind, terminal_name, type_test
from loopaudit.rule import Report, Rule

from ._batch import (
    TENSORS,
    body_nodes,
    is_container_name,
    is_ragged,
    is_recurrence,
    names_in,
    slice_names,
    range_bound,
    step_like,
    target_names,
    tensor_kind,
    tensor_size,
    unwrap_enumerate,
)

# Tensor methods that compute (launch a kernel) or read a value back, called once per element.
# Moves and dtype casts alone (`t.to(device)` for each field of a batch tuple) are not per-sample work.
_COMPUTE_METHODS = frozenset({
    "sum", "mean", "max", "min", "amax", "amin", "argmax", "argmin", "prod", "std", "var", "norm",
    "abs", "exp", "log", "sqrt", "pow", "neg", "sigmoid", "softmax", "log_softmax", "relu", "tanh",
    "eq", "ne", "gt", "lt", "ge", "le", "isnan", "isinf", "isfinite", "any", "all", "masked_fill",
    "gather", "index_select", "clamp", "clip", "round", "floor", "ceil", "add", "sub", "mul", "div",
    "matmul", "mm", "bmm", "nonzero", "count_nonzero", "cumsum", "add_", "mul_", "div_", "sub_",
    "zero_", "fill_", "copy_", "masked_select", "unique", "square", "rsqrt", "reciprocal", "sign",
    "topk", "sort", "argsort", "dot", "item", "tolist", "index_add_", "scatter_", "scatter_add_",
})
# Methods of strings that a tensor does not have: what they are called on is text.
_STRING_ONLY_METHODS = frozenset({
    "startswith", "endswith", "lower", "upper", "strip", "lstrip", "rstrip", "replace", "encode", "format",
    "isdigit", "isalpha", "casefold", "title", "removeprefix", "removesuffix",
})
_TEXT = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
_ARITHMETIC = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power, cst.MatrixMultiply)


class PerSampleLoop(Rule):
    code = "LA301"
    name = "per-sample-loop"
    summary = "A Python loop over the samples of a batch that does tensor work per sample, once per step."
    message = "this loop does tensor work once per sample: N small kernel launches per step where one batched operation would do"
    suggestion = (
        "operate on the whole batch at once: index with tensors (`x[idx]`), reduce along a dimension "
        "(`loss.sum(dim=0)`), or use `torch.vmap`, `index_add_`/`scatter_add_` for per-sample scatters"
    )
    what_it_flags = (
        "A `for` loop in code that runs once per step (on any device) whose iterations walk the first "
        "dimension of a tensor: `for i in range(x.size(0))`, `range(len(labels))`, `range(batch_size)` "
        "when `batch_size = x.shape[0]`, `range(x.numel())`, or `for sample in batch` / "
        "`for p, t in zip(preds, targets)` over tensors, and whose body does tensor work with each element: "
        "a forward pass or a torch function of `x[i]`, a tensor method that computes or reads back "
        "(`x[i].sum()`, `y[i].item()`), or arithmetic on it. Not flagged: step loops themselves (a "
        "gradient-accumulation loop over micro-batches), loops with a stride (`range(0, n, chunk)`), "
        "recurrences that feed one iteration's result into the next (`h = cell(x[t], h)`), ragged loops "
        "that slice each row to its own length (`x[i, :lengths[i]]`), loops over other dimensions, and "
        "loops whose body only moves or casts each element (`t.to(device)`), loops whose elements the body "
        "uses as text (`\"loss_for_\" + fname`, `name.endswith(\".png\")`: file names or captions, not "
        "rows), and loops over a tokenizer's output (`ids = tokenizer.encode(token)`, a Python list unless "
        "`return_tensors=` is passed), loops over what a model returns or what callers pass (a tuple of heads, "
        "one output per scale or per discriminator), and loops inside `if isinstance(x, (list, tuple)):` or "
        "`if type(x) is tuple:` for the walked name. Comprehensions are not checked."
    )
    why_it_costs = (
        "Every tensor operation is dispatched by Python and, on a GPU, launched as its own kernel: several "
        "microseconds of CPU time each, however small the tensor. A loop over a batch of N turns one "
        "kernel over N rows into N kernels over one row each, so the step costs N times the launch "
        "overhead and the GPU runs tiny kernels that use a fraction of its cores. A `.item()` inside the "
        "loop is a host-device sync per sample. On a CPU the per-op dispatch overhead (and losing "
        "vectorized, multi-threaded kernels) costs the same way."
    )
    example = (
        "for x, y in loader:\n"
        "    x, y = x.cuda(), y.cuda()\n"
        "    loss = 0\n"
        "    for i in range(x.size(0)):\n"
        "        loss = loss + criterion(model(x[i].unsqueeze(0)), y[i].unsqueeze(0))\n"
        "    (loss / x.size(0)).backward()\n"
        "    optimizer.step()\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    x, y = x.cuda(), y.cuda()\n"
        "    loss = criterion(model(x), y)  # reduction='mean' averages over the batch\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
    )
    fix_safety = (
        "No automatic fix: the batched form depends on what the body computes, and layers such as "
        "BatchNorm behave differently on a batch of one than on the whole batch."
    )
    valid = (
        # A multi-scale discriminator returns one output per scale, and a loss made robust to single
        # outputs wraps them in a list first (melgan, SfmLearner).
        "import torch\n"
        "import torch.nn.functional as F\n"
        "def explainability_loss(mask):\n"
        "    if type(mask) not in [tuple, list]:\n"
        "        mask = [mask]\n"
        "    loss = 0\n"
        "    for mask_scaled in mask:\n"
        "        loss += F.binary_cross_entropy(mask_scaled, torch.ones_like(mask_scaled))\n"
        "    return loss\n"
        "netD = Discriminator().cuda()\n"
        "for x, y in train_loader:\n"
        "    D_real = netD(x.cuda(non_blocking=True))\n"
        "    loss_D = 0\n"
        "    for scale in D_real:\n"
        "        loss_D += F.relu(1 - scale[-1]).mean()\n"
        "    (loss_D + explainability_loss(D_real)).backward()\n",
        # A multi-scale loss walks the tuple of outputs, one per scale (FlowNet2's MultiScale).
        "import torch\n"
        "class MultiScale(torch.nn.Module):\n"
        "    def forward(self, output, target):\n"
        "        loss = 0\n"
        "        if type(output) is tuple:\n"
        "            for i, output_ in enumerate(output):\n"
        "                loss += self.weights[i] * (output_ - self.pools[i](target)).abs().mean()\n"
        "            return loss\n"
        "        return (output - target).abs().mean()\n"
        "model = Net().cuda()\n"
        "criterion = MultiScale()\n"
        "for x, y in train_loader:\n"
        "    criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True)).backward()\n",
        # A helper walking what it is handed: a model's outputs may be a tuple of heads (YOLO's three
        # detection layers), not a batch.
        "import torch\n"
        "def compute_loss(predictions, targets):\n"
        "    loss = 0\n"
        "    for layer_predictions in predictions:\n"
        "        loss = loss + layer_predictions.sigmoid().mean()\n"
        "    return loss\n"
        "model = Net().cuda()\n"
        "for imgs, targets in train_loader:\n"
        "    loss = compute_loss(model(imgs.cuda(non_blocking=True)), targets)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Batched: no per-sample loop.
        "import torch\n"
        "model.cuda()\n"
        "for x, y in train_loader:\n"
        "    out = model(x.cuda())\n"
        "    loss = criterion(out, y.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Moving each field of the batch tuple, a recurrence over time steps, a ragged loop, and a
        # gradient-accumulation loop over micro-batches (a step loop itself).
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for batch in train_loader:\n"
        "    for t in batch:\n"
        "        t.to(device)\n"
        "    x, lengths = batch\n"
        "    x = x.to(device)\n"
        "    h = torch.zeros(x.size(1), 128, device=device)\n"
        "    for t in range(x.size(0)):\n"
        "        h = cell(x[t], h)\n"
        "    for i in range(x.size(0)):\n"
        "        total = total + x[i, :lengths[i]].sum()\n"
        "    for micro in range(0, x.size(0), micro_bs):\n"
        "        loss = model(x[micro:micro + micro_bs]).mean()\n"
        "        loss.backward()\n"
        "    optimizer.step()\n",
        # Once per epoch, not per step.
        "import torch\n"
        "for epoch in range(epochs):\n"
        "    for x, y in train_loader:\n"
        "        loss = model(x.cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "    for i in range(len(probe)):\n"
        "        print(model(probe[i].cuda()).argmax())\n",
        # Text, not samples: the batch's file names logged under a debug option, and the ids a
        # tokenizer gives for one token (a Python list).
        "import torch\n"
        "def get_mask(tokenizer, accelerator):\n"
        "    mask = torch.ones(len(tokenizer)).to(accelerator.device, dtype=torch.bool)\n"
        "    for token in tokenizer.token_map:\n"
        "        ids = tokenizer.encode(token, add_special_tokens=False)\n"
        "        for i in range(len(ids)):\n"
        "            mask = mask & (torch.arange(len(tokenizer)) != ids[i]).to(accelerator.device)\n"
        "    return mask\n"
        "model.cuda()\n"
        "for step, batch in enumerate(train_dataloader):\n"
        "    loss = model(batch['pixel_values'].cuda()).mean()\n"
        "    if args.debug_loss and 'filenames' in batch:\n"
        "        for fname in batch['filenames']:\n"
        "            accelerator.log({'loss_for_' + fname: loss}, step=step)\n"
        "    loss.backward()\n"
        "    grads = get_mask(tokenizer, accelerator)\n"
        "    optimizer.step()\n",
    )
    invalid = (
        "import torch\n"
        "import torch.nn.functional as F\n"
        "device = 'cuda'\n"
        "for inputs, labels in train_loader:\n"
        "    inputs, labels = inputs.to(device), labels.to(device)\n"
        "    loss = 0.0\n"
        "    for i in range(inputs.size(0)):  # expect: LA301\n"
        "        out = model(inputs[i].unsqueeze(0))\n"
        "        loss = loss + F.cross_entropy(out, labels[i].unsqueeze(0))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Evaluation: per-sample accuracy with a sync per sample.
        "import torch\n"
        "model.cuda()\n"
        "with torch.no_grad():\n"
        "    for images, targets in val_loader:\n"
        "        preds = model(images.cuda()).argmax(dim=1)\n"
        "        n = targets.shape[0]\n"
        "        for j in range(n):  # expect: LA301\n"
        "            correct += (preds[j] == targets[j].cuda()).item()\n"
        "        for p, t in zip(preds, targets):  # expect: LA301\n"
        "            per_class[t.item()] += (p == t.cuda()).item()\n",
    )

    node_types = (cst.For,)
    needs_cuda = False

    def check(self, node, ctx):
        if step_like(node, ctx):
            return
        iterable, item_target = unwrap_enumerate(node.iter, node.target)
        bound = range_bound(iterable)
        if bound is not None:
            size = tensor_size(bound, ctx, ctx.scope)
            if size is None or size[1] not in (0, None):
                return
            indices = set(target_names(node.target))
            if not indices or is_ragged(node, indices) or is_recurrence(node):
                return
            finder = _Elements(ctx, indices=indices, elements=set())
        else:
            if not _iterates_tensors(iterable, ctx) or _tested_as_container(iterable, node, ctx):
                return
            elements = set(target_names(item_target))
            if not elements or is_recurrence(node) or _used_as_mapping(node, elements):
                return
            finder = _Elements(ctx, indices=set(), elements=elements)
        finder.propagate(node)
        if finder.checks_type(node) or finder.uses_as_text(node):
            return
        evidence = finder.work(node)
        if evidence is not None:
            header = ctx.source(node.iter, 36)
            yield Report(
                node,
                f"`for ... in {header}` runs `{ctx.source(evidence, 36)}` once per sample: N small kernel "
                "launches per step where one batched operation would do",
            )


# Types a test can show a value to be instead of a tensor: walking it walks its items.
_CONTAINER_TYPES = frozenset({"list", "tuple", "dict", "set", "str", "Sequence", "Mapping", "Iterable"})


def _tested_as_container(iterable: cst.BaseExpression, loop: cst.For, ctx) -> bool:
    """Is the loop inside `if isinstance(name, (list, tuple)):` or `if type(name) is tuple:` for the
    name it walks? FlowNet2's multi-scale loss walks a tuple of outputs, one per scale; a text
    encoder under `isinstance(text, list)` walks strings."""
    if not isinstance(iterable, cst.Name):
        return False
    child, parent = loop, ctx.parent(loop)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.If) and child is parent.body and _container_test(parent.test, iterable.value):
            return True
        child, parent = parent, ctx.parent(parent)
    return False


def _container_test(test: cst.BaseExpression, name: str) -> bool:
    """`isinstance(name, list)`, `isinstance(name, (list, tuple))`, `type(name) is tuple`, `type(name) in (list, tuple)`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _container_test(test.left, name) or _container_test(test.right, name)
    tested = type_test(test)
    return (
        tested is not None and tested.holds and tested.subject == name and bool(tested.types)
        and all(t.rsplit(".", 1)[-1] in _CONTAINER_TYPES for t in tested.types)
    )


def _iterates_tensors(iterable: cst.BaseExpression, ctx) -> bool:
    if isinstance(iterable, cst.Call) and terminal_name(iterable.func) == "zip":
        args = [arg.value for arg in iterable.args]
        return bool(args) and all(_is_tensor_value(arg, ctx) for arg in args)
    return _is_tensor_value(iterable, ctx)


def _is_tensor_value(expr: cst.BaseExpression, ctx) -> bool:
    if is_container_name(terminal_name(expr) or ""):
        return False
    if isinstance(expr, cst.Name) and (_passed_in(expr.value, ctx) or _module_output(expr.value, ctx)):
        # `def get_loss(model_output): for x in model_output:`, `D_fake = netD(x); for scale in
        # D_fake:` — a model's output may be a tuple or list of tensors (heads, scales, the
        # discriminators of a multi-scale GAN), and walking it is walking those, not samples.
        return False
    return tensor_kind(expr, ctx) in TENSORS


def _module_output(name: str, ctx) -> bool:
    """Is `name` bound only to what a model returns (`D_real = netD(x_t.cuda())`)?"""
    found = ctx.scope.lookup(name)
    bindings = found[0] if found else []
    return bool(bindings) and all(
        b.kind == "value" and isinstance(b.value, cst.Call) and FORWARD_CALLEE.search(terminal_name(b.value.func) or "") is not None
        and not (ctx.qualified_name(b.value.func) or "").startswith("torch.")
        for b in bindings
    )


def _passed_in(name: str, ctx) -> bool:
    """Is `name` a parameter the function never rebinds, other than a model's `forward` input?"""
    found = ctx.scope.lookup(name)
    if found is None or found[0] or name not in found[1].params or found[1].function is None:
        return False
    function = found[1].function
    return function.name.value != "forward"


def _used_as_mapping(loop: cst.For, elements: set[str]) -> bool:
    """`t["boxes"]`: the elements are dicts (a detection batch), not tensor rows."""
    for node in body_nodes(loop):
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value in elements:
            if any(isinstance(getattr(e.slice, "value", None), (cst.SimpleString, cst.FormattedString)) for e in node.slice):
                return True
    return False


class _Elements:
    """What in a loop body is one element of the batch: `x[i]` for an index `i` into a tensor, the
    loop's item in `for sample in batch`, and names assigned from those (`xi = x[i].cuda()`)."""

    def __init__(self, ctx, indices: set[str], elements: set[str]) -> None:
        self.ctx = ctx
        self.indices = indices
        self.elements = elements

    def is_element(self, expr: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in self.elements
        if isinstance(expr, cst.Subscript):
            if self.is_element(expr.value):
                return True
            if self.indices and slice_names(expr) & self.indices:
                return tensor_kind(expr.value, self.ctx) in TENSORS
        return False

    def contains_element(self, expr: cst.CSTNode) -> bool:
        return any(self.is_element(n) for n in iter_subtree(expr) if isinstance(n, (cst.Name, cst.Subscript)))

    def propagate(self, loop: cst.For) -> None:
        for _ in range(2):
            for node in body_nodes(loop):
                if not isinstance(node, cst.Assign):
                    continue
                names = {n for t in node.targets for n in _names_of(t.target)}
                if self.indices and names_in(node.value) & self.indices:
                    self.indices |= names  # `idx = ids[b].item()`: still one element's index
                if self.contains_element(node.value) and self.ctx.kind(node.value) is not Kind.NOT_TENSOR:
                    self.elements |= names

    def checks_type(self, loop: cst.For) -> bool:
        """`x[i] is None`, `isinstance(item, dict)`: the elements are Python objects of mixed types
        (a tuple of outputs, a nested structure), not the rows of a tensor."""
        for node in body_nodes(loop):
            if isinstance(node, cst.Comparison) and any(isinstance(c.operator, (cst.Is, cst.IsNot)) for c in node.comparisons):
                if self.contains_element(node.left):
                    return True
            elif isinstance(node, cst.Call) and terminal_name(node.func) == "isinstance" and node.args:
                if self.contains_element(node.args[0].value):
                    return True
        return False

    def uses_as_text(self, loop: cst.For) -> bool:
        """`"loss_for_" + fname`, `fname.endswith(".png")`: the elements are strings (file names,
        captions), not the rows of a tensor (adding a string to a tensor raises; `"%f" % x[i]` would
        format a tensor, so it proves nothing)."""
        for node in body_nodes(loop):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                sides = (node.left, node.right)
                if any(isinstance(side, _TEXT) for side in sides) and any(
                    self.is_element(side) for side in sides if not isinstance(side, _TEXT)
                ):
                    return True
            elif (
                isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _STRING_ONLY_METHODS and self.is_element(node.func.value)
            ):
                return True
        return False

    def work(self, loop: cst.For) -> cst.CSTNode | None:
        """The first tensor operation the body does on one element, if any."""
        for node in body_nodes(loop):
            if isinstance(node, cst.Call):
                func = node.func
                if isinstance(func, cst.Attribute) and func.attr.value in _COMPUTE_METHODS and self.contains_element(func.value):
                    return node
                if any(self.contains_element(arg.value) for arg in node.args) and self._computes(node):
                    return node
            elif isinstance(node, cst.AugAssign) and self._operand(node.value):
                written = node.target
                if not (isinstance(written, cst.Subscript) and slice_names(written) & self.indices):
                    return node  # `total += x[i]`; a write `t[i] += v` is LA302's
            elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _ARITHMETIC):
                if self._operand(node.left) or self._operand(node.right):
                    return node
            elif isinstance(node, cst.Comparison):
                if all(isinstance(c.operator, (cst.Equal, cst.NotEqual, cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)) for c in node.comparisons):
                    if self._operand(node.left) or any(self._operand(c.comparator) for c in node.comparisons):
                        return node
        return None

    def _operand(self, expr: cst.BaseExpression) -> bool:
        while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args:
            expr = expr.func.value  # `x[i].float() * w`
        return self.is_element(expr)

    def _computes(self, call: cst.Call) -> bool:
        """A forward pass, a loss, or a torch function (not a constructor, a move, or a save)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda", "cpu", "append", "extend"):
            return False
        return self.ctx.kind(call) in TENSORS


def _names_of(target: cst.BaseExpression) -> list[str]:
    return target_names(target)
