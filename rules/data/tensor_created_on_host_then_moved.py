from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    TORCH_FACTORIES,
    Kind,
    Report,
    Rule,
    RuleContext,
    holds,
    iter_subtree,
    terminal_name,
)
from loopaudit.rules.data._loaders import (
    LEGACY_CONSTRUCTORS,
    is_host_batch,
    moves_to_device,
)

# The dtype conversions of a tensor, as methods: `x.float()` makes a new tensor where `x` is.
DTYPE_METHODS = frozenset({"float", "double", "half", "bfloat16", "long", "int", "short", "char", "byte", "bool"})

# Factories that can fill the tensor on the device itself (a kernel, no copy) when given `device=`.
_FACTORIES = TORCH_FACTORIES
# Factories from Python data: flagged only for constants (data the script computes must be copied anyway).
_FROM_DATA = frozenset({"tensor", "as_tensor", "from_numpy"})


def _is_fill(expr: cst.BaseExpression) -> bool:
    """`[value] * n`: one value repeated, which `torch.full((n,), value, device=...)` makes on the device."""
    if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
        return False
    for side in (expr.left, expr.right):
        if (
            isinstance(side, cst.List)
            and len(side.elements) == 1
            and not isinstance(side.elements[0], cst.StarredElement)
        ):
            return isinstance(side.elements[0].value, (cst.Name, cst.Attribute, cst.Integer, cst.Float))
    return False


def _legacy_host_creation(call: cst.Call) -> bool:
    """`torch.LongTensor(b, n)` (sizes) or `torch.IntTensor([c] * b)` / `torch.FloatTensor([0.5])` (a fill or a constant)."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if not positional or len(positional) != len(call.args):
        return False
    if len(positional) == 1 and isinstance(positional[0], (cst.List, cst.Tuple, cst.BinaryOperation)):
        return _is_constant(positional[0]) or _is_fill(positional[0]) or _lists_sizes(positional[0])
    if len(positional) == 1:
        # `torch.LongTensor(n)` is a size, `torch.LongTensor(tokens)` data the script computed: only a
        # number written out, or a `range(...)` (an arange), can be told apart.
        return isinstance(positional[0], cst.Integer) or _is_range(positional[0])
    return all(
        isinstance(arg, (cst.Integer, cst.Name, cst.Attribute, cst.BinaryOperation)) or _is_size(arg)
        for arg in positional
    )


def _is_size(expr: cst.BaseExpression) -> bool:
    """`x.size(0)`, `len(labels)`, `x.shape[0]`: a size read from something else."""
    if isinstance(expr, cst.Call):
        func = expr.func
        return (isinstance(func, cst.Attribute) and func.attr.value in ("size", "numel", "dim")) or (
            isinstance(func, cst.Name) and func.value == "len"
        )
    return (
        isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape"
    )


def _lists_sizes(expr: cst.BaseExpression) -> bool:
    """`[img.shape[1], img.shape[0], img.shape[1], img.shape[0]]`: a few sizes and numbers written out,
    read from other values but no data of their own (Retinaface's box scale, `torch.Tensor([w, h, w, h])`)."""
    if not isinstance(expr, (cst.List, cst.Tuple)) or not expr.elements:
        return False
    values = [e.value for e in expr.elements if not isinstance(e, cst.StarredElement)]
    return (
        len(values) == len(expr.elements)
        and any(_is_size(v) for v in values)
        and all(_is_size(v) or _is_constant(v) for v in values)
    )


def _is_range(expr: cst.BaseExpression) -> bool:
    """`range(n)`: the values `torch.arange(n, device=...)` makes on the device."""
    return isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "range"


def _is_constant(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.Name):
        return expr.value in ("True", "False")
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        return _is_constant(expr.expression)
    if isinstance(expr, (cst.List, cst.Tuple)):
        return bool(expr.elements) and all(
            _is_constant(e.value) for e in expr.elements if not isinstance(e, cst.StarredElement)
        )
    return False


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _host_creation(
    expr: cst.BaseExpression, ctx, scope=None, depth: int = 0, assumed: frozenset = frozenset()
) -> cst.Call | None:
    """The `torch.<factory>(...)` call at the root of `expr` when `expr` is a tensor built on the host
    from factories alone, else None. The value is followed through tensor methods (`.float()`,
    `.unsqueeze(0)`), indexing (`coords[None]`), arithmetic with numbers (`torch.arange(n) + offset`),
    torch functions of host-made tensors (`torch.stack(torch.meshgrid(dy, dx))`), names bound to such
    a value in the same function, and helpers of this module that return one (RAFT's `coords_grid`)."""
    found = _host_made(expr, ctx, scope or ctx.scope, depth, assumed)
    return None if found is _ASSUMED else found


# Stands for "host-made if the name being resolved is": `coords = torch.stack(coords[::-1])` rebinds
# a name to a value made from its own earlier binding.
_ASSUMED = cst.Call(func=cst.Name("assumed"))


def _host_made(expr: cst.BaseExpression, ctx, scope, depth: int, assumed: frozenset) -> cst.Call | None:
    if depth > 12:
        return None
    if isinstance(expr, cst.Subscript):
        return _host_made(expr.value, ctx, scope, depth + 1, assumed)
    if isinstance(expr, cst.BinaryOperation):
        sides = [_host_made(side, ctx, scope, depth + 1, assumed) for side in (expr.left, expr.right)]
        made = next((side for side in sides if side is not None and side is not _ASSUMED), None)
        made = made or next((side for side in sides if side is not None), None)
        if made is None:
            return None
        others = [side for side, found in zip((expr.left, expr.right), sides) if found is None]
        return made if all(_stays_on_host(other, ctx, scope) for other in others) else None
    if isinstance(expr, cst.Name):
        return _bound_host_creation(expr, ctx, scope, depth, assumed)
    if not isinstance(expr, cst.Call):
        return None
    qualified = ctx.qualified_name(expr.func) or ""
    if qualified.startswith("torch.") and qualified.count(".") == 1:
        return _torch_call_on_host(expr, qualified[6:], ctx, scope, depth, assumed)
    if isinstance(expr.func, cst.Attribute):
        method = expr.func.attr.value
        if method == "cuda" or (method in ("to", "type") and not is_dtype_conversion(expr, ctx)):
            return None  # a move (or a conversion we cannot read): what comes out is not the host tensor
        return _host_made(expr.func.value, ctx, scope, depth + 1, assumed)
    if _is_variable_wrapper(expr, ctx) and expr.args:
        return _host_made(expr.args[0].value, ctx, scope, depth + 1, assumed)  # pre-0.4 `Variable(x)`: x
    if isinstance(expr.func, cst.Name) and depth < 3:
        return _helper_host_creation(expr.func.value, ctx, depth)
    return None


def _is_variable_wrapper(call: cst.Call, ctx) -> bool:
    qualified = ctx.qualified_name(call.func) or ""
    return qualified in ("torch.autograd.Variable", "torch.autograd.variable.Variable")


def _numpy_random(expr: cst.BaseExpression, ctx) -> bool:
    """`np.random.permutation(n)`, `np.random.rand(b, 1)`: random numbers the script draws on the host,
    which `torch.randperm(n, device=...)` / `torch.rand(..., device=...)` would draw on the device."""
    return isinstance(expr, cst.Call) and (ctx.qualified_name(expr.func) or "").startswith("numpy.random.")


def _numpy_constant(expr: cst.BaseExpression, ctx) -> bool:
    """`np.array([1, 0, 0, 0, 1, 0, 0, 0, 1]).astype(np.float32)`: an array written out in the code."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "astype":
        expr = expr.func.value
    if not isinstance(expr, cst.Call) or not expr.args:
        return False
    qualified = ctx.qualified_name(expr.func) or ""
    return qualified in ("numpy.array", "numpy.asarray") and _is_constant(expr.args[0].value)


def _torch_call_on_host(call: cst.Call, factory: str, ctx, scope, depth: int, assumed: frozenset) -> cst.Call | None:
    if factory in LEGACY_CONSTRUCTORS:
        return call if _legacy_host_creation(call) else None
    if factory not in _FACTORIES and factory not in _FROM_DATA:
        # `torch.triu(torch.full(...), 1)`, `torch.stack(torch.meshgrid(dy, dx), -1)`: computed on the
        # host from host-made tensors (every tensor argument is one) and numbers.
        if factory[:1].isupper():
            return None
        found = None
        for arg in call.args:
            if arg.keyword is not None:
                continue
            values = (
                [e.value for e in arg.value.elements] if isinstance(arg.value, (cst.List, cst.Tuple)) else [arg.value]
            )
            for value in values:
                made = _host_made(value, ctx, scope, depth + 1, assumed)
                if made is None and not _stays_on_host(value, ctx, scope):
                    return None
                found = made if found is None or found is _ASSUMED else found
        return found
    if factory in _FROM_DATA and any(arg.star for arg in call.args):
        return None
    device = _keyword(call, "device")
    if device is not None and not (isinstance(device, cst.SimpleString) and device.evaluated_value == "cpu"):
        return None  # already on the device: the move is a no-op or a dtype change
    pin = _keyword(call, "pin_memory")
    if pin is not None and not (isinstance(pin, cst.Name) and pin.value == "False"):
        return None  # pinned host staging, on purpose
    if _keyword(call, "generator") is not None:
        return None  # a CPU generator: the same random numbers on every machine, on purpose
    if factory in _FROM_DATA:
        data = call.args[0].value if call.args and call.args[0].keyword is None else None
        if data is None or not (
            _is_constant(data)
            or _is_fill(data)
            or _is_range(data)
            or _lists_sizes(data)
            or _numpy_constant(data, ctx)
            or _named_constant(data, ctx)
            or _numpy_random(data, ctx)
        ):
            return None
    return call


def _named_constant(expr: cst.BaseExpression, ctx) -> bool:
    """`IMAGENET_DEFAULT_MEAN`: a name in capitals that is imported or bound at module level only, a
    constant by Python's convention (`torch.as_tensor(IMAGENET_DEFAULT_MEAN).to(device)` in a step)."""
    if not (isinstance(expr, cst.Name) and len(expr.value) > 1 and expr.value.isupper()):
        return False
    found = ctx.scope.lookup(expr.value)
    if found is None:
        return ctx.qualified_name(expr) is not None  # imported: `from timm.data.constants import ...`
    bindings, owner = found
    return owner is ctx.index.module_scope and bool(bindings) and all(b.kind == "value" for b in bindings)


def is_dtype_conversion(call: cst.Call, ctx) -> bool:
    """`.to(torch.float16)`, `.to(dtype=torch.long)`, `.type(torch.FloatTensor)`: the tensor stays where it is."""
    if len(call.args) != 1:
        return False
    qualified = ctx.qualified_name(call.args[0].value) or ""
    return qualified.startswith("torch.") and not qualified.startswith(("torch.cuda.", "torch.device"))


def _stays_on_host(expr: cst.BaseExpression, ctx, scope) -> bool:
    """Anything not known to be a GPU tensor: combined with a host tensor (which a GPU tensor could
    only be if it were a 0-dim one), the result stays on the host."""
    if isinstance(expr, (cst.Integer, cst.Float)) or _is_constant(expr):
        return True
    return ctx.tensors.kind(expr, scope) is not Kind.TENSOR


def _bound_host_creation(name: cst.Name, ctx, scope, depth: int, assumed: frozenset) -> cst.Call | None:
    """`dx = torch.linspace(-r, r, 2 * r + 1)` read in the same function: every binding the function
    gives the name is host-made, and nothing writes into it in place."""
    if name.value in assumed:
        return _ASSUMED
    found = scope.lookup(name.value)
    if found is None or found[1] is not scope or scope.function is None or not found[0]:
        return None
    made = None
    for binding in found[0]:
        if binding.kind != "value":
            return None
        creation = _host_made(binding.value, ctx, scope, depth + 1, assumed | {name.value})
        if creation is None:
            return None
        made = creation if made is None or made is _ASSUMED else made
    return None if _written_in_place(scope.function, name.value, ctx) else made


def _helper_host_creation(name: str, ctx, depth: int) -> cst.Call | None:
    """`coords_grid(n, h, w)`, a function of this module whose every `return` gives a host-made tensor."""
    functions = [f for f in ctx.index.functions if f.name == name and f.class_info is None]
    if len(functions) != 1 or not functions[0].returns:
        return None
    function = functions[0]
    made = None
    for returned in function.returns:
        creation = _host_creation(returned, ctx, function.scope, depth + 2)
        if creation is None:
            return None
        made = made or creation
    return made


def _named_host_creation(expr: cst.BaseExpression, ctx) -> cst.Call | None:
    """`mask = torch.ones(n)` then `mask.cuda()` in the same loop iteration, or in the same call of a
    per-step function (`ids = torch.arange(n)`, then `ids = ids.cuda()`): a tensor made on the host
    only to be moved. Only when nothing else binds or reads the name before the move (filled on the
    host element by element, say, it would be another matter)."""
    if not isinstance(expr, cst.Name):
        return None
    found = ctx.scope.lookup(expr.value)
    if found is None or found[1] is not ctx.scope:
        return None
    # `ids = ids.cuda()`: the move may rebind the name; what comes after it reads the moved tensor.
    moves = [b for b in found[0] if b.kind == "value" and holds(b.value, expr)]
    others = [b for b in found[0] if b not in moves]
    if len(moves) == 1:
        # what the name is bound to after the move (`loc_t = loc_t[pos_idx]`) is not what is moved
        others = [b for b in others if b.order < moves[0].order]
    if len(others) != 1 or len(moves) > 1:
        return None
    binding = others[0]
    if binding.kind != "value" or ctx.frame is None or ctx.frame.innermost_loop() is not binding.loop:
        return None  # made before the loop: one copy a step, but not one creation a step
    if binding.loop is None and ctx.scope.function is None:
        return None  # module level, outside any loop: runs once
    creation = _host_creation(binding.value, ctx)
    if creation is None:
        return None
    body = ctx.scope.function or ctx.index.module
    if not moves:
        uses = sum(1 for node in iter_subtree(body) if isinstance(node, cst.Name) and node.value == expr.value)
        return creation if uses == 2 else None
    # Rebound by the move: later reads see the moved tensor. The host tensor must not be written
    # to (`ids[0] = n`, `ids.fill_(1)`) anywhere in the function.
    return None if _written_in_place(body, expr.value, ctx, moves[0].order) else creation


def _written_in_place(body: cst.CSTNode, name: str, ctx, before: int | None = None) -> bool:
    """Is the host tensor written to in place (before the move that rebinds the name, if `before` is
    its order: after it, a write such as `conf_t[pos] = 1` writes into the moved tensor)?"""

    def early(read: cst.Name) -> bool:
        use = ctx.index.uses.get(id(read)) if before is not None else None
        return use is None or use[0] < before

    for node in iter_subtree(body):
        if isinstance(node, cst.Subscript) and id(node) in ctx.index.stored_subscripts:
            base = node.value
            while isinstance(base, cst.Subscript):
                base = base.value  # `batch_text[i][:n] = ...` writes into batch_text too
            if isinstance(base, cst.Name) and base.value == name and early(base):
                return True
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value.endswith("_"):
            if isinstance(node.func.value, cst.Name) and node.func.value.value == name and early(node.func.value):
                return True
    return False


class TensorCreatedOnHostThenMoved(Rule):
    code = "LA205"
    name = "tensor-created-on-host-then-moved"
    summary = "`torch.arange(n).to(device)` and kin once per step: create the tensor on the device with `device=`."
    message = "this tensor is built on the CPU and copied to the GPU with a blocking copy, once per step"
    suggestion = (
        "create it where it is used: `torch.arange(n, device=device)`, `torch.ones(shape, device=x.device)`; "
        "for a constant (`torch.tensor(0.5)`), create it once before the loop or use "
        "`torch.full((), 0.5, device=device)`; in a model's `forward`, build a constant once in `__init__` with "
        "`self.register_buffer(...)`, which `model.to(device)` moves"
    )
    what_it_flags = (
        "In code that runs once per step of a CUDA script, a tensor made by a `torch` factory without "
        "`device=` and then moved with `.to(device)`, `.to(other_gpu_tensor)` or `.cuda()`, possibly through dtype or shape methods "
        "in between: `torch.arange(n).to(device)`, `torch.ones(b, 1).float().cuda()`, "
        "`torch.randn(shape).to(device)`, `torch.triu(torch.full((t, t), -inf), 1).to(device)`, `torch.LongTensor(range(n)).to(device)`, and `torch.tensor(...)` / `torch.as_tensor(...)` of a literal "
        "constant (`torch.tensor(0.5).cuda()`, `torch.tensor([1.0, 2.0]).to(device)`). The host-made value "
        "is followed through names bound in the same function, indexing, arithmetic with numbers "
        "(`(torch.arange(n) + offset).cuda()`), torch functions of host-made tensors "
        "(`torch.stack(torch.meshgrid(dx, dy)).to(device)`) and helpers of the same module that return one; "
        "`.type(torch.cuda.FloatTensor)` and `.type_as(gpu_tensor)` count as moves; random numbers drawn "
        "with NumPy (`torch.from_numpy(np.random.permutation(n))`) and a list of sizes "
        "(`torch.Tensor([w, h, w, h])`) are made by the script; and `torch.from_numpy(np.array([...]))` of an array written "
        "out in the code is a constant too, as is a name in capitals imported or bound at module level "
        "(`torch.as_tensor(IMAGENET_DEFAULT_MEAN).to(device)`). Not flagged: "
        "factories given `pin_memory=True` (host staging on purpose) or a `generator=` (CPU random "
        "numbers on purpose), `torch.tensor(data)` of data the script computes, and moves with "
        "`non_blocking=True`. The advice fits the shape: in a method of an `nn.Module`, a tensor built from "
        "constants, module-level names and the model's own settings (`torch.arange(MAX_LEN)`, "
        "`torch.tril(torch.ones(self.block_size, self.block_size))`; nothing random, nothing from the batch) is the "
        "same in every forward and belongs in a buffer made once in `__init__` (`self.register_buffer(..., "
        "persistent=False)`, which keeps checkpoints as they were); a legacy constructor (`torch.LongTensor(n)`), "
        "which takes no `device=`, is replaced by the factory that makes the same tensor on the device. Also "
        "flagged: a host tensor an object keeps from its `__init__` and copies in a per-step method "
        "(`self.mean.to(x.device)`, `self.t_discrete.clone().to(t.device)`): a model keeps it in a buffer, "
        "any other object moves it to the device once, in `__init__`."
    )
    why_it_costs = (
        "The factory allocates and fills the tensor in pageable host memory, then `.to(device)` copies it "
        "to the GPU. Without `non_blocking=True` PyTorch ends that copy with `cudaStreamSynchronize`, so "
        "the host waits for every kernel queued before it: a full host-device sync, every step, to make a "
        "tensor that the GPU could have filled itself. With `device=` the factories (`zeros`, `ones`, "
        "`full`, `arange`, `rand`, ...) allocate from the CUDA caching allocator and launch one fill "
        "kernel, asynchronously; there is no copy. `torch.tensor(value, device=device)` still builds the "
        "value on the CPU and copies it, so constants are best created once, outside the loop."
    )
    example = (
        "for x, y in train_loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    positions = torch.arange(x.size(1)).to(device)\n"
        "    margin = torch.tensor(0.2).cuda()\n"
    )
    use_instead = (
        "margin = torch.tensor(0.2, device=device)  # once, before the loop\n"
        "for x, y in train_loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    positions = torch.arange(x.size(1), device=x.device)\n"
    )
    fix_safety = (
        "Safe: the values are the same. Random factories (`rand`, `randn`, `randint`, `randperm`) draw from "
        "the CUDA generator instead of the CPU one when created on the device, so the exact numbers change "
        "(reproducibility across runs on the same setup is kept)."
    )
    valid = (
        # Built once in `__init__` and registered as a buffer: `model.cuda()` moves it with the model.
        "import torch\n"
        "class Decoder(torch.nn.Module):\n"
        "    def __init__(self, block_size):\n"
        "        super().__init__()\n"
        "        self.register_buffer('mask', torch.tril(torch.ones(block_size, block_size)), persistent=False)\n"
        "    def forward(self, x):\n"
        "        t = x.size(1)\n"
        "        return self.body(x, self.mask[:t, :t], torch.arange(t, device=x.device))\n"
        "model = Decoder(256).cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Filled on the host first, then moved: the host tensor is the point.
        "import torch\n"
        "def make_mask(lengths):\n"
        "    mask = torch.zeros(len(lengths), 100)\n"
        "    for i, n in enumerate(lengths):\n"
        "        mask[i, :n] = 1\n"
        "    mask = mask.cuda()\n"
        "    return mask\n"
        "for text, lengths in train_loader:\n"
        "    loss = model(text.cuda(non_blocking=True), make_mask(lengths.tolist())).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Legacy constructors from data the script computed: the copy is needed.
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for image, text in train_loader:\n"
        "    encoded = [vocab[c] for c in text]\n"
        "    targets = torch.LongTensor(encoded).to(device)\n"
        "    loss = model(image.to(device, non_blocking=True), targets).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for x, y in train_loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    positions = torch.arange(x.size(1), device=device)\n"
        "    loss = model(x, positions).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Host staging on purpose, a CPU generator, and data the script computes.
        "import torch\n"
        "device = 'cuda'\n"
        "for x, y in train_loader:\n"
        "    staged = torch.empty(1024, pin_memory=True).to(device)\n"
        "    noise = torch.randn(x.shape, generator=cpu_gen).to(device)\n"
        "    targets = torch.tensor(label_ids).to(device)\n"
        "    loss = model(x.to(device, non_blocking=True), noise).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A host tensor combined with a GPU tensor is not host-made; a grid the helper fills in place
        # on the host is the point.
        "import torch\n"
        "def host_grid(n):\n"
        "    grid = torch.zeros(n, n)\n"
        "    grid[0] = 1\n"
        "    return grid\n"
        "for x, y in train_loader:\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    shifted = (torch.arange(x.shape[1]) + x).cuda()\n"
        "    grid = host_grid(x.shape[1]).cuda()\n"
        "    loss = model(x, shifted, grid).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Once, before the loop.
        "import torch\n"
        "class_weights = torch.tensor([1.0, 2.0]).cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Filled on the host element by element before the copy: creating it on the device would
        # turn each write into a kernel launch.
        "import torch\n"
        "for x, y in train_loader:\n"
        "    onehot = torch.zeros(len(y), 10)\n"
        "    for i, label in enumerate(y.tolist()):\n"
        "        onehot[i, label] = 1.0\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), onehot.cuda())\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )
    invalid = (
        # faster-rcnn's sampling: a permutation drawn with NumPy, copied to the boxes' device.
        "import numpy as np\n"
        "import torch\n"
        "for images, gt_boxes in train_loader:\n"
        "    gt_boxes = gt_boxes.cuda(non_blocking=True)\n"
        "    rand_num = torch.from_numpy(np.random.permutation(gt_boxes.size(0))).type_as(gt_boxes)  # expect: LA205\n"
        "    loss = model(images.cuda(non_blocking=True), gt_boxes[rand_num.long()]).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A box scale written out from the image's sizes, in a loop over image files (Retinaface's
        # evaluation): built on the host, then copied, for every image.
        "import cv2\n"
        "import torch\n"
        "device = torch.device('cuda')\n"
        "net = Net().to(device)\n"
        "for name in image_names:\n"
        "    img = cv2.imread(folder + name)\n"
        "    scale = torch.Tensor([img.shape[1], img.shape[0], img.shape[1], img.shape[0]])  # place: LA205\n"
        "    x = torch.from_numpy(img).permute(2, 0, 1)[None].float()\n"
        "    boxes = net(x.to(device, non_blocking=True))\n"
        "    scale = scale.to(device)  # expect: LA205\n"
        "    results.append(boxes * scale)\n",
        # A constant by name: imported, or bound once at module level (VideoMAE's normalisation).
        "import torch\n"
        "from timm.data.constants import IMAGENET_DEFAULT_MEAN\n"
        "STD = (0.229, 0.224, 0.225)\n"
        "device = torch.device('cuda')\n"
        "for x, y in train_loader:\n"
        "    mean = torch.as_tensor(IMAGENET_DEFAULT_MEAN).to(device)[None, :, None, None]  # expect: LA205\n"
        "    std = torch.as_tensor(STD).to(device)  # expect: LA205\n"
        "    loss = model((x.to(device, non_blocking=True) - mean) / std).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A tensor the model keeps as a plain attribute, on the host, copied every forward (here and in a
        # method forward calls): a buffer moves once, with the model.
        "import torch\n"
        "class Backbone(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)\n"
        "        self.std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)\n"
        "    def normalize(self, x):\n"
        "        return (x - self.mean.to(x.device)) / self.std.cuda()  # expect: LA205\n"
        "    def forward(self, x):\n"
        "        return self.body(self.normalize(x))\n"
        "model = Backbone().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The same in an object that is no model (a sampler's noise schedule): move it once, in `__init__`.
        "import torch\n"
        "class Schedule:\n"
        "    def __init__(self, betas):\n"
        "        self.t = torch.linspace(0.0, 1.0, 1000)\n"
        "    def at(self, s):\n"
        "        return torch.searchsorted(self.t.clone().to(s.device), s)  # expect: LA205\n"
        "schedule = Schedule(None)\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    loss = model(x, schedule.at(y.cuda(non_blocking=True))).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The same tensor in every forward, from constants, module-level names and the model's own
        # settings (here and in a method forward calls): a buffer, built once in `__init__`.
        "import torch\n"
        "from torch import nn\n"
        "MAX_LEN = 512\n"
        "class Decoder(nn.Module):\n"
        "    def __init__(self, block_size):\n"
        "        super().__init__()\n"
        "        self.block_size = block_size\n"
        "    def causal_mask(self):\n"
        "        return torch.tril(torch.ones(self.block_size, self.block_size)).cuda()  # expect: LA205\n"
        "    def forward(self, x):\n"
        "        positions = torch.arange(MAX_LEN).to(x.device)  # expect: LA205\n"
        "        scale = torch.tensor([0.5, 2.0]).to(x.device)  # expect: LA205\n"
        "        steps = torch.arange(x.size(1)).to(x.device)  # expect: LA205\n"
        "        return self.body(x, self.causal_mask(), positions[:x.size(1)], scale, steps)\n"
        "model = Decoder(256).cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # A constant written out as a NumPy array, through the pre-0.4 Variable wrapper (PointNet's STN).
        "import numpy as np\n"
        "import torch\n"
        "from torch.autograd import Variable\n"
        "class STN3d(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        x = self.fc(x)\n"
        "        iden = Variable(torch.from_numpy(np.array([1, 0, 0, 0, 1, 0, 0, 0, 1]).astype(np.float32))).view(1, 9)  # place: LA205\n"
        "        if x.is_cuda:\n"
        "            iden = iden.cuda()  # expect: LA205\n"
        "        return x + iden\n"
        "model = STN3d().cuda()\n"
        "for x, y in loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The criterion's class known through the tuple a factory returns (SupContrast's set_model).
        "import torch\n"
        "class SupConLoss(torch.nn.Module):\n"
        "    def forward(self, features):\n"
        "        mask = torch.eye(features.shape[0]).to(features.device)  # expect: LA205\n"
        "        return (features @ features.T * mask).sum()\n"
        "def set_model():\n"
        "    model = Net()\n"
        "    criterion = SupConLoss()\n"
        "    return model.cuda(), criterion.cuda()\n"
        "model, criterion = set_model()\n"
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)))\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        "import torch\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "for x, y in train_loader:\n"
        "    x = x.to(device, non_blocking=True)\n"
        "    positions = torch.arange(x.size(1)).unsqueeze(0).to(device)  # expect: LA205\n"
        "    mask = torch.ones(x.size(0), 1).float().cuda()  # expect: LA205\n"
        "    margin = torch.tensor(0.2).to(device)  # expect: LA205\n"
        "    loss = model(x, positions, mask, margin).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # In a model's forward, which runs once per step.
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        noise = torch.randn(x.shape).to(x.device)  # expect: LA205\n"
        "        scale = torch.ones(x.size(0)).to(x)  # expect: LA205\n"
        "        idx = torch.LongTensor(range(x.size(0))).to(x.device)  # expect: LA205\n"
        "        return self.body(x + noise) * scale\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Made under a name in the step, and used only to be moved.
        "import torch\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    x = x.cuda(non_blocking=True)\n"
        "    weights = torch.ones(x.size(0))  # place: LA205\n"
        "    loss = (model(x) * weights.cuda()).sum()  # expect: LA205\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Made in a function that runs per step, and moved where it is when CUDA is there (tacotron2).
        "import torch\n"
        "def get_mask_from_lengths(lengths):\n"
        "    ids = torch.arange(0, 100, dtype=torch.long)  # place: LA205\n"
        "    if torch.cuda.is_available(): ids = ids.cuda()  # expect: LA205\n"
        "    return ids < lengths.unsqueeze(1)\n"
        "for text, lengths in train_loader:\n"
        "    lengths = lengths.cuda(non_blocking=True)\n"
        "    loss = model(text.cuda(non_blocking=True), get_mask_from_lengths(lengths)).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # The legacy typed constructors, by size or from one value repeated (CRNN-style length tensors).
        "import torch\n"
        "device = torch.device('cuda')\n"
        "for image, text in train_loader:\n"
        "    image = image.to(device, non_blocking=True)\n"
        "    b = image.size(0)\n"
        "    lengths = torch.IntTensor([max_length] * b).to(device)  # expect: LA205\n"
        "    text_input = torch.LongTensor(b, max_length + 1).fill_(0).to(device)  # expect: LA205\n"
        "    loss = model(image, text_input, lengths).sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Built on the host from host-made tensors, through names, arithmetic and a helper (RAFT, MoCo
        # v3, YOLOv4): star arguments are sizes too, and `.type(torch.cuda.FloatTensor)` is a move.
        "import torch\n"
        "def coords_grid(batch, ht, wd):\n"
        "    coords = torch.meshgrid(torch.arange(ht), torch.arange(wd))  # place: LA205\n"
        "    coords = torch.stack(coords[::-1], dim=0).float()\n"
        "    return coords[None].repeat(batch, 1, 1, 1)\n"
        "class Net(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        dx = torch.linspace(-4, 4, 9)  # place: LA205\n"
        "        delta = torch.stack(torch.meshgrid(dx, dx), axis=-1).to(x.device)  # expect: LA205\n"
        "        grid = coords_grid(x.shape[0], 8, 8).to(x.device)  # expect: LA205\n"
        "        labels = (torch.arange(x.shape[0]) + x.shape[0] * rank).cuda()  # expect: LA205\n"
        "        noise = torch.randn(*x.shape).cuda()  # expect: LA205\n"
        "        dtype = torch.cuda.FloatTensor if x.is_cuda else torch.FloatTensor\n"
        "        mask = torch.zeros(x.shape[0], 4).type(dtype)  # expect: LA205\n"
        "        return self.body(x + noise, delta, grid, mask), labels\n"
        "model = Net().cuda()\n"
        "for x, y in train_loader:\n"
        "    loss = model(x.cuda(non_blocking=True))[0].sum()\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
    )

    confirmed_by = ("LA601",)
    confirmable_on_cpu = False  # a CPU run never copies to a device
    node_types = (cst.Call,)

    def check(self, node: cst.CSTNode, ctx: RuleContext) -> Iterator[Report]:
        node = cast(cst.Call, node)  # node_types
        receiver = moves_to_device(node, ctx) or _typed_as_device_tensor(node, ctx)
        if receiver is None:
            return
        kept = kept_attribute(receiver, ctx)
        if kept is not None and is_host_batch(receiver, ctx):
            # `self.mean.to(x.device)`: a tensor the object keeps on the host from `__init__`, copied anew
            # every step. `non_blocking=True` from its pageable memory would hide the cost and gain little.
            owner = "model" if model_class(ctx) is not None else "object"
            yield Report(
                node,
                f"`{ctx.source(node)}` copies a tensor the {owner} keeps on the host (`self.{kept}`, set in "
                f"`__init__`) to the GPU with a blocking copy, once per step: {_kept_advice(node, ctx, kept)}",
            )
            return
        creation = host_created(receiver, ctx)
        if creation is None:
            return
        factory = (ctx.qualified_name(creation.func) or "").rsplit(".", 1)[-1]
        data = creation.args[0].value if creation.args else None
        drawn = factory in _FROM_DATA and data is not None and _numpy_random(data, ctx)
        constant = (factory in _FROM_DATA and not (data is not None and _lists_sizes(data)) and not drawn) or (
            factory in LEGACY_CONSTRUCTORS and _legacy_constant(creation)
        )
        move = f"`.{cast(cst.Attribute, node.func).attr.value}(...)`"
        if model_class(ctx) is not None and built_from_constants(receiver, ctx, ctx.scope):
            # The same tensor every forward: a buffer of the model, moved once with it.
            yield Report(
                node,
                f"`{ctx.source(creation.func)}(...)` builds the same tensor on the CPU each time and {move} "
                f"copies it to the GPU with a blocking copy, once per step: {register_buffer_advice(node, ctx)}",
                places=((creation, _BUILT),),
            )
            return
        if drawn:
            fix = "draw the numbers on the device (`torch.randperm(n, device=...)`, `torch.rand(..., device=...)`)"
        elif constant:
            fix = "create it once, before the loop"
        elif factory in LEGACY_CONSTRUCTORS:
            fix = _legacy_replacement(creation, factory)
        else:
            fix = "create it with `device=`"
        yield Report(
            node,
            f"`{ctx.source(creation.func)}(...)` builds the tensor on the CPU and {move} "
            f"copies it to the GPU with a blocking copy, once per step: {fix}",
            places=((creation, _BUILT),),
        )


def _typed_as_device_tensor(call: cst.Call, ctx) -> cst.BaseExpression | None:
    """The receiver of `x.type_as(t)` where `t` is shown to be a device tensor: a copy to its device
    (faster-rcnn's `torch.from_numpy(np.random.permutation(n)).type_as(gt_boxes)`)."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "type_as" and len(call.args) == 1):
        return None
    if call.args[0].keyword is not None or call.args[0].star:
        return None
    return func.value if ctx.kind(call.args[0].value) is Kind.TENSOR else None


# A tensor built on one line and moved on another: the finding names both, and the fix goes where it is built.
_BUILT = "it is built on the host"


def host_created(receiver: cst.BaseExpression, ctx) -> cst.Call | None:
    """The call that builds the moved tensor on the host (`torch.zeros(n)` in `torch.zeros(n).cuda()`,
    also through a name or a helper), if any: the script's own tensor, not batch data."""
    return _host_creation(receiver, ctx) or _named_host_creation(receiver, ctx)


# --- what to write instead ----------------------------------------------------------------------

_LEGACY_DTYPES = {
    "FloatTensor": "float32",
    "DoubleTensor": "float64",
    "HalfTensor": "float16",
    "BFloat16Tensor": "bfloat16",
    "LongTensor": "long",
    "IntTensor": "int32",
    "ShortTensor": "int16",
    "CharTensor": "int8",
    "ByteTensor": "uint8",
    "BoolTensor": "bool",
    "Tensor": "float32",
}


def _legacy_constant(call: cst.Call) -> bool:
    """`torch.FloatTensor([0.5, 0.5])`: values written out, the same every step."""
    return (
        len(call.args) == 1
        and isinstance(call.args[0].value, (cst.List, cst.Tuple))
        and _is_constant(call.args[0].value)
    )


def _legacy_replacement(call: cst.Call, factory: str) -> str:
    """The factory that makes what `torch.LongTensor(...)` makes, on the device: the legacy
    constructors take no `device=` (they build CPU tensors only)."""
    dtype = f"dtype=torch.{_LEGACY_DTYPES[factory]}, device=..."
    first = call.args[0].value if len(call.args) == 1 else None
    if first is not None and _is_fill(first):
        made = f"torch.full((n,), value, {dtype})"
    elif first is not None and _is_range(first):
        made = f"torch.arange(n, {dtype})"
    elif first is not None and _lists_sizes(first):
        made = f"torch.tensor([...], {dtype})"
    else:
        made = f"torch.zeros(size, {dtype})"
    return f"`torch.{factory}` cannot take `device=`; create it on the device with `{made}`"


def model_class(ctx):
    """The class of the method the node sits in, when it is a model (an `nn.Module`, a
    LightningModule): a tensor it makes or moves anew every forward belongs in a buffer."""
    function = ctx.frame.enclosing_function() if ctx.frame is not None else None
    cls = function.class_info if function is not None else None
    return cls if cls is not None and _is_model(cls, ctx, 0) else None


def _is_model(cls, ctx, depth: int) -> bool:
    if ctx.steps.is_torch_module(cls) or ctx.steps.framework_of(cls) == "LightningModule":
        return True
    for base in cls.bases:
        if (ctx.qualified_name(base) or "").startswith("torch.nn."):
            return True  # `nn.Sequential`, `nn.Linear`: modules too
        parent = ctx.index.classes.get(terminal_name(base) or "")
        if parent is not None and parent is not cls and depth < 4 and _is_model(parent, ctx, depth + 1):
            return True
    return False


def kept_attribute(expr: cst.BaseExpression, ctx) -> str | None:
    """`x` for `self.x` (or `self.x.float()`, `self.x.clone()`) when the class of the method sets
    `self.x` in `__init__` only: a tensor the object keeps, not data of the step."""
    function = ctx.frame.enclosing_function() if ctx.frame is not None else None
    cls = function.class_info if function is not None else None
    if cls is None:
        return None
    while (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and ((not expr.args and expr.func.attr.value in DTYPE_METHODS | _COPIES) or is_dtype_conversion(expr, ctx))
    ):
        expr = expr.func.value
    if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self"):
        return None
    name = expr.attr.value
    bindings = _attribute_bindings(cls, name, ctx, 0)
    if not bindings or any(b.scope.function is None or b.scope.function.name.value != "__init__" for b in bindings):
        return None
    return name


# Methods that give the same values in a new tensor (or a view): `self.t.clone().to(device)`.
_COPIES = frozenset({"clone", "detach", "contiguous"})


def _kept_advice(node: cst.Call, ctx, kept: str) -> str:
    """A model registers a buffer; any other object moves the tensor to the device once, in `__init__`."""
    if model_class(ctx) is not None:
        return register_buffer_advice(node, ctx, kept)
    return (
        f"move it to the device once, in `__init__` (`self.{kept} = ....to(device)`), or build it there with `device=`"
    )


def _attribute_bindings(cls, name: str, ctx, depth: int) -> list:
    """Every `self.name = ...` of the class and of its bases in this module."""
    found = list(cls.attributes.get(name, ()))
    for base in cls.bases:
        parent = ctx.index.classes.get(terminal_name(base) or "")
        if parent is not None and parent is not cls and depth < 4:
            found.extend(_attribute_bindings(parent, name, ctx, depth + 1))
    return found


def register_buffer_advice(node: cst.Call, ctx, kept: str | None = None) -> str:
    """Keep it in a buffer made once in `__init__`: it moves with `model.to(device)`, and a
    non-persistent one stays out of checkpoints, so that they load as before."""
    if kept is not None:
        return (
            f'register it in `__init__` with `self.register_buffer("{kept}", ..., persistent=False)` instead of '
            f"`self.{kept} = ...`, so that `model.to(device)` moves it once, with the model"
        )
    bound = ctx.index.bound_names.get(id(node))
    name = bound[0].rsplit(".", 1)[-1] if bound else "name"
    return (
        f'build it once in `__init__` as a buffer, `self.register_buffer("{name}", ..., persistent=False)`, '
        "so that `model.to(device)` moves it once, with the model"
    )


# Calls whose result differs from one call to the next: no buffer can hold them.
_RANDOM = frozenset(
    {
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "normal",
        "bernoulli",
        "multinomial",
        "poisson",
        "normal_",
        "uniform_",
        "bernoulli_",
        "random_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
    }
)


def built_from_constants(expr: cst.BaseExpression, ctx, scope, depth: int = 0, busy: frozenset = frozenset()) -> bool:
    """Does `expr` give the same tensor on every call: made from literals, module-level names and the
    model's own attributes (`self.max_len`), through names bound to such in the function; from no
    parameter (the batch, its shape), nothing random?"""
    if depth > 8:
        return False
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call) and terminal_name(node.func) in _RANDOM:
            return False
        if isinstance(node, cst.Attribute):
            stack.append(node.value)  # `torch.long`, `self.n`: the name it is read from
        elif isinstance(node, cst.Arg):
            stack.append(node.value)  # not the keyword
        elif isinstance(node, cst.Name):
            if not _constant_name(node.value, ctx, scope, depth, busy):
                return False
        else:
            stack.extend(node.children)
    return True


def _constant_name(name: str, ctx, scope, depth: int, busy: frozenset) -> bool:
    if name == "self" or name in busy:
        return True  # the model's own state; a name rebound from itself (`ids = ids.long()`)
    found = scope.lookup(name)
    if found is None or found[1].function is None:
        return True  # module level: an import, a constant, a builtin
    bindings, owner = found
    if name in owner.params or not bindings:
        return False  # what the caller passes: the batch, or something made from it
    return all(
        binding.kind in ("value", "element")
        and built_from_constants(binding.value, ctx, binding.scope, depth + 1, busy | {name})
        for binding in bindings
    )
