"""The per-step model: which code runs once per training (or evaluation) step.

A node runs once per step when, walking outwards from it, we reach a step loop, or a function that
is only entered per step, before we reach a periodic guard, a rare branch, or the top of the module.

A loop is a *step loop* when
  1. its own body (outside nested loops) trains: `loss.backward()`, `optimizer.step()`,
     `scaler.step(opt)`, directly or through functions of this module it calls; or
  2. it contains no step loop itself (else it is an epoch loop) and it iterates a loader-like
     iterable (`train_loader`, `enumerate(tqdm(loader))`, `dataloaders[phase]`, a name bound to a
     `DataLoader(...)`), or counts steps (`for step in range(max_steps)`,
     `while iter_num < max_iters`), or is a `while True:` that pulls batches with `next()`.
A function is entered per step when it is a framework step hook (LightningModule `training_step`
and kin, an HF `Trainer` subclass's `training_step`/`compute_loss`), or when one of its call sites
in this module is itself per step. docs/per-step-model.md explains the choices and their limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from .module_index import CallSite, ClassInfo, Frame, FrameKind, FunctionInfo, LoopInfo, ModuleIndex, Scope
from .names import dotted_name, terminal_name
from .patterns import (
    BATCH_FETCH,
    FORWARD_CALLEE,
    LOADER_NAME,
    is_training_call,
    is_step_variable,
    loop_target_names,
    mentions_step_bound,
    unwrap_iterable,
)

# Method names too generic to resolve by name alone (torch and Python objects have them too).
_COMMON_METHODS = frozenset({
    "step", "forward", "update", "train", "eval", "to", "cuda", "cpu", "backward", "zero_grad", "append",
    "extend", "add", "get", "set", "items", "keys", "values", "reset", "run", "load", "save", "close",
    "write", "read", "log", "format", "item", "sum", "mean", "compute", "copy", "state_dict", "apply",
    "__init__", "__call__", "parameters", "named_parameters",
})

# Methods a framework calls once per batch. Lightning calls the batch hooks on both LightningModules
# and Callbacks; HF's Trainer calls its own step methods and its TrainerCallbacks' step events.
_LIGHTNING_BATCH_HOOKS = frozenset({
    "on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad",
})
FRAMEWORK_HOOKS = {
    "LightningModule": frozenset({"training_step", "validation_step", "test_step", "predict_step"}) | _LIGHTNING_BATCH_HOOKS,
    "LightningCallback": _LIGHTNING_BATCH_HOOKS,
    "Trainer": frozenset({"training_step", "compute_loss", "prediction_step"}),
    "TrainerCallback": frozenset({"on_step_begin", "on_substep_end", "on_step_end"}),
}
_LIGHTNING_ROOTS = frozenset({"pytorch_lightning", "lightning", "pl", "L", "lightning_pytorch"})


@dataclass(frozen=True, repr=False)  # holds a syntax node: the generated repr would print a subtree
class StepReason:
    """Why a node runs once per step: the loop or hook that makes it so, and the call chain."""

    kind: str  # "loop" or "hook"
    node: cst.CSTNode  # the step loop (For/While) or the hook (FunctionDef)
    hook: str | None = None  # "LightningModule.training_step" and kin
    via: tuple[str, ...] = ()  # functions entered on the way, outermost first


class StepModel:
    def __init__(self, index: ModuleIndex, extra_hooks: frozenset[str] = frozenset()) -> None:
        self.index = index
        self.extra_hooks = extra_hooks
        self._functions_by_name: dict[str, list[FunctionInfo]] = {}
        for function in index.functions:
            if function.class_info is None:
                self._functions_by_name.setdefault(function.name, []).append(function)
        self._by_node: dict[int, FunctionInfo] = {id(f.node): f for f in index.functions}
        self._methods_named: dict[str, list[FunctionInfo]] = {}
        for function in index.functions:
            if function.class_info is not None:
                self._methods_named.setdefault(function.name, []).append(function)
        self._step_loop: dict[int, bool] = {}
        self._trains: dict[int, bool] = {}
        self._has_step_loop: dict[int, bool] = {}
        self._function_reason: dict[int, StepReason | None] = {}
        self._frame_reason: dict[int, StepReason | None] = {}
        self._resolved: dict[int, list[FunctionInfo]] = {}
        for site in index.calls:
            for function in self.resolve(site):
                function.call_sites.append(site)
        # Settle every loop once, in source order, so that answers never depend on which rule asked first.
        for loop in index.loops:
            self.is_step_loop(loop)

    # --- calls ---------------------------------------------------------------------------------

    def function_info(self, node: cst.FunctionDef) -> FunctionInfo | None:
        return self._by_node.get(id(node))

    def resolve(self, site: CallSite) -> list[FunctionInfo]:
        """The functions of this module a call may enter (empty when it enters none we know)."""
        key = id(site.call)
        cached = self._resolved.get(key)
        if cached is None:
            cached = self._resolve(site)
            self._resolved[key] = cached
        return cached

    def _resolve(self, site: CallSite) -> list[FunctionInfo]:
        func = site.call.func
        if isinstance(func, cst.Name):
            if func.value in self.index.classes:
                return []  # constructing an object runs __init__ once, not per step
            local = self._functions_by_name.get(func.value)
            if local:
                return local
            cls = self._class_of_instance(func.value, site)
            return self._methods(cls, ("forward", "__call__")) if cls else []
        if isinstance(func, cst.Attribute):
            receiver = func.value
            method = func.attr.value
            if isinstance(receiver, cst.Name) and receiver.value in {"self", "cls"}:
                cls = site.frame.enclosing_class()
                return self._methods(cls, (method,)) if cls else []
            if isinstance(receiver, cst.Name):
                cls = self._class_of_instance(receiver.value, site)
                if cls is not None:
                    return self._methods(cls, (method,))
            # `self.agent.play_step(...)`, `callback.on_train_batch_end(...)`: an object we cannot
            # type, but only one class of this module has a method of that name.
            if method not in _COMMON_METHODS:
                owners = self._methods_named.get(method, [])
                if len(owners) == 1:
                    return owners
        return []

    def _class_of_instance(self, name: str, site: CallSite) -> ClassInfo | None:
        """`model = Net().to(device)` makes `model` an instance of the module's class Net."""
        found = site.scope.lookup(name)
        if found is None:
            return None
        for binding in found[0]:
            value = binding.value if binding.kind == "value" else None
            while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                value = value.func.value  # look through `.to(device)`, `.cuda()`, `.train()`
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
                cls = self.index.classes.get(value.func.value)
                if cls is not None:
                    return cls
        return None

    def _methods(self, cls: ClassInfo, names: tuple[str, ...], seen: frozenset = frozenset()) -> list[FunctionInfo]:
        if id(cls) in seen:
            return []
        for name in names:
            if name in cls.methods:
                return [cls.methods[name]]
        for base in cls.bases:
            base_name = terminal_name(base)
            parent = self.index.classes.get(base_name) if base_name else None
            if parent is not None:
                found = self._methods(parent, names, seen | {id(cls)})
                if found:
                    return found
        return []

    # --- loops and functions -------------------------------------------------------------------

    def is_step_loop(self, loop: LoopInfo) -> bool:
        key = id(loop)
        if key in self._step_loop:
            return self._step_loop[key]
        self._step_loop[key] = False  # a recursive question is answered "no" until we know
        answer = self._decide_step_loop(loop)
        self._step_loop[key] = answer
        return answer

    def _decide_step_loop(self, loop: LoopInfo) -> bool:
        if loop.trains_directly or any(self.trains(f) for site in loop.direct_calls for f in self.resolve(site)):
            return True
        if self.has_inner_step_loop(loop):
            return False  # an epoch loop (or an outer loop over splits, models, ...)
        if self.iterates_loader(loop) or self.fetches_batch(loop):
            return True
        # A loop that only *looks* like it counts steps (`while num_iters < n`, `for b in
        # range(nbatches)`) must also do a step's work: train, run a forward pass, or fetch a batch.
        return self.counts_steps(loop) and self.does_step_work(loop.all_calls)

    def fetches_batch(self, loop: LoopInfo) -> bool:
        """`for i in range(0, n, bptt): data, targets = get_batch(source, i)`: one batch per iteration."""
        for site in loop.direct_calls:
            name = terminal_name(site.call.func) or ""
            if name == "next":
                if site.call.args and self.is_loader(site.call.args[0].value, site.scope):
                    return True
            elif BATCH_FETCH.match(name):
                return True
        return False

    def does_step_work(self, calls: list[CallSite], seen: frozenset = frozenset()) -> bool:
        for site in calls:
            if is_training_call(site.call, self.index.imports):
                return True
            name = terminal_name(site.call.func) or ""
            if name == "next":
                # `next(it)` fetches a batch only when `it` comes from a loader: `it = iter(train_loader)`.
                if site.call.args and self.is_loader(site.call.args[0].value, site.scope):
                    return True
            elif BATCH_FETCH.match(name) or (FORWARD_CALLEE.search(name) and name not in self.index.classes):
                return True
            for function in self.resolve(site):
                if id(function) not in seen and self.does_step_work(function.all_calls, seen | {id(function)}):
                    return True
        return False

    def has_inner_step_loop(self, loop: LoopInfo) -> bool:
        if any(self.is_step_loop(child) or self.has_inner_step_loop(child) for child in loop.children):
            return True
        return any(self.has_step_loop(f) for site in loop.all_calls for f in self.resolve(site))

    def trains(self, function: FunctionInfo) -> bool:
        """Does calling this function train (outside any loop of its own)?"""
        key = id(function)
        if key not in self._trains:
            self._trains[key] = False
            self._trains[key] = function.trains_directly or any(
                self.trains(f) for site in function.direct_calls for f in self.resolve(site)
            )
        return self._trains[key]

    def has_step_loop(self, function: FunctionInfo) -> bool:
        key = id(function)
        if key not in self._has_step_loop:
            self._has_step_loop[key] = False
            self._has_step_loop[key] = any(self.is_step_loop(loop) for loop in function.loops) or any(
                self.has_step_loop(f) for site in function.all_calls for f in self.resolve(site)
            )
        return self._has_step_loop[key]

    def iterates_loader(self, loop: LoopInfo) -> bool:
        if not isinstance(loop.node, cst.For):
            return False
        return any(self.is_loader(expr, loop.scope) for expr in unwrap_iterable(loop.node.iter))

    def is_loader(self, expr: cst.BaseExpression, scope: Scope | None = None, depth: int = 0) -> bool:
        """Does `expr` yield batches: a DataLoader, a loader-named value, or something wrapping one
        (`iter(loader)`, `tqdm(enumerate(loader))`, `skip_first_batches(loader, n)`, `a if t else b`),
        also through the names it is bound to (`active_dataloader = train_dataloader`)?"""
        if depth > 4:
            return False
        if isinstance(expr, cst.Subscript):
            return self.is_loader(expr.value, scope, depth)
        if isinstance(expr, cst.IfExp):
            return self.is_loader(expr.body, scope, depth + 1) or self.is_loader(expr.orelse, scope, depth + 1)
        if isinstance(expr, cst.Call):
            qualified = self.index.imports.qualify(expr.func) or ""
            name = terminal_name(expr.func) or ""
            if qualified.endswith("DataLoader") or name.endswith("DataLoader") or LOADER_NAME.search(name):
                return True
            # A call wrapping a loader (not `len`/`range`, which turn it into a count).
            return any(
                self.is_loader(inner, scope, depth + 1) for inner in unwrap_iterable(expr)[1:]
            )
        name = terminal_name(expr)
        if name is None:
            return False
        if LOADER_NAME.search(name):
            return True
        if isinstance(expr, cst.Name) and scope is not None:
            found = scope.lookup(name)
            if found is not None:
                return any(
                    b.kind == "value" and self.is_loader(b.value, scope, depth + 1) for b in found[0]
                )
        return False

    def counts_steps(self, loop: LoopInfo) -> bool:
        node = loop.node
        if isinstance(node, cst.While):
            test = node.test
            if isinstance(test, cst.Name) and test.value == "True":
                return True  # `while True:` ... `break`: a step loop if it does a step's work
            return mentions_step_bound(test)
        targets = loop_target_names(node)
        iterable = node.iter
        while isinstance(iterable, cst.Call) and terminal_name(iterable.func) in {"enumerate", "tqdm", "trange"}:
            if terminal_name(iterable.func) == "trange":
                break
            args = [arg.value for arg in iterable.args if arg.keyword is None]
            if not args:
                break
            iterable = args[0]
        is_range = isinstance(iterable, cst.Call) and terminal_name(iterable.func) in {"range", "trange"}
        if not is_range:
            return False
        if any(is_step_variable(name) for name in targets):
            return True
        bounds = iterable.args
        return any(
            mentions_step_bound(arg.value) or self._mentions_loader_length(arg.value, loop) for arg in bounds
        )

    def _mentions_loader_length(self, expr: cst.BaseExpression, loop: LoopInfo) -> bool:
        if isinstance(expr, cst.Call) and terminal_name(expr.func) == "len" and expr.args:
            return self.is_loader(expr.args[0].value, loop.scope)
        return False

    # --- loaders -------------------------------------------------------------------------------

    def loops_over(self, value: cst.BaseExpression) -> list[LoopInfo]:
        """The loops that iterate what `value` (say a `DataLoader(...)` call) evaluates to: through the
        name it is bound to (`train_loader = DataLoader(...)`), `self.<name>`, or a parameter of a
        function whose call sites pass that name (`train(model, train_loader)`)."""
        bound = self.index.bound_names.get(id(value))
        if bound is None:
            return []
        name, scope = bound
        found = []
        for loop in self.index.loops:
            if not isinstance(loop.node, cst.For):
                continue
            for expr in unwrap_iterable(loop.node.iter):
                if self._refers_to(expr, name, scope, loop.scope, depth=0):
                    found.append(loop)
                    break
        return found

    def _refers_to(self, expr: cst.BaseExpression, name: str, scope: Scope, where: Scope, depth: int) -> bool:
        if name.startswith("self."):
            return (
                isinstance(expr, cst.Attribute)
                and isinstance(expr.value, cst.Name)
                and expr.value.value == "self"
                and expr.attr.value == name[5:]
            )
        if not isinstance(expr, cst.Name):
            return False
        found = where.lookup(expr.value)
        if found is None:
            return False
        bindings, owner = found
        if expr.value == name and owner is scope:
            return True
        if depth < 3 and any(
            # `pbar = tqdm(train_loader)`, `it = iter(loader)`: a name bound to something wrapping ours
            b.kind == "value" and any(self._refers_to(inner, name, scope, owner, depth + 1) for inner in unwrap_iterable(b.value))
            for b in bindings
        ):
            return True
        if depth < 3 and not bindings and expr.value in owner.params and owner.function is not None:
            # a parameter: does any call site pass our name for it?
            function = self.function_info(owner.function)
            if function is None:
                return False
            for site in function.call_sites[:8]:
                argument = argument_for(function, expr.value, site.call)
                if argument is not None and self._refers_to(argument, name, scope, site.scope, depth + 1):
                    return True
        return False

    def in_epoch_loop(self, loop: LoopInfo) -> bool:
        """Is this loop run again and again: inside another loop, or in a function called from one?"""
        return self._inside_loop(loop.frame.parent, frozenset())

    def _inside_loop(self, frame: Frame | None, seen: frozenset) -> bool:
        while frame is not None:
            if frame.kind is FrameKind.LOOP:
                return True
            if frame.kind is FrameKind.FUNCTION:
                function = frame.function
                if function is None or id(function) in seen:
                    return False
                return any(self._inside_loop(site.frame, seen | {id(function)}) for site in function.call_sites)
            frame = frame.parent
        return False

    # --- gradients ------------------------------------------------------------------------------

    def under_no_grad(self, frame: Frame, seen: frozenset = frozenset()) -> bool:
        """Does code in `frame` run with autograd off: inside `with torch.no_grad():` /
        `torch.inference_mode()` / `torch.set_grad_enabled(False)`, in a function decorated with one,
        or in a function all of whose call sites in this module are?"""
        current: Frame | None = frame
        while current is not None:
            if current.kind is FrameKind.WITH and any(
                self._disables_grad(item.item) for item in current.node.items  # type: ignore[union-attr]
            ):
                return True
            if current.kind is FrameKind.FUNCTION:
                function = current.function
                if function is None:
                    return False
                if any(self._disables_grad(d.decorator) for d in function.node.decorators):
                    return True
                if id(function) in seen or not function.call_sites:
                    return False
                return all(self.under_no_grad(site.frame, seen | {id(function)}) for site in function.call_sites)
            current = current.parent
        return False

    def _disables_grad(self, expr: cst.BaseExpression) -> bool:
        call = expr if isinstance(expr, cst.Call) else None
        qualified = self.index.imports.qualify(call.func if call else expr) or ""
        if qualified in ("torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"):
            return True
        if qualified == "torch.set_grad_enabled" and call is not None and call.args:
            value = call.args[0].value
            return isinstance(value, cst.Name) and value.value == "False"
        return False

    # --- framework hooks -----------------------------------------------------------------------

    def hook_name(self, function: FunctionInfo) -> str | None:
        cls = function.class_info
        if cls is None:
            return None
        if function.name in self.extra_hooks:
            return f"{cls.name}.{function.name}"
        framework = self.framework_of(cls)
        if framework is not None and function.name in FRAMEWORK_HOOKS[framework]:
            return f"{framework}.{function.name}"
        return None

    def framework_of(self, cls: ClassInfo, seen: frozenset = frozenset()) -> str | None:
        """The key of FRAMEWORK_HOOKS for the framework class this class derives from, else None."""
        if id(cls) in seen:
            return None
        for base in cls.bases:
            # Unresolved names count by their text: scripts use `pl.LightningModule` without the import
            # in view (star imports, or an import inside `if __name__ == "__main__":`).
            qualified = self.index.imports.qualify(base) or dotted_name(base) or ""
            root = qualified.split(".")[0]
            if qualified.endswith("LightningModule"):
                return "LightningModule"
            if qualified.endswith(".Callback") and root in _LIGHTNING_ROOTS:
                return "LightningCallback"
            if qualified.endswith("TrainerCallback") and root in {"transformers", "trl"}:
                return "TrainerCallback"
            if qualified.endswith("Trainer") and root in {"transformers", "trl"}:
                return "Trainer"
            base_name = terminal_name(base)
            parent = self.index.classes.get(base_name) if base_name else None
            if parent is not None:
                found = self.framework_of(parent, seen | {id(cls)})
                if found:
                    return found
        return None

    def is_torch_module(self, cls: ClassInfo, seen: frozenset = frozenset()) -> bool:
        """Does the class derive from `torch.nn.Module` (directly or through this module's classes)?"""
        if id(cls) in seen:
            return False
        for base in cls.bases:
            qualified = self.index.imports.qualify(base) or ""
            if qualified in ("torch.nn.Module", "torch.nn.modules.module.Module"):
                return True
            parent = self.index.classes.get(terminal_name(base) or "")
            if parent is not None and self.is_torch_module(parent, seen | {id(cls)}):
                return True
        return False

    def has_framework_classes(self) -> bool:
        return any(self.framework_of(cls) for cls in self.index.classes.values())

    # --- the question the rules ask ------------------------------------------------------------

    def reason(self, frame: Frame) -> StepReason | None:
        """Why code in `frame` runs once per step, or None when it does not."""
        key = id(frame)
        if key in self._frame_reason:
            return self._frame_reason[key]
        self._frame_reason[key] = None
        answer = self._reason(frame)
        self._frame_reason[key] = answer
        return answer

    def _reason(self, frame: Frame) -> StepReason | None:
        kind = frame.kind
        if kind in (FrameKind.PERIODIC, FrameKind.RARE, FrameKind.DEFERRED, FrameKind.CLASS, FrameKind.MODULE):
            return None
        if kind is FrameKind.LOOP and self.is_step_loop(frame.loop):  # type: ignore[arg-type]
            return StepReason("loop", frame.node)  # type: ignore[arg-type]
        if kind is FrameKind.FUNCTION:
            return self.function_reason(frame.function)  # type: ignore[arg-type]
        return self.reason(frame.parent) if frame.parent is not None else None

    def function_reason(self, function: FunctionInfo) -> StepReason | None:
        key = id(function)
        if key in self._function_reason:
            return self._function_reason[key]
        self._function_reason[key] = None
        answer = None
        hook = self.hook_name(function)
        if hook is not None:
            answer = StepReason("hook", function.node, hook=hook)
        else:
            for site in function.call_sites:
                outer = self.reason(site.frame)
                if outer is not None:
                    answer = StepReason(outer.kind, outer.node, outer.hook, (*outer.via, function.qualname))
                    break
        self._function_reason[key] = answer
        return answer


def argument_for(function: FunctionInfo, name: str, call: cst.Call) -> cst.BaseExpression | None:
    """The expression `call` passes for `function`'s parameter `name`, if it can be told."""
    params = function.node.params
    positional = [p.name.value for p in (*params.posonly_params, *params.params)]
    if function.class_info is not None and positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return arg.value
        elif index < len(positional) and positional[index] == name:
            return arg.value
    return None
