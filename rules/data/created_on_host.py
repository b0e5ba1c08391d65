from __future__ import annotations

import libcst as cst

from loopaudit.rule import Report, Rule
from loopaudit.walk import holds, iter_subtree

from ._loaders import moves_to_device

# Factories that can fill the tensor on the device itself (a kernel, no copy) when given `device=`.
_FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "rand", "randn", "randint",
    "randperm", "eye",
})
# Factories from Python data: flagged only for constants (data the script computes must be copied anyway).
_FROM_DATA = frozenset({"tensor", "as_tensor"})
# The legacy typed constructors: `torch.LongTensor(b, n)` makes an uninitialised tensor of that size
# on the host, `torch.IntTensor([length] * b)` one from data.
_LEGACY = frozenset({
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
    "CharTensor", "ByteTensor", "BoolTensor", "Tensor",
})


def _is_fill(expr: cst.BaseExpression) -> bool:
    """`[value] * n`: one value repeated, which `torch.full((n,), value, device=...)` makes on the device."""
    if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
        return False
    for side in (expr.left, expr.right):
        if isinstance(side, cst.List) and len(side.elements) == 1 and not isinstance(side.elements[0], cst.StarredElement):
            return isinstance(side.elements[0].value, (cst.Name, cst.Attribute, cst.Integer, cst.Float))
    return False


def _legacy_host_creation(call: cst.Call) -> bool:
    """`torch.LongTensor(b, n)` (sizes) or `torch.IntTensor([c] * b)` / `torch.FloatTensor([0.5])` (a fill or a constant)."""
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    if not positional or len(positional) != len(call.args):
        return False
    if len(positional) == 1 and isinstance(positional[0], (cst.List, cst.Tuple, cst.BinaryOperation)):
        return _is_constant(positional[0]) or _is_fill(positional[0])
    if len(positional) == 1:
        # `torch.LongTensor(n)` is a size, `torch.LongTensor(tokens)` data the script computed: only a
        # number written out, or a `range(...)` (an arange), can be told apart.
        return isinstance(positional[0], cst.Integer) or _is_range(positional[0])
    return all(isinstance(arg, (cst.Integer, cst.Name, cst.Attribute, cst.BinaryOperation)) for arg in positional)


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
        return bool(expr.elements) and all(_is_constant(e.value) for e in expr.elements if not isinstance(e, cst.StarredElement))
    return False


def _keyword(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _host_creation(expr: cst.BaseExpression, ctx) -> cst.Call | None:
    """The `torch.<factory>(...)` call at the root of `expr` (through `.float()`, `.unsqueeze(0)`, ...)
    when it creates the tensor on the host, else None."""
    while isinstance(expr, cst.Call):
        qualified = ctx.qualified_name(expr.func) or ""
        if qualified.startswith("torch.") and qualified.count(".") == 1:
            factory = qualified[6:]
            if factory in _LEGACY:
                return expr if _legacy_host_creation(expr) else None
            if factory not in _FACTORIES and factory not in _FROM_DATA:
                # `torch.triu(torch.full(...))`: computed on the host from a host-made tensor
                first = expr.args[0] if expr.args else None
                if first is None or first.keyword is not None or first.star or factory[:1].isupper():
                    return None
                expr = first.value
                continue
            if any(arg.star for arg in expr.args):
                return None
            device = _keyword(expr, "device")
            if device is not None and not (isinstance(device, cst.SimpleString) and device.evaluated_value == "cpu"):
                return None  # already on the device: the move is a no-op or a dtype change
            pin = _keyword(expr, "pin_memory")
            if pin is not None and not (isinstance(pin, cst.Name) and pin.value == "False"):
                return None  # pinned host staging, on purpose
            if _keyword(expr, "generator") is not None:
                return None  # a CPU generator: the same random numbers on every machine, on purpose
            if factory in _FROM_DATA:
                data = expr.args[0].value if expr.args and expr.args[0].keyword is None else None
                if data is None or not (_is_constant(data) or _is_fill(data) or _is_range(data)):
                    return None
            return expr
        if not isinstance(expr.func, cst.Attribute):
            return None
        expr = expr.func.value
    return None


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
    return None if _written_in_place(body, expr.value, ctx) else creation


def _written_in_place(body: cst.CSTNode, name: str, ctx) -> bool:
    for node in iter_subtree(body):
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value == name:
            if id(node) in ctx.index.stored_subscripts:
                return True
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value.endswith("_"):
            if isinstance(node.func.value, cst.Name) and node.func.value.value == name:
                return True
    return False


class CreatedOnHostThenMoved(Rule):
    code = "LA205"
    name = "tensor-created-on-host-then-moved"
    summary = "`torch.arange(n).to(device)` and kin once per step: create the tensor on the device with `device=`."
    message = "this tensor is built on the CPU and copied to the GPU with a blocking copy, once per step"
    suggestion = (
        "create it where it is used: `torch.arange(n, device=device)`, `torch.ones(shape, device=x.device)`; "
        "for a constant (`torch.tensor(0.5)`), create it once before the loop or use "
        "`torch.full((), 0.5, device=device)`"
    )
    what_it_flags = (
        "In code that runs once per step of a CUDA script, a tensor made by a `torch` factory without "
        "`device=` and then moved with `.to(device)`, `.to(other_gpu_tensor)` or `.cuda()`, possibly through dtype or shape methods "
        "in between: `torch.arange(n).to(device)`, `torch.ones(b, 1).float().cuda()`, "
        "`torch.randn(shape).to(device)`, `torch.triu(torch.full((t, t), -inf), 1).to(device)`, `torch.LongTensor(range(n)).to(device)`, and `torch.tensor(...)` / `torch.as_tensor(...)` of a literal "
        "constant (`torch.tensor(0.5).cuda()`, `torch.tensor([1.0, 2.0]).to(device)`). Not flagged: "
        "factories given `pin_memory=True` (host staging on purpose) or a `generator=` (CPU random "
        "numbers on purpose), `torch.tensor(data)` of data the script computes, and moves with "
        "`non_blocking=True`."
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
        "    weights = torch.ones(x.size(0))\n"
        "    loss = (model(x) * weights.cuda()).sum()  # expect: LA205\n"
        "    loss.backward()\n"
        "    optimizer.step()\n",
        # Made in a function that runs per step, and moved where it is when CUDA is there (tacotron2).
        "import torch\n"
        "def get_mask_from_lengths(lengths):\n"
        "    ids = torch.arange(0, 100, dtype=torch.long)\n"
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
    )

    confirmed_by = ("LA601",)
    confirmable_on_cpu = False  # a CPU run never copies to a device
    node_types = (cst.Call,)

    def check(self, node, ctx):
        receiver = moves_to_device(node, ctx)
        if receiver is None:
            return
        creation = _host_creation(receiver, ctx) or _named_host_creation(receiver, ctx)
        if creation is None:
            return
        constant = (ctx.qualified_name(creation.func) or "").rsplit(".", 1)[-1] in _FROM_DATA
        fix = "create it once, before the loop" if constant else "create it with `device=`"
        yield Report(
            node,
            f"`{ctx.source(creation.func)}(...)` builds the tensor on the CPU and `.{node.func.attr.value}(...)` "
            f"copies it to the GPU with a blocking copy, once per step: {fix}",
        )
