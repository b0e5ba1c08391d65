"""What a `DataLoader(...)`'s dataset holds, read from the code that makes it. Shared by the loader rules.

Not a rule (it declares none). Each question is answered yes only when the code shows it:

- `yields_python_data`: every item the dataset's own class returns from `__getitem__` is Python data
  (strings, numbers, and dicts, tuples and lists of them), and the loader has no `collate_fn` that
  could make tensors of it. diffusers' `PromptDataset` yields `{"prompt": self.prompt, "index":
  index}` to a loop that generates images: there is nothing to pin.
- `dataset_on_device`: the dataset's tensors already live on the GPU: `TensorDataset(x.to(device))`,
  or a dataset whose items the script replaced with what it computed on the device
  (`train_dataset.instance_videos = [encode_video(v) for v in ...]`, where `encode_video` moves its
  input to `accelerator.device`). Pinning a CUDA tensor raises, and worker processes cannot share it.
- `dataset_in_memory`: the class's `__getitem__` (and the loader's `collate_fn`) only index and
  stack what `__init__` prepared: no file is opened or decoded, no transform runs. A worker process
  would have nothing to take over.
"""

from __future__ import annotations

from typing import cast

import libcst as cst

from loopaudit.rule_api import (
    UNKNOWN,
    argument_for,
    command_line_default,
    iter_subtree,
    terminal_name,
)
from loopaudit.rules.data._loaders import device_literal

_DEFERRED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
# The node types a rule using these helpers must declare, so that the index records the assignments.
ASSIGNMENTS = (cst.Assign, cst.AugAssign)
_TENSOR_DATASETS = frozenset({"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"})

# Calls whose result is a Python scalar or string whatever they are given.
_SCALAR_CALLS = frozenset({"str", "repr", "len", "int", "float", "bool", "hash", "ord", "chr"})
# Builtins that give Python data when what they are given is Python data.
_PASSING_CALLS = frozenset(
    {"min", "max", "abs", "round", "sorted", "reversed", "list", "tuple", "dict", "zip", "enumerate", "range"}
)
# String methods (a tensor has none of them): their result is a string or a list of strings.
_STRING_METHODS = frozenset(
    {
        "format",
        "join",
        "replace",
        "strip",
        "lstrip",
        "rstrip",
        "lower",
        "upper",
        "split",
        "rsplit",
        "title",
        "capitalize",
        "casefold",
        "zfill",
        "splitlines",
        "removeprefix",
        "removesuffix",
    }
)
# Readers of formats that hold no tensors.
_DATA_READERS = frozenset(
    {
        "json.load",
        "json.loads",
        "yaml.load",
        "yaml.safe_load",
        "yaml.full_load",
        "tomllib.load",
        "tomllib.loads",
        "toml.load",
        "toml.loads",
    }
)
# Methods that put values into a container.
_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "add"})

# What `__getitem__` may call and still only read what is in memory: builtins, string and
# container methods, random choices of an index, and conversions of what it indexed to a tensor.
_CHEAP_BUILTINS = (
    _SCALAR_CALLS | _PASSING_CALLS | frozenset({"isinstance", "getattr", "hasattr", "sum", "any", "all", "divmod"})
)
_CHEAP_METHODS = (
    _STRING_METHODS
    | _MUTATORS
    | frozenset(
        {
            "items",
            "keys",
            "values",
            "get",
            "copy",
            "pop",
            "index",
            "count",
            "startswith",
            "endswith",
        }
    )
)
_CHEAP_TORCH = frozenset(
    {
        "tensor",
        "as_tensor",
        "from_numpy",
        "stack",
        "cat",
        "LongTensor",
        "FloatTensor",
        "IntTensor",
        "BoolTensor",
        "Tensor",
    }
)
# A collate function may also stack and reshape tensors (no reading, no decoding).
_TENSOR_METHODS = frozenset(
    {
        "to",
        "float",
        "half",
        "double",
        "long",
        "int",
        "bool",
        "contiguous",
        "clone",
        "permute",
        "view",
        "reshape",
        "squeeze",
        "unsqueeze",
        "flatten",
        "transpose",
        "repeat",
        "expand",
        "detach",
        "size",
        "dim",
    }
)
# Attributes of a device value that are not on the device themselves.
_HOST_ATTRIBUTES = frozenset({"shape", "dtype", "device", "ndim", "config", "is_cuda"})
# Methods whose result is on the host (or a Python value), whatever they are called on.
_TO_HOST = frozenset({"cpu", "numpy", "tolist", "item", "size", "dim", "numel", "nelement", "stride", "__len__"})


# --- the dataset a loader is handed -------------------------------------------------------------


def _dataset_argument(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None or arg.keyword.value == "dataset":
            return arg.value
    return None


def _dataset_values(call: cst.Call, ctx) -> list[tuple[cst.BaseExpression, object]]:
    """What made the dataset: the argument itself, or each value its name is bound to (with the scope)."""
    dataset = _dataset_argument(call)
    if dataset is None:
        return []
    if isinstance(dataset, cst.Name):
        found = ctx.scope.lookup(dataset.value)
        if not found or not found[0] or any(b.kind != "value" for b in found[0]):
            return []
        return [(b.value, b.scope) for b in found[0]]
    return [(dataset, ctx.scope)]


def _dataset_classes(call: cst.Call, ctx) -> list:
    """The module's own classes the dataset is made from (each binding a call of one), else []."""
    classes = []
    for value, _ in _dataset_values(call, ctx):
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Name)):
            return []
        cls = ctx.index.classes.get(value.func.value)
        if cls is None:
            return []
        classes.append(cls)
    return classes


def _method(cls, name: str, ctx, depth: int = 0):
    """`cls`'s method `name`, or the one it inherits from a class of the module."""
    if name in cls.methods:
        return cls.methods[name]
    for base in cls.bases:
        parent = ctx.index.classes.get(terminal_name(base) or "")
        if parent is not None and parent is not cls and depth < 4:
            found = _method(parent, name, ctx, depth + 1)
            if found is not None:
                return found
    return None


def _attribute_bindings(cls, attr: str, ctx, depth: int = 0) -> list:
    bindings = list(cls.attributes.get(attr, ()))
    for base in cls.bases:
        parent = ctx.index.classes.get(terminal_name(base) or "")
        if parent is not None and parent is not cls and depth < 4:
            bindings += _attribute_bindings(parent, attr, ctx, depth + 1)
    return bindings


def _collate_function(call: cst.Call, ctx):
    """None when the loader has no `collate_fn` (or `collate_fn=None`); the module function it names
    (directly, or called by a lambda: `lambda examples: collate_fn(examples, flag)`); else UNKNOWN."""
    value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "collate_fn"), None)
    if value is None or (isinstance(value, cst.Name) and value.value == "None"):
        return None
    if any(a.star == "**" for a in call.args):
        return UNKNOWN
    if isinstance(value, cst.Lambda) and isinstance(value.body, cst.Call):
        value = value.body.func
    if isinstance(value, cst.Name):
        found = ctx.scope.lookup(value.value)
        if found is not None and found[0]:
            return UNKNOWN  # a variable holding some callable
        functions = [f for f in ctx.index.functions if f.name == value.value and f.class_info is None]
        if len(functions) == 1:
            return functions[0]
    return UNKNOWN


# --- what the module writes where ---------------------------------------------------------------


def _stores(ctx) -> dict:
    return ctx.memoized("dataset stores", lambda: _collect_stores(ctx))


def _collect_stores(ctx) -> dict:
    """Writes that bindings do not record:
    ("item", id(scope), name) -> (value, its scope) put into `name` (`example["prompt"] = p`,
    `xs.append(v)`), keyed by the scope the name belongs to;
    ("self item", id(class), attr) -> (value, its scope) put into `self.attr`;
    ("attribute", attr) -> (object name, value, scope) for `obj.attr = value` outside the class.
    Read from the assignments the index recorded (the rules that ask declare ASSIGNMENTS among their
    node types) and its calls."""
    stores: dict = {}
    for node_type in ASSIGNMENTS:
        for site in ctx.index.sites.get(node_type, ()):
            node = site.node
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            for target in targets:
                _note_store(stores, target, node.value, site.scope)
    for site in ctx.index.calls:
        func = site.call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _MUTATORS:
            for arg in site.call.args:
                _note_item(stores, func.value, arg.value, site.scope)
    return stores


def _note_store(stores: dict, target: cst.BaseExpression, value: cst.BaseExpression, scope) -> None:
    if isinstance(target, cst.Subscript):
        _note_item(stores, target.value, value, scope)
    elif isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value != "self":
        stores.setdefault(("attribute", target.attr.value), []).append((target.value.value, value, scope))


def _note_item(stores: dict, container: cst.BaseExpression, value: cst.BaseExpression, scope) -> None:
    if isinstance(container, cst.Name):
        found = scope.lookup(container.value)
        owner = found[1] if found is not None else scope  # the scope whose name it fills
        stores.setdefault(("item", id(owner), container.value), []).append((value, scope))
    elif (
        isinstance(container, cst.Attribute)
        and isinstance(container.value, cst.Name)
        and container.value.value == "self"
        and scope.owner_class is not None
    ):
        stores.setdefault(("self item", id(scope.owner_class), container.attr.value), []).append((value, scope))


# --- items that are Python data -----------------------------------------------------------------


def yields_python_data(call: cst.Call, ctx) -> bool:
    """Does every item of the loader's dataset hold Python data only, batched by the default collate
    (strings stay lists of strings, numbers become a small index tensor)?"""
    if _collate_function(call, ctx) is not None:
        return False
    classes = _dataset_classes(call, ctx)
    if not classes:
        return False
    question = _PythonData(ctx)
    for cls in classes:
        getitem = _method(cls, "__getitem__", ctx)
        if getitem is None or not getitem.returns:
            return False
        if not all(question.holds(value, getitem.scope) for value in getitem.returns):
            return False
    return True


class _PythonData:
    """Is an expression shown to be Python data: strings, numbers, None, and containers of them?

    One question: every part must be Python data, so an expression met again while it is being
    decided (`n = n + 1`, a name bound from itself) counts as what its other parts say, and each
    expression is decided once (the answers hold for this question only: they may rest on that)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.decided: dict[int, bool] = {}

    def holds(self, expr: cst.BaseExpression, scope, depth: int = 0) -> bool:
        if depth > 24:
            return False
        key = id(expr)
        if key not in self.decided:
            self.decided[key] = True  # while deciding
            self.decided[key] = self._decide(expr, scope, depth + 1)
        return self.decided[key]

    def _decide(self, expr: cst.BaseExpression, scope, depth: int) -> bool:
        ctx, holds = self.ctx, self.holds
        if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer, cst.Float)):
            return True
        if isinstance(expr, cst.Name):
            return expr.value in ("True", "False", "None") or self._name(expr.value, scope, depth)
        if isinstance(expr, cst.Dict):
            return all(
                holds(e.value, scope, depth) and (not isinstance(e, cst.DictElement) or holds(e.key, scope, depth))
                for e in expr.elements
            )
        if isinstance(expr, (cst.Tuple, cst.List, cst.Set)):
            return all(holds(e.value, scope, depth) for e in expr.elements)
        if isinstance(expr, (cst.BinaryOperation, cst.BooleanOperation)):
            return holds(expr.left, scope, depth) and holds(expr.right, scope, depth)
        if isinstance(expr, cst.UnaryOperation):
            return holds(expr.expression, scope, depth)
        if isinstance(expr, cst.IfExp):
            return holds(expr.body, scope, depth) and holds(expr.orelse, scope, depth)
        if isinstance(expr, cst.Subscript):
            return holds(expr.value, scope, depth)  # an item of Python data
        if isinstance(expr, cst.Attribute):
            if isinstance(expr.value, cst.Name) and expr.value.value == "self":
                return self._self_attribute(expr.attr.value, scope, depth)
            # `args.class_prompt`: a command-line option (or a configuration key) the module declares
            return command_line_default(expr, ctx) is not UNKNOWN
        if isinstance(expr, cst.Call):
            func = expr.func
            if isinstance(func, cst.Name) and func.value in _SCALAR_CALLS:
                return True
            if (ctx.qualified_name(func) or "") in _DATA_READERS:
                return True  # `concepts = json.load(f)`
            if isinstance(func, cst.Attribute) and func.attr.value in _STRING_METHODS:
                return True
            if isinstance(func, cst.Name) and func.value in _PASSING_CALLS and scope.lookup(func.value) is None:
                return all(not arg.star and holds(arg.value, scope, depth) for arg in expr.args)
        return False

    def _name(self, name: str, scope, depth: int) -> bool:
        found = scope.lookup(name)
        if found is None:
            return False
        bindings, owner = found
        if not bindings and name not in owner.params:
            return False
        for binding in bindings:
            if binding.kind not in ("value", "augment", "element", "loop"):
                return False
            if not self.holds(binding.value, binding.scope, depth):
                return False
        # `example["prompt"] = self.prompt`, `prompts.append(p)`: what is put into it
        if not all(self.holds(v, where, depth) for v, where in _stores(self.ctx).get(("item", id(owner), name), ())):
            return False
        return name not in owner.params or self._parameter(name, owner, depth)

    def _parameter(self, name: str, owner, depth: int) -> bool:
        """The index `__getitem__` is handed, or a constructor parameter every construction in the
        module fills with Python data (`PromptDataset(args.class_prompt, num_new_images)`)."""
        function, cls = owner.function, owner.owner_class
        if function is None or cls is None:
            return False
        info = cls.methods.get(function.name.value)
        if info is None or info.node is not function:
            return False
        if info.name == "__getitem__":
            return info.positional_params[:1] == (name,)
        if info.name != "__init__":
            return False
        sites = [
            site
            for site in self.ctx.index.calls
            if isinstance(site.call.func, cst.Name) and site.call.func.value == cls.name
        ]
        if not sites:
            return False
        default = next((p.default for p in function.params.params if p.name.value == name), None)
        for site in sites:
            if any(arg.star for arg in site.call.args):
                return False
            argument, where = argument_for(info, name, site.call), site.scope
            if argument is None:
                argument, where = default, owner  # not passed: the default applies
            if argument is None or not self.holds(argument, where, depth):
                return False
        return True

    def _self_attribute(self, attr: str, scope, depth: int) -> bool:
        cls = scope.owner_class
        if cls is None:
            return False
        bindings = _attribute_bindings(cls, attr, self.ctx)
        stores = _stores(self.ctx)
        if not bindings or stores.get(("attribute", attr)):
            return False  # never set, or also set from outside the class
        if not all(b.kind == "value" and self.holds(b.value, b.scope, depth) for b in bindings):
            return False
        return all(self.holds(v, where, depth) for v, where in stores.get(("self item", id(cls), attr), ()))


# --- datasets on the device ---------------------------------------------------------------------


def dataset_on_device(call: cst.Call, ctx) -> bool:
    """Are the dataset's tensors on the GPU: a `TensorDataset` of tensors on the device, or a dataset
    of the module whose items the script replaced with values computed there (an attribute its
    `__getitem__` reads, assigned from outside: `train_dataset.instance_videos = encoded_videos`)?
    What a constructor is handed is not enough: a dataset may keep a device tensor for one option
    (precomputed embeddings) and still read and decode its images per item."""
    for value, scope in _dataset_values(call, ctx):
        if isinstance(value, cst.Call) and (ctx.qualified_name(value.func) or "") in _TENSOR_DATASETS:
            if any(_on_device(arg.value, scope, ctx) for arg in value.args if not arg.star):
                return True
    dataset = _dataset_argument(call)
    if not isinstance(dataset, cst.Name):
        return False
    found = ctx.scope.lookup(dataset.value)
    owner = found[1] if found else None
    replaced = [
        (key[1], value, where)
        for key, stored in _stores(ctx).items()
        if key[0] == "attribute"
        for name, value, where in stored
        if name == dataset.value and where is owner
    ]
    classes = _dataset_classes(call, ctx) if replaced else []
    read = set()
    for cls in classes:
        getitem = _method(cls, "__getitem__", ctx)
        if getitem is not None:
            read |= _self_attributes_read(getitem)
    return any(attr in read and _on_device(value, where, ctx) for attr, value, where in replaced)


def _self_attributes_read(function) -> set[str]:
    return {
        node.attr.value
        for node in iter_subtree(function.node.body, skip_inside=_DEFERRED)
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self"
    }


def _names_device(expr: cst.BaseExpression, ctx) -> bool:
    """ "cuda", f"cuda:{rank}", `torch.device("cuda")`, `device`, `accelerator.device`, `self.device`."""
    literal = device_literal(expr, ctx)
    if literal is not None:
        return literal
    name = terminal_name(expr) if not isinstance(expr, cst.Call) else None
    return name is not None and (name == "device" or name.endswith("_device")) and "cpu" not in name.lower()


def _on_device(expr: cst.BaseExpression, scope, ctx, depth: int = 0, seen: set | None = None) -> bool:
    """Is `expr` computed on the device: moved there, made with `device=`, the result of a call
    handed a device or a value on it, or bound from one? (`seen`: the expressions already asked
    about, each once: the answer is any path's.)"""
    seen = set() if seen is None else seen
    if depth > 12 or id(expr) in seen:
        return False
    seen.add(id(expr))
    deeper = depth + 1
    if isinstance(expr, cst.Call):
        return _call_on_device(expr, scope, ctx, depth, seen)
    if isinstance(expr, cst.Name):
        found = scope.lookup(expr.value)
        if not found:
            return False
        bindings, owner = found
        use = ctx.index.uses.get(id(expr))
        if use is not None:
            # What the name holds here: `x = x_test[0].to(device)` later in the function is another value
            bindings = [b for b in bindings if b.order < use[0] or b.kind == "loop"]
        if any(
            b.kind in ("value", "augment", "element", "loop") and _on_device(b.value, b.scope, ctx, deeper, seen)
            for b in bindings
        ):
            return True
        stored = _stores(ctx).get(("item", id(owner), expr.value), ())
        return any(_on_device(v, where, ctx, deeper, seen) for v, where in stored)
    if isinstance(expr, cst.Attribute):
        return expr.attr.value not in _HOST_ATTRIBUTES and _on_device(expr.value, scope, ctx, deeper, seen)
    if isinstance(expr, cst.Subscript):
        return _on_device(expr.value, scope, ctx, deeper, seen)
    if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
        return any(_on_device(e.value, scope, ctx, deeper, seen) for e in expr.elements)
    if isinstance(expr, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
        return _on_device(expr.elt, scope, ctx, deeper, seen)
    if isinstance(expr, cst.BinaryOperation):
        return _on_device(expr.left, scope, ctx, deeper, seen) or _on_device(expr.right, scope, ctx, deeper, seen)
    return False


def _call_on_device(call: cst.Call, scope, ctx, depth: int, seen: set) -> bool:
    func = call.func
    method = func.attr.value if isinstance(func, cst.Attribute) else None
    if method in _TO_HOST or (isinstance(func, cst.Name) and func.value in _SCALAR_CALLS):
        return False  # `x.size()[-1]`, `len(x)`, `int(x)`: Python numbers
    if method == "cuda":
        return True
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if "device" in keywords:
        return _names_device(keywords["device"], ctx)  # `torch.zeros(n, device=device)`, `.to(device=...)`
    if any(_names_device(arg, ctx) for arg in positional):
        return True  # `x.to(device)`, `encode(tokenizer, prompts, accelerator.device)`
    deeper = depth + 1
    site = ctx.steps.call_site(call)
    for function in ctx.steps.resolve(site) if site is not None else ():
        if any(_on_device(value, function.scope, ctx, deeper, seen) for value in function.returns):
            return True  # a function of the module whose result it computed on the device
    if (
        method is not None
        and ctx.qualified_name(func) is None
        and _on_device(cast(cst.Attribute, func).value, scope, ctx, deeper, seen)
    ):
        return True  # `latents.sample()`, `vae.encode(x)` on a value on the device
    return any(_on_device(arg.value, scope, ctx, deeper, seen) for arg in call.args if not arg.star)


# --- datasets held in memory --------------------------------------------------------------------


def dataset_in_memory(call: cst.Call, ctx) -> bool:
    """Does each item only index what the dataset's class prepared in `__init__`, with a collate
    function (if any) that only stacks it?"""
    classes = _dataset_classes(call, ctx)
    if not classes:
        return False
    for cls in classes:
        getitem = _method(cls, "__getitem__", ctx)
        if getitem is None or not _only_indexes(getitem, ctx, cheap_tensor_work=False):
            return False
    collate = _collate_function(call, ctx)
    return collate is None or (collate is not UNKNOWN and _only_indexes(collate, ctx, cheap_tensor_work=True))


def _only_indexes(function, ctx, cheap_tensor_work: bool, depth: int = 0) -> bool:
    """Does `function` call nothing that could read a file, decode or transform: only builtins,
    string and container methods, random choices, tensor conversions (and, for a collate function,
    stacking and reshaping), and methods of its own class that do the same?"""
    for node in iter_subtree(function.node.body, skip_inside=_DEFERRED):
        if isinstance(node, (cst.Lambda, cst.FunctionDef)):
            return False  # a deferred body we do not follow
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        qualified = ctx.qualified_name(func) or ""
        if isinstance(func, cst.Name) and func.value in _CHEAP_BUILTINS and not qualified:
            continue
        if qualified.startswith(("random.", "numpy.random.")):
            continue
        if qualified.startswith("torch.") and (cheap_tensor_work or qualified.rsplit(".", 1)[-1] in _CHEAP_TORCH):
            continue
        if isinstance(func, cst.Attribute) and not qualified:
            method = func.attr.value
            if method in _CHEAP_METHODS or (cheap_tensor_work and method in _TENSOR_METHODS):
                continue
            receiver = func.value
            if isinstance(receiver, cst.Name) and receiver.value == "self" and function.class_info is not None:
                own = _method(function.class_info, method, ctx)
                if own is not None and depth < 3 and _only_indexes(own, ctx, cheap_tensor_work, depth + 1):
                    continue
        if isinstance(func, cst.Name) and not qualified and depth < 3:
            helpers = [f for f in ctx.index.functions if f.name == func.value and f.class_info is None]
            if len(helpers) == 1 and _only_indexes(helpers[0], ctx, cheap_tensor_work, depth + 1):
                continue  # `collate_fn(examples, flag)` inside the lambda, a helper that only stacks
        return False
    return True
