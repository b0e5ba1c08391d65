"""Helpers shared by the LA2xx rules: reading `DataLoader(...)` arguments and `.to(...)` targets.

Not a rule: it declares no Rule subclass, so the registry finds nothing here.
"""

from __future__ import annotations

import builtins
import re
from typing import Any, cast

import libcst as cst

from loopaudit.rule_api import (
    BATCH_FETCH,
    TORCH_CONVERSIONS,
    TORCH_FACTORIES,
    UNKNOWN,
    FrameKind,
    Kind,
    LoopInfo,
    argument_for,
    dotted_name,
    drawn_from,
    iter_subtree,
    next_of,
    terminal_name,
    unwrap_iterable,
)

# The legacy typed constructors: `torch.LongTensor(b, n)` makes an uninitialised tensor of that size
# on the host, `torch.FloatTensor(x)` copies the data given as its one argument.
LEGACY_CONSTRUCTORS = frozenset(
    {
        "FloatTensor",
        "DoubleTensor",
        "HalfTensor",
        "BFloat16Tensor",
        "LongTensor",
        "IntTensor",
        "ShortTensor",
        "CharTensor",
        "ByteTensor",
        "BoolTensor",
        "Tensor",
    }
)

# Positions of DataLoader's positional parameters (persistent_workers is keyword-only).
_POSITIONS = {"num_workers": 5, "pin_memory": 7}


# Libraries whose `DataLoader` is torch's (or a subclass of it, with the same arguments). DGL's
# `dgl.dataloading.DataLoader`, say, places its output on the device itself and is left alone.
_LOADER_LIBRARIES = ("torch", "torch_geometric", "monai")


def is_dataloader(call: cst.Call, ctx) -> bool:
    qualified = ctx.qualified_name(call.func) or ""
    return qualified.endswith(".DataLoader") and qualified.split(".")[0] in _LOADER_LIBRARIES


def loader_argument(call: cst.Call, name: str, ctx=None):
    """The expression passed for DataLoader parameter `name`; None when it is not passed (the default
    applies); UNKNOWN when `*args`, or `**kwargs` we cannot read, may pass it.

    `**kwargs` is read when `kwargs` is bound only to dict literals (also `{...} if use_cuda else {}`)
    and updated only with dict literals or such names (`train_kwargs.update(cuda_kwargs)`), the
    pattern of pytorch/examples."""
    position = _POSITIONS.get(name)
    index = 0
    for arg in call.args:
        if arg.star == "**":
            entries = _dict_entries(arg.value, ctx) if ctx is not None else None
            if entries is None:
                return UNKNOWN
            if name in entries:
                return entries[name]
            continue
        if arg.star:
            return UNKNOWN
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return arg.value
        else:
            if index == position:
                return arg.value
            index += 1
    return None


def _dict_entries(expr: cst.BaseExpression, ctx, depth: int = 0) -> dict | None:
    """Key -> value expression of a dict we can read completely, else None."""
    if depth > 3:
        return None
    if isinstance(expr, cst.Dict):
        entries: dict = {}
        for element in expr.elements:
            if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                return None
            entries[element.key.evaluated_value] = element.value
        return entries
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name) and expr.func.value == "dict":
        # `dict(batch_size=batch_size, num_workers=4, pin_memory=True)` (Pytorch-UNet's loader_args)
        if any(arg.keyword is None for arg in expr.args):
            return None
        return {cast(cst.Name, arg.keyword).value: arg.value for arg in expr.args}
    if isinstance(expr, cst.IfExp):
        # `{"num_workers": 1, "pin_memory": True} if use_cuda else {}`: these rules are about the
        # CUDA path, so a key set in either branch counts.
        body, orelse = _dict_entries(expr.body, ctx, depth + 1), _dict_entries(expr.orelse, ctx, depth + 1)
        return None if body is None or orelse is None else {**orelse, **body}
    if isinstance(expr, cst.Name):
        found = ctx.scope.lookup(expr.value)
        if not found or not found[0]:
            return None
        entries = {}
        for binding in found[0]:
            part = _dict_entries(binding.value, ctx, depth + 1) if binding.kind == "value" else None
            if part is None:
                return None
            entries.update(part)
        for site in ctx.index.calls:
            func = site.call.func
            if (
                isinstance(func, cst.Attribute)
                and func.attr.value in ("update", "setdefault", "pop", "__setitem__")
                and isinstance(func.value, cst.Name)
                and func.value.value == expr.value
                and site.scope is found[1]
            ):
                if func.attr.value != "update" or len(site.call.args) != 1 or site.call.args[0].keyword:
                    return None
                part = _dict_entries(site.call.args[0].value, ctx, depth + 1)
                if part is None:
                    return None
                entries.update(part)
        return entries
    return None


def step_loops(call: cst.Call, ctx) -> list[LoopInfo]:
    """The loops that iterate what this call is bound to and drive the GPU on every iteration: step
    loops (training or evaluation), or loops whose iterations hold step loops (StepModel.feeds_steps)."""
    return [loop for loop in ctx.steps.loops_over(call) if ctx.steps.feeds_steps(loop)]


def loop_trains(loop: LoopInfo, ctx) -> bool:
    """Does one iteration of the loop train: backward / optimizer.step here, in a function it calls,
    or in the step loops it holds?"""
    return ctx.steps.feeding_trains(loop)


def remote_step_loops(call: cst.Call, ctx):
    """(call site, trains) for each call that hands this loader to another module's step loop."""
    return ctx.steps.remote_step_loops(call)


def returned_step_uses(call: cst.Call, ctx):
    """(trains, again and again) for each step loop elsewhere that iterates this loader after a
    function of this module returns it."""
    return ctx.steps.returned_step_uses(call)


def iterated_every_epoch(node: cst.Call, ctx, training_only: bool = False) -> bool:
    """Is the loader made by `node` made once and iterated again and again (once per epoch), here, in
    another module's step loop it is handed to, or after a helper of this module returns it? With
    `training_only`, only loops that train count."""
    return (
        any(
            _reused_across_epochs(loop, node, ctx)
            for loop in step_loops(node, ctx)
            if not training_only or loop_trains(loop, ctx)
        )
        # handed to another module's step loop (`train_one_epoch(model, loader)`) again and again
        or any(
            _repeated_from(site.frame, set(), node, ctx)
            for site, trains in remote_step_loops(node, ctx)
            if not training_only or trains
        )
        # returned by this module's helper, then iterated every epoch elsewhere
        or any(again for trains, again in returned_step_uses(node, ctx) if not training_only or trains)
    )


def _reused_across_epochs(loop, node, ctx) -> bool:
    """Is the loader made once and iterated again and again? Some loop must repeat the iteration
    without repeating the `DataLoader(...)` call: a loader built inside `validate()` is a new one at
    every call, and keeping its workers alive would not help."""
    iterated = {name for expr in drawn_from(loop) if (name := terminal_name(expr))}
    return _repeated_from(loop.frame.parent, iterated, node, ctx)


def _repeated_from(frame, names: set[str], node, ctx) -> bool:
    """Is code in `frame` (a loop over the loader, or a call handing it to another module's loop)
    run again and again while the loader made by `node` lives?"""
    around_creation = set()
    creating = ctx.frame
    while creating is not None and creating.kind not in (FrameKind.FUNCTION, FrameKind.MODULE):
        around_creation.add(id(creating))
        creating = creating.parent
    return _repeated_without(frame, creating, around_creation, frozenset(), names, _PassesLoader(ctx, node))


class _PassesLoader:
    """Does a call hand our loader on: `validation(model, loader)`, not `validation(model, valid_loader)`?"""

    def __init__(self, ctx, creation: cst.Call) -> None:
        self.ctx = ctx
        self.bound = ctx.steps.bound_name(creation)

    def __call__(self, site, function, params: list[str]) -> bool:
        if not params or self.bound is None:
            return True  # the loop reads an attribute, or the loader has no name: every call counts
        name, scope = self.bound
        for param in params:
            argument = argument_for(function, param, site.call)
            if argument is not None and self.ctx.steps.refers_to(argument, name, scope, site.scope):
                return True
        return False


def _repeated_without(frame, creating_function, around_creation: set, seen: frozenset, names: set[str], passes) -> bool:
    """`names`: what the loop calls the loader (so only the call sites that pass this loader count)."""
    while frame is not None:
        if frame.kind is FrameKind.LOOP and id(frame) not in around_creation:
            return True
        if frame is creating_function:
            return False
        if frame.kind is FrameKind.FUNCTION:
            # The loader was passed in: is this function called from a loop, the creator's excepted?
            function = frame.function
            if function is None or id(function) in seen:
                return False
            params = [name for name in names if name in function.scope.params]
            return any(
                _repeated_without(site.frame, creating_function, around_creation, seen | {id(function)}, set(), passes)
                for site in function.call_sites
                if passes(site, function, params)
            )
        frame = frame.parent
    return False


# Lightning's hooks that hand it a loader to iterate: the training one at every epoch, the others at
# every validation, test or predict run (which, for validation, is every epoch too).
_LIGHTNING_LOADER_HOOKS = {
    "train_dataloader": "train",
    "val_dataloader": "eval",
    "test_dataloader": "eval",
    "predict_dataloader": "eval",
}


def lightning_loader_role(call: cst.Call, ctx) -> str | None:
    """ "train" or "eval" for a DataLoader returned by a LightningModule's or LightningDataModule's
    `train_dataloader()` / `val_dataloader()` / ..., which Lightning's own loop iterates; else None."""
    # FunctionInfo | None; role is None whenever function is
    function: Any = ctx.frame.enclosing_function() if ctx.frame is not None else None
    role = _LIGHTNING_LOADER_HOOKS.get(function.name) if function is not None else None
    if role is None or function.class_info is None or not _is_lightning_class(function.class_info, ctx):
        return None
    bound = ctx.index.bound_names.get(id(call))
    for node in iter_subtree(function.node.body, skip_inside=(cst.FunctionDef, cst.ClassDef, cst.Lambda)):
        if isinstance(node, cst.Return) and node.value is not None:
            if node.value is call or (
                bound is not None and isinstance(node.value, cst.Name) and node.value.value == bound[0]
            ):
                return role
    return None


def _is_lightning_class(cls, ctx, depth: int = 0) -> bool:
    if ctx.steps.framework_of(cls) == "LightningModule":
        return True
    for base in cls.bases:
        name = ctx.index.imports.qualify(base) or dotted_name(base) or ""
        if name.endswith("LightningDataModule"):
            return True
        parent = ctx.index.classes.get(terminal_name(base) or "")
        if parent is not None and depth < 4 and _is_lightning_class(parent, ctx, depth + 1):
            return True
    return False


def enclosing_function_name(loop: LoopInfo) -> str:
    frame = loop.frame.parent
    while frame is not None:
        if frame.kind is FrameKind.FUNCTION and frame.function is not None:
            return frame.function.name
        frame = frame.parent
    return ""


# --- host-to-device moves -----------------------------------------------------------------------

_DEVICE_NAME_HINTS = ("device", "dev", "gpu", "rank", "cuda")


def device_literal(expr: cst.BaseExpression, ctx) -> bool | None:
    """Whether a literal or a device constructor names a CUDA device: True for "cuda", "cuda:0",
    f"cuda:{rank}", `torch.device("cuda")`, `torch.device(args.device)` (a device we cannot read, not
    "cpu"), `torch.cuda.current_device()`; False for "cpu", `torch.device("cpu")`, other strings;
    None for any other expression."""
    if isinstance(expr, cst.SimpleString):
        text = expr.evaluated_value
        return isinstance(text, str) and text.startswith("cuda")
    if isinstance(expr, cst.FormattedString):
        return (
            bool(expr.parts)
            and isinstance(expr.parts[0], cst.FormattedStringText)
            and expr.parts[0].value.startswith("cuda")
        )
    if isinstance(expr, cst.Call):
        qualified = ctx.qualified_name(expr.func) or ""
        if qualified == "torch.device":
            first = expr.args[0].value if expr.args else None
            return first is not None and (device_literal(first, ctx) if isinstance(first, cst.SimpleString) else True)
        if qualified == "torch.cuda.current_device":
            return True
    return None


def _is_device_expression(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """Does `expr` name a (non-CPU) device: "cuda", "cuda:0", f"cuda:{rank}", torch.device("cuda"),
    `device`, `args.device`, `self.device`, `x.device`, `local_rank`? A dtype (`torch.float16`) or a
    tensor (`.to(other)`) is not."""
    literal = device_literal(expr, ctx)
    if literal is not None:
        return literal
    if isinstance(expr, cst.Call):
        # `dist_util.dev()` (OpenAI's diffusion code), `get_device()`: a helper that names the device
        return terminal_name(expr.func) in _DEVICE_GETTERS
    if isinstance(expr, cst.Integer):
        return True  # `.to(0)`: CUDA device 0
    name = terminal_name(expr)
    if name is None:
        return False
    if isinstance(expr, cst.Attribute) and (ctx.qualified_name(expr) or "").split(".", 1)[0] in ("torch", "numpy"):
        return (
            False  # `torch.float16`, `torch.long`: a dtype (an imported settings object's `cfg.GLOBAL.DEVICE` is not)
        )
    if depth == 0 and ctx.kind(expr) is Kind.TENSOR:
        return True  # `.to(local_losses)`: to the device (and dtype) of a tensor on the GPU
    if isinstance(expr, cst.Name) and depth < 2:
        found = ctx.scope.lookup(expr.value)
        if found and found[0]:
            values = [b.value for b in found[0] if b.kind == "value"]
            if values and all(isinstance(v, cst.SimpleString) for v in values):
                # `device = "cpu"` ... `if cuda: device = "cuda"`: a move to it may reach the GPU.
                return any(_is_device_expression(v, ctx, depth + 1) for v in values)
            if values and all(isinstance(v, (cst.SimpleString, cst.Call)) for v in values):
                if any(_is_device_expression(v, ctx, depth + 1) for v in values):
                    return True
                # `device = eval_kwargs.get("device", "cuda")`: what the call reads is not known; the
                # name says what it is (below)
                if not any(isinstance(v, cst.Call) and _settings_read(v) for v in values):
                    return False
    lowered = name.lower()
    return any(hint in lowered for hint in _DEVICE_NAME_HINTS) and "dtype" not in lowered and "cpu" not in lowered


def _settings_read(call: cst.Call) -> bool:
    """`opts.get("device", "cuda")`, `kwargs.pop("device")`: a value read from a container of settings."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in ("get", "pop")
        and bool(
            re.search(
                r"(?i)(kwargs|opt|opts|args|config|cfg|conf|params|settings|options)$", terminal_name(func.value) or ""
            )
        )
    )


def moves_to_device(call: cst.Call, ctx) -> cst.BaseExpression | None:
    """The receiver of a host-to-device move (`x.to(device)`, `x.cuda()`) that does not pass
    `non_blocking=True`, else None. `.to(torch.float16)`, `.to("cpu")` and `.to(**kw)` are not moves."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda", "type"):
        return None
    if any(arg.star for arg in call.args):
        return None
    if func.attr.value == "type":
        # The legacy move: `x.type(torch.cuda.FloatTensor)`, or YOLO's `dtype = torch.cuda.FloatTensor
        # if cuda else torch.FloatTensor` then `x.type(dtype)`.
        blocking = next(
            (a.value for a in call.args if a.keyword is not None and a.keyword.value == "non_blocking"), None
        )
        if blocking is not None and not (isinstance(blocking, cst.Name) and blocking.value == "False"):
            return None
        first = call.args[0].value if call.args and call.args[0].keyword is None else None
        return func.value if first is not None and is_cuda_tensor_type(first, ctx) else None
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    positional = [arg.value for arg in call.args if arg.keyword is None]
    blocking = keywords.get("non_blocking")
    if blocking is not None and not (isinstance(blocking, cst.Name) and blocking.value == "False"):
        return None  # non_blocking=True, or a value we cannot read
    if func.attr.value == "cuda":
        if len(positional) > 1:
            return None  # `.cuda(device, non_blocking)` positionally
        return func.value
    if any(isinstance(v, cst.Name) and v.value in ("True", "False") for v in positional):
        return None  # `.to(device, dtype, True)`: non_blocking (or copy) passed positionally
    target = keywords.get("device", positional[0] if positional else None)
    if target is None or not _is_device_expression(target, ctx):
        return None
    return func.value


def is_cuda_tensor_type(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """`torch.cuda.FloatTensor`, "torch.cuda.HalfTensor", or a name bound to one (either branch of
    `torch.cuda.FloatTensor if cuda else torch.FloatTensor`)."""
    if isinstance(expr, cst.SimpleString):
        text = expr.evaluated_value
        return isinstance(text, str) and text.startswith("torch.cuda.")
    if isinstance(expr, cst.IfExp):
        return is_cuda_tensor_type(expr.body, ctx, depth) or is_cuda_tensor_type(expr.orelse, ctx, depth)
    if isinstance(expr, cst.Attribute):
        qualified = ctx.qualified_name(expr) or ""
        return qualified.startswith("torch.cuda.") and qualified.endswith("Tensor")
    if isinstance(expr, cst.Name) and depth < 2:
        found = ctx.scope.lookup(expr.value)
        values = [b.value for b in found[0] if b.kind == "value"] if found else []
        return bool(values) and any(is_cuda_tensor_type(v, ctx, depth + 1) for v in values)
    return False


# --- batch data ---------------------------------------------------------------------------------


def _moves_itself(value: cst.BaseExpression, name: str) -> bool:
    """`x.to(device)`, `x.cuda().float()`, `Variable(x.data.cuda())`: a binding of `x` that is `x`
    moved to the device."""
    if isinstance(value, cst.Call) and terminal_name(value.func) == "Variable" and value.args:
        value = value.args[0].value  # the pre-0.4 wrapper, a no-op today
    moved = False
    while isinstance(value, (cst.Call, cst.Attribute)):
        if isinstance(value, cst.Attribute):
            if value.attr.value != "data":
                break
            value = value.value
            continue
        if not isinstance(value.func, cst.Attribute):
            break
        moved = moved or value.func.attr.value in ("to", "cuda")
        value = value.func.value
    return moved and isinstance(value, cst.Name) and value.value == name


def is_host_batch(expr: cst.BaseExpression, ctx) -> bool:
    """Is `expr` a tensor on the host, such as a batch straight from a DataLoader?

    Tensor inference merges every binding of a name, so in `for x, y in loader: x = x.to(device)` the
    name `x` counts as a device tensor everywhere. Here the bindings that are the name's own move to
    the device are left out, so the receiver of that move is still seen as the host batch it is."""
    while isinstance(expr, cst.Attribute) and expr.attr.value == "data":
        expr = expr.value  # `src.data.cuda()`: the same storage
    origins = _origins(expr, ctx)
    if any(_computed_by_torch(origin, ctx) for origin in origins):
        return False  # made by the script (`torch.tensor(state)`, `torch.triu(...)`), not drawn from a loader
    prepared = _prepared_loaders(ctx)
    if prepared and any(terminal_name(inner) in prepared for origin in origins for inner in unwrap_iterable(origin)):
        return False  # `accelerator.prepare(loader)`: the framework already moved the batch
    kind = ctx.kind(expr)
    if kind is Kind.HOST_TENSOR:
        return True
    if kind is Kind.NOT_TENSOR or not isinstance(expr, cst.Name):
        return False
    found = ctx.scope.lookup(expr.value)
    if not found:
        return False
    bindings, owner = found
    bindings = ctx.tensors.reaching_bindings(bindings, ctx.frame)  # `x` of this loop, not a later `x = ...`
    moves = [b for b in bindings if _moves_itself(b.value, expr.value)]
    others = [b for b in bindings if b not in moves]
    if not others or not moves or expr.value in owner.params:
        return False
    loop = next((b.loop for b in others if b.kind == "loop" and b.loop is not None), None)
    if loop is not None:
        # In `for imgs, caps in loader: imgs = imgs.to(device); imgs = encoder(imgs)`, what the loop
        # body binds after the move cannot reach it: the next iteration binds the loop target first.
        first_move = min(b.order for b in moves)
        others = [b for b in others if b.kind == "loop" or b.loop is None or b.order < first_move]
    # `images = torch.cat(images)` reshapes the batch it was bound to: it is as much on the host.
    kinds = [Kind.HOST_TENSOR if _reshapes_itself(b, expr.value, ctx) else ctx.tensors.binding_kind(b) for b in others]
    return Kind.HOST_TENSOR in kinds and all(k in (Kind.HOST_TENSOR, Kind.NOT_TENSOR) for k in kinds)


def _reshapes_itself(binding, name: str, ctx) -> bool:
    value = binding.value
    if binding.kind != "value" or not isinstance(value, cst.Call) or _is_factory(value, ctx):
        return False
    if not (ctx.qualified_name(value.func) or "").startswith("torch."):
        return False
    first = next((arg.value for arg in value.args if arg.keyword is None and not arg.star), None)
    return isinstance(first, cst.Name) and first.value == name


_FACTORIES = TORCH_FACTORIES | TORCH_CONVERSIONS
# Framework calls that hand a loader back wrapped so that its batches arrive on the device.
_PREPARE_METHODS = frozenset({"prepare", "setup_dataloaders", "prepare_data_loader"})


def _computed_by_torch(expr: cst.BaseExpression, ctx, seen: frozenset = frozenset()) -> bool:
    """A tensor the script computes with a torch function (`torch.tensor(state)`,
    `torch.triu(torch.ones(n, n))`); `torch.utils.data.DataLoader(...)`, the source of batches, is
    not one, nor is a torch function of batch data (`torch.cat(images)`, `Variable(inputs)`)."""
    if not isinstance(expr, cst.Call):
        return False
    qualified = ctx.qualified_name(expr.func) or ""
    if not qualified and len(seen) <= 3 and _made_by_helper_from_torch(expr, ctx, seen):
        return True
    if not qualified.startswith("torch.") and _made_by_helper_from_numbers(expr, ctx):
        return True
    if not qualified.startswith("torch.") or qualified.startswith("torch.utils."):
        return False
    first = next((arg.value for arg in expr.args if arg.keyword is None and not arg.star), None)
    if (
        (qualified[6:] in TORCH_CONVERSIONS or _is_legacy_conversion(qualified, expr))
        and first is not None
        and (_drawn_from_loader(first, ctx) or _step_data(first, ctx) or _handed_in(first, ctx))
    ):
        # `torch.from_numpy(batch["image"])`, `torch.FloatTensor(np.transpose(img_batch, ...))` of
        # what the step loop draws, `torch.FloatTensor(self.state[ind])` of a replay buffer's sample:
        # the step's data, converted
        return False
    if qualified.count(".") == 1 and qualified[6:] in LEGACY_CONSTRUCTORS:
        return True  # `torch.LongTensor(batch_size, n)`, `torch.IntTensor([length] * b)`: made by the script
    if _is_factory(expr, ctx) or first is None or len(seen) > 3:
        return True
    seen = seen | {id(expr)}
    origins = [origin for origin in _origins(first, ctx) if id(origin) not in seen]  # `x = torch.cat(x)`
    return all(_computed_by_torch(origin, ctx, seen) or _is_constant_data(origin) for origin in origins)


def _calls_own_function(call: cst.Call, ctx) -> bool:
    site = ctx.steps.call_site(call)
    return site is not None and bool(ctx.steps.resolve(site))


def _made_by_helper_from_torch(call: cst.Call, ctx, seen: frozenset) -> bool:
    """`self.label2onehot(torch.zeros(n), 2)`: a function of this module applied to a tensor the script
    makes itself gives a tensor the script makes, not batch data (StarGAN's domain masks)."""
    if not _calls_own_function(call, ctx):
        return False
    first = next((arg.value for arg in call.args if arg.keyword is None and not arg.star), None)
    return first is not None and _computed_by_torch(first, ctx, seen | {id(call)})


_BUILTINS = frozenset(dir(builtins))
_DEVICE_GETTERS = frozenset({"dev", "get_device", "default_device", "get_default_device", "current_device"})


def _made_by_helper_from_numbers(call: cst.Call, ctx) -> bool:
    """`coords_grid(n, h // 8, w // 8)` (RAFT): a helper handed only numbers builds the tensor it
    returns itself; it draws no batch (unless it is named for that: `get_batch(i)`)."""
    if not isinstance(call.func, cst.Name) or not call.args:
        return False
    name = call.func.value
    if BATCH_FETCH.match(name) or name in _BUILTINS or ctx.steps.is_loader(call, ctx.scope):
        return False
    if ctx.scope.lookup(name) is not None:
        return False  # a variable (`model(images)`), not a function defined or imported
    return all(not arg.star and ctx.kind(arg.value) is Kind.NOT_TENSOR for arg in call.args)


# Calls that draw random indices: an index made by one samples a minibatch (`self.state[ind]`).
_SAMPLERS = frozenset({"randint", "choice", "sample", "permutation", "randperm", "multinomial"})


def _is_legacy_conversion(qualified: str, call: cst.Call) -> bool:
    positional = [arg for arg in call.args if arg.keyword is None]
    return (
        qualified.count(".") == 1
        and qualified[6:] in LEGACY_CONSTRUCTORS
        and len(positional) == 1
        and not positional[0].star
        and not isinstance(positional[0].value, (cst.Integer, cst.List, cst.Tuple))
    )


def _step_data(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """Is `expr` computed from the data a step draws: an item of the step loop over a generator, a
    file list or a dataset read by index (stepmodel.walks_data), or rows of a buffer picked by a
    random index (a replay buffer's `self.state[ind]`, `ind = np.random.randint(0, size, n)`)? Also
    through names the step's body binds from them (`wav, sr = load_wav(path)`, `wav = wav / peak`)."""
    for node in iter_subtree(expr):
        if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
            index = node.slice[0].slice.value
            if isinstance(index, cst.Name) and _sampled_index(index, ctx):
                return True
        if not isinstance(node, cst.Name):
            continue
        found = ctx.scope.lookup(node.value)
        for binding in found[0] if found else ():
            if binding.loop is None or not ctx.steps.is_step_loop(binding.loop):
                continue
            if binding.kind == "loop" and (
                ctx.steps.walks_data(binding.loop) or ctx.steps.is_loader(binding.value, ctx.scope)
            ):
                return True
            if (
                binding.kind in ("value", "element")
                and ctx.steps.walks_data(binding.loop)
                and (
                    node.value in ctx.steps.drawn_in(binding.loop)
                    or (depth < 3 and _step_data(binding.value, ctx, depth + 1))
                )
            ):
                return True
            if binding.kind in ("value", "element") and _fetches_a_batch(binding.value):
                return True
    return False


def _fetches_a_batch(value: cst.BaseExpression) -> bool:
    """`train_hko_iter.sample(batch_size=batch_size)`, `get_batch(data, i)`: a call in a step loop that
    hands back one batch of the project's own data (no DataLoader: Precipitation-Nowcasting's
    NumPy iterator), by its name or by the batch size it is given."""
    if not isinstance(value, cst.Call):
        return False
    if BATCH_FETCH.match(terminal_name(value.func) or ""):
        return True
    return any(arg.keyword is not None and arg.keyword.value in ("batch_size", "bs") for arg in value.args)


# Reads of a tensor's values on the host: what follows is the model's output, not input data.
_TENSOR_READS = frozenset({"cpu", "numpy", "detach", "tolist", "item", "data", "grad"})
# Names of sizes and counts: `torch.LongTensor(batch_size)` makes a tensor of that size.
_SIZE_NAME = re.compile(r"(?i)(^n$|^n_|^num|size$|_len$|^len|length$|count$|^dim|_dim$|shape$)")


def _handed_in(expr: cst.BaseExpression, ctx, depth: int = 0) -> bool:
    """Is `expr` data a caller hands to this function: a parameter, read through attributes,
    subscripts, NumPy functions and methods (`np.stack(batch.state)`, `obs.reshape(1, -1)`), or a
    name bound from one? In a function that runs per step, `torch.from_numpy(np.stack(batch.state))`
    converts the step's rollout or batch (PyTorch-RL's `update_params(batch)`, pointer_summarizer's
    `get_input_from_batch(batch)`), not data the function makes itself. Data read back from a tensor
    (`x.detach().cpu().numpy()`, then flipped or searched on the host) is a round trip of what the
    model computed, and a size (`torch.LongTensor(batch_size)`) is no data at all."""
    if isinstance(expr, cst.Name) and _SIZE_NAME.search(expr.value):
        return False
    while True:
        if isinstance(expr, cst.Attribute) and expr.attr.value in _TENSOR_READS:
            return False
        if (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and expr.func.attr.value in _TENSOR_READS
        ):
            return False
        if isinstance(expr, (cst.Subscript, cst.Attribute)):
            expr = expr.value
        elif isinstance(expr, cst.Call) and expr.args and (ctx.qualified_name(expr.func) or "").startswith("numpy."):
            first = next((arg.value for arg in expr.args if arg.keyword is None and not arg.star), None)
            if first is None:
                return False
            expr = first  # `np.stack(batch.state)`, `np.array(obs)`
        elif (
            isinstance(expr, cst.Call)
            and isinstance(expr.func, cst.Attribute)
            and ctx.qualified_name(expr.func) is None
        ):
            expr = expr.func.value  # `obs.reshape(1, -1)`, `x.astype(np.float32)`
        else:
            break
    if not isinstance(expr, cst.Name):
        return False
    found = ctx.scope.lookup(expr.value)
    if not found:
        return False
    bindings, owner = found
    if expr.value in owner.params and not bindings:
        return expr.value not in ("self", "cls")
    values = [b.value for b in bindings if b.kind in ("value", "element")]
    if len(values) != len(bindings):
        return False  # also a loop target, a `with` name: not only what the callers handed over
    return depth < 3 and bool(values) and all(_handed_in(value, ctx, depth + 1) for value in values)


def _sampled_index(name: cst.Name, ctx) -> bool:
    found = ctx.scope.lookup(name.value)
    values = [b.value for b in found[0] if b.kind == "value"] if found else []
    return bool(values) and all(
        isinstance(v, cst.Call)
        and terminal_name(v.func) in _SAMPLERS
        and (ctx.qualified_name(v.func) or "").startswith(("numpy.random", "random.", "torch."))
        for v in values
    )


def _drawn_from_loader(expr: cst.BaseExpression, ctx) -> bool:
    """Does `expr` come from a loader: an item of a loop over one, or `next(train_iter)`?"""
    for origin in _origins(expr, ctx):
        iterator = next_of(origin, ctx.scope)
        if iterator is not None:
            origin = iterator
        if ctx.steps.is_loader(origin, ctx.scope):
            return True
    return False


def _is_constant_data(expr: cst.BaseExpression) -> bool:
    """Data written in the script: a literal, a list or tuple of such, a comprehension (of numbers);
    not `[batch_y[:, :n], dec_inp]`, a list of the batch's own tensors."""
    if isinstance(expr, (cst.List, cst.Tuple)):
        # (an element that is a plain name is a value the script holds: `[x0, y0]`)
        return all(
            isinstance(element.value, (cst.Name, cst.UnaryOperation, cst.BinaryOperation))
            or _is_constant_data(element.value)
            for element in expr.elements
        )
    return isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ListComp))


def _is_factory(expr: cst.BaseExpression, ctx) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    qualified = ctx.qualified_name(expr.func) or ""
    return qualified.count(".") == 1 and qualified.startswith("torch.") and qualified[6:] in _FACTORIES


def _origins(expr: cst.BaseExpression, ctx) -> list[cst.BaseExpression]:
    """Where the value of `expr` comes from: the iterables of the loops that bind it and the calls
    that make it, through names, subscripts (`batch[0]`), method chains (`x.float()`) and unpacking.

    Followed up to five names deep. Each binding is expanded once (at the shallowest depth it is
    reached): a name rebound many times in a long function (`hidden_states = ...` thirty times in
    a diffusers block) would otherwise be walked once per path, exponentially often."""
    origins: list[cst.BaseExpression] = []
    expanded: dict[int, int] = {}  # id(binding value) -> the depth it was expanded at

    def walk(expr: cst.BaseExpression, depth: int) -> None:
        expr = _strip_to_source(expr, ctx)
        if not isinstance(expr, cst.Name) or depth > 4:
            origins.append(expr)
            return
        found = ctx.scope.lookup(expr.value)
        if not found:
            origins.append(expr)
            return
        for binding in found[0]:
            if binding.kind not in ("loop", "value", "element") or _moves_itself(binding.value, expr.value):
                continue
            key = id(binding.value)
            if key in expanded and expanded[key] <= depth + 1:
                continue  # expanded already, as deep or deeper than it would be from here
            expanded[key] = depth + 1
            if binding.kind == "loop":
                origins.append(binding.value)
            walk(binding.value, depth + 1)

    walk(expr, 0)
    unique: dict[int, cst.BaseExpression] = {}
    for origin in origins:
        unique.setdefault(id(origin), origin)
    return list(unique.values())


def _strip_to_source(expr: cst.BaseExpression, ctx) -> cst.BaseExpression:
    """`batch[0]`, `x.float()`, `batch.items()` -> the value they are read from."""
    while True:
        if isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not _is_factory(expr, ctx):
            if expr.func.attr.value in ("items", "values"):  # `for k, v in batch.items()`
                expr = expr.func.value
            elif ctx.qualified_name(expr.func) is None and not _calls_own_function(expr, ctx):
                # `x.float()`: x itself (not `self.label2onehot(...)`, a method)
                expr = cast(cst.Attribute, expr.func).value
            else:
                return expr
        else:
            return expr


def _prepared_loaders(ctx) -> frozenset[str]:
    return ctx.memoized("prepared loaders", lambda: _names_prepared(ctx))


def _names_prepared(ctx) -> frozenset[str]:
    """The loaders handed to `accelerator.prepare(...)` and the names what it returns is bound to,
    whole (`train_dl = accelerator.prepare(train_dl)`) or unpacked (`model, opt, train_dl =
    accelerator.prepare(model, opt, train_loader)`)."""
    names: set[str | None] = set()
    for site in ctx.index.calls:
        func = site.call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _PREPARE_METHODS:
            names.update(terminal_name(arg.value) for arg in site.call.args if arg.keyword is None)
            bound = ctx.index.bound_names.get(id(site.call))
            if bound:
                names.add(bound[0].split(".")[-1])
            names.update(
                name
                for name, bindings in site.scope.assignments.items()
                if any(b.kind == "element" and b.value is site.call for b in bindings)
            )
    names.discard(None)
    return frozenset(cast("set[str]", names))


# --- Accelerate's batch placement ---------------------------------------------------------------

_ACCELERATORS = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
_LOADER_CONFIGURATIONS = frozenset(
    {
        "accelerate.utils.DataLoaderConfiguration",
        "accelerate.utils.dataclasses.DataLoaderConfiguration",
    }
)


def accelerate_placement(call: cst.Call, ctx) -> str | None:
    """For a loader handed to Accelerate's `accelerator.prepare(...)`, how Accelerate copies its
    batches to the device: "blocking" (its default, `non_blocking=False`), or "non-blocking" when an
    `Accelerator` of the module is made with `dataloader_config=DataLoaderConfiguration(non_blocking=True)`.
    None for a loader that no Accelerator of the module prepares."""
    accelerators = [c for c in ctx.index.constructor_calls if (ctx.qualified_name(c.func) or "") in _ACCELERATORS]
    if not accelerators or not _prepared_by_accelerator(call, ctx, accelerators):
        return None
    if any(_non_blocking_configuration(accelerator, ctx) for accelerator in accelerators):
        return "non-blocking"
    return "blocking"


def _prepared_by_accelerator(call: cst.Call, ctx, accelerators: list[cst.Call]) -> bool:
    """Is the loader (the call, or the name it is bound to) an argument of `<accelerator>.prepare(...)`,
    where the receiver is bound to `Accelerator(...)` or named like one?"""
    made = {id(a) for a in accelerators}
    bound = ctx.index.bound_names.get(id(call))
    name = bound[0] if bound is not None and "." not in bound[0] else None
    for site in ctx.index.calls:
        func = site.call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "prepare"):
            continue
        receiver = func.value
        found = site.scope.lookup(receiver.value) if isinstance(receiver, cst.Name) else None
        values = [b.value for b in found[0] if b.kind == "value"] if found else []
        if not (any(id(v) in made for v in values) or "accelerator" in (terminal_name(receiver) or "").lower()):
            continue
        for arg in site.call.args:
            if arg.value is call or (name is not None and isinstance(arg.value, cst.Name) and arg.value.value == name):
                return True
    return False


def _non_blocking_configuration(accelerator: cst.Call, ctx) -> bool:
    config = next(
        (a.value for a in accelerator.args if a.keyword is not None and a.keyword.value == "dataloader_config"), None
    )
    if isinstance(config, cst.Name):
        site = ctx.steps.call_site(accelerator)
        found = (site.scope if site is not None else ctx.index.module_scope).lookup(config.value)
        values = [b.value for b in found[0] if b.kind == "value"] if found else []
        config = values[0] if len(values) == 1 else None
    if not isinstance(config, cst.Call) or (ctx.qualified_name(config.func) or "") not in _LOADER_CONFIGURATIONS:
        return False
    return any(
        a.keyword is not None
        and a.keyword.value == "non_blocking"
        and not (isinstance(a.value, cst.Name) and a.value.value == "False")
        for a in config.args
    )
