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

import builtins
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import libcst as cst

from loopaudit.analysis.cross_module import ProjectFacts
from loopaudit.analysis.distributed import helper_collective, library_collective, sets_sampler_epoch, wraps_ddp
from loopaudit.analysis.module_index import (
    Binding,
    CallSite,
    ClassInfo,
    Frame,
    FrameKind,
    FunctionInfo,
    LoopInfo,
    ModuleIndex,
    Scope,
    argument_at,
    argument_for,
    loop_within,
)
from loopaudit.analysis.names import dotted_name, stored_name, string_key, terminal_name
from loopaudit.analysis.options import UNREAD, OptionTest, constant_flag, default_of, literal, option_test
from loopaudit.analysis.patterns import (
    BATCH_FETCH,
    EVALUATION_FUNCTION,
    LOADER_NAME,
    calls_a_model,
    is_step_variable,
    is_training_call,
    loop_target_names,
    mentions_step_bound,
    next_of,
    runs_a_model,
    runs_once,
    unwrap_iterable,
)
from loopaudit.analysis.walk import iter_subtree

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from loopaudit.analysis.names import ImportTable

# Method names too generic to resolve by name alone (torch and Python objects have them too).
_COMMON_METHODS = frozenset(
    {
        "step",
        "forward",
        "update",
        "train",
        "eval",
        "to",
        "cuda",
        "cpu",
        "backward",
        "zero_grad",
        "append",
        "extend",
        "add",
        "get",
        "set",
        "items",
        "keys",
        "values",
        "reset",
        "run",
        "load",
        "save",
        "close",
        "write",
        "read",
        "log",
        "format",
        "item",
        "sum",
        "mean",
        "compute",
        "copy",
        "state_dict",
        "apply",
        "__init__",
        "__call__",
        "parameters",
        "named_parameters",
    }
)

# Calls that return the same object (or the same model, moved): `Net().to(device)` is still a Net.
_MOVES = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "double", "requires_grad_"})
# Wrappers whose calls run the model they wrap: `DistributedDataParallel(model)(x)` is `model(x)`.
_MODEL_WRAPPERS = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.compile",
    }
)
_MODEL_WRAPPER_NAMES = frozenset({"DistributedDataParallel", "DataParallel", "DDP"})

# Of those, names that projects' own classes define often, called with arguments a builtin's method
# of that name would not take: an agent's or a meter's `update(value, n)`, a metric's `compute(x)`.
_NAMESAKE_METHODS = frozenset({"update", "compute", "log", "forward", "run", "reset"})
# Arguments the containers and tensors' methods of those names take: dict.update(other, **kw) or
# Module.forward(x...); more than one positional argument is a project's own method.
_BUILTIN_ARITY = {"update": 1, "compute": 0, "log": 0, "forward": 99, "run": 0, "reset": 0}
# Libraries whose calls never return an object of the project's classes.
_KNOWN_LIBRARIES = frozenset(
    {
        "torch",
        "numpy",
        "np",
        "collections",
        "math",
        "os",
        "sys",
        "time",
        "json",
        "logging",
        "re",
        "random",
        "itertools",
        "functools",
        "pathlib",
        "tqdm",
        "pandas",
        "PIL",
        "cv2",
        "torchvision",
        "wandb",
        "tensorboardX",
        "argparse",
        "copy",
        "datetime",
        "threading",
        "multiprocessing",
        "queue",
        "scipy",
        "sklearn",
        "transformers",
        "accelerate",
        "gym",
        "gymnasium",
        "matplotlib",
        "csv",
        "pickle",
        "diffusers",
        "timm",
        "peft",
    }
)


def _fits_no_builtin(method: str, call: cst.Call) -> bool:
    positional = sum(1 for arg in call.args if arg.keyword is None and not arg.star)
    return positional > _BUILTIN_ARITY.get(method, 99)


def _listed(iterable: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The elements of the list or tuple literals a loop walks: `[a, b]`, and the literals given to
    `zip(...)` or `enumerate(...)`."""
    if isinstance(iterable, (cst.List, cst.Tuple)):
        return [e.value for e in iterable.elements if not isinstance(e, cst.StarredElement)]
    if isinstance(iterable, cst.Call) and terminal_name(iterable.func) in ("zip", "enumerate"):
        return [e for arg in iterable.args if not arg.star for e in _listed(arg.value)]
    return []


def _is_partial(factory: cst.Call | None, imports: ImportTable) -> bool:
    """`functools.partial(f, ...)`: the call a called name was bound to, when it binds a function."""
    return factory is not None and bool(factory.args) and imports.qualify(factory.func) == "functools.partial"


def _steps_optimizer(call: cst.Call) -> bool:
    """`optimizer.step()`, `scaler.step(opt)`, `self.GAN.D_opt.step()`: a `.step(...)` call (is_training_call
    tells an optimizer's from a scheduler's)."""
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == "step"


# Calls that keep a callable for later rather than call it: a container's, a hook's registration.
_KEEPS_CALLABLES = frozenset(
    {
        "append",
        "extend",
        "insert",
        "add",
        "setdefault",
        "update",
        "register",
        "register_hook",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "partial",
        "setattr",
        "getattr",
        "hasattr",
        "isinstance",
        "callable",
        "print",
        "id",
        "type",
        "signal",
    }
)


def _fits(function: FunctionInfo, call: cst.Call) -> bool:
    if any(arg.star for arg in call.args):
        return function.signature.accepts(-1, ())
    return function.signature.accepts(
        sum(1 for arg in call.args if arg.keyword is None),
        tuple(arg.keyword.value for arg in call.args if arg.keyword is not None),
    )


def _is_builtin(name: str) -> bool:
    return name in _BUILTINS


_BUILTINS = frozenset(dir(builtins))

_IGNITE_ENGINES = frozenset({"Engine", "DeterministicEngine"})


def _per_iteration_event(expr: cst.BaseExpression) -> bool:
    """`Events.ITERATION_COMPLETED` (every iteration), not `Events.ITERATION_COMPLETED(every=50)`."""
    return isinstance(expr, cst.Attribute) and expr.attr.value in (
        "ITERATION_STARTED",
        "ITERATION_COMPLETED",
        "GET_BATCH_STARTED",
        "GET_BATCH_COMPLETED",
    )


# Methods a framework calls once per batch. Lightning calls the batch hooks on both LightningModules
# and Callbacks; HF's Trainer calls its own step methods and its TrainerCallbacks' step events.
_LIGHTNING_BATCH_HOOKS = frozenset(
    {
        "on_train_batch_start",
        "on_train_batch_end",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_test_batch_start",
        "on_test_batch_end",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
    }
)
FRAMEWORK_HOOKS = {
    "LightningModule": frozenset({"training_step", "validation_step", "test_step", "predict_step"})
    | _LIGHTNING_BATCH_HOOKS,
    "LightningCallback": _LIGHTNING_BATCH_HOOKS,
    "Trainer": frozenset({"training_step", "compute_loss", "prediction_step"}),
    "TrainerCallback": frozenset({"on_step_begin", "on_substep_end", "on_step_end"}),
}
_LIGHTNING_ROOTS = frozenset({"pytorch_lightning", "lightning", "pl", "L", "lightning_pytorch"})


# Values written out in the code (a literal, a display, a comprehension): no project class's instance.
_LITERAL_VALUES = (
    cst.BaseString,
    cst.Integer,
    cst.Float,
    cst.List,
    cst.Dict,
    cst.Set,
    cst.Tuple,
    cst.ListComp,
    cst.DictComp,
    cst.SetComp,
    cst.GeneratorExp,
)


@dataclass(frozen=True, repr=False)  # holds a syntax node: the generated repr would print a subtree
class StepReason:
    """Why a node runs once per step: the loop or hook that makes it so, and the call chain."""

    kind: str  # "loop" or "hook"
    node: cst.CSTNode  # the step loop (For/While) or the hook (FunctionDef)
    hook: str | None = None  # "LightningModule.training_step" and kin
    via: tuple[str, ...] = ()  # functions entered on the way, outermost first
    # kind "external": the function is entered per step from another module of the project;
    # `origin` says from where ("step loop `for x in loader` (main.py:120) → `engine.step()` (main.py:124)").
    origin: str | None = None


class StepModel:
    def __init__(
        self, index: ModuleIndex, extra_hooks: frozenset[str] = frozenset(), facts: ProjectFacts | None = None
    ) -> None:
        self.index = index
        self.extra_hooks = extra_hooks
        # What the rest of the scanned project says about this module's calls into it and out of it
        # (project.py); None when the file is analysed alone.
        self.facts = facts
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
        self._helpers: dict[int, str | None] = {}  # communication_helper, by function
        self._distributed: tuple[bool, bool] | None = None  # this module's own (wraps_ddp, sets_sampler_epoch)
        self._has_step_loop: dict[int, bool] = {}
        self._function_reason: dict[int, StepReason | None] = {}
        self._frame_reason: dict[int, StepReason | None] = {}
        self._resolved: dict[int, list[FunctionInfo]] = {}
        self._external: dict[int, str | None] = {}
        self._sites_by_call: dict[int, CallSite] | None = None
        self._nested: dict[int, list[FunctionInfo]] | None = None  # id(function) -> functions defined in it
        self._step_work: dict[int, bool] = {}
        self._guarded_calls: dict[int, list[CallSite]] | None = None  # id(periodic frame) -> the calls in its body
        self._by_name: dict[int, bool] = {}  # id(call) -> whether it resolves by the method's name
        self._options: dict[tuple[int, int], tuple[str, ...]] = {}  # option_params, by function and depth
        self._device_placed: set[int] | None = None  # device_placed_loops, once asked
        self._drawn: dict[int, set[str]] = {}  # drawn_in, per loop
        self._handed: dict[int, list[FunctionInfo]] = {}  # _handed_functions, per call
        # The command-line defaults this module and the project declare (argument_values.py keeps
        # them here: once per analysis, as the project's facts change between rounds).
        self.argparse_defaults: dict[str, object] | None = None
        self._grad_statement: bool | None = None  # _grad_off_by_statement, once asked
        self._entered: dict[int, str] = self._entered_from_elsewhere()
        # qualname -> whether every call of it from other modules runs with autograd off
        self._grad_off_elsewhere: dict[str, bool] = dict(facts.grad_off_callers) if facts is not None else {}
        self._engine_hooks: dict[int, str] = self._find_engine_hooks()
        for site in index.calls:
            for function in self.resolve(site):
                function.call_sites.append(site)
        # Callbacks, once every call is resolved: `def run(step_fn): ... step_fn(batch)` called as
        # `run(train_step)` enters `train_step` wherever `run` calls its parameter.
        self._passed: dict[int, list[FunctionInfo]] = {}  # id(call of a parameter) -> the functions passed
        for site in index.calls:
            passed = self._passed_functions(site)
            if passed:
                self._passed[id(site.call)] = passed
                self._resolved[id(site.call)] = [*self._resolved[id(site.call)], *passed]
                for function in passed:
                    function.call_sites.append(site)
        # What a parameter holds is known only now that every call site is (`_parameter_class`):
        # decide again whether a method call on it goes by the method's name.
        self._by_name.clear()
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
            if cls:
                return self._methods(cls, ("forward", "__call__"))
            factory = self._factory_call(func, site.scope)
            if _is_partial(factory, self.index.imports):
                # `backwards = partial(loss_backwards, fp16)` ... `backwards(loss, opt)`: loss_backwards
                bound = cast(cst.Call, factory).args[0].value
                return self.local_functions(bound, site.scope) if isinstance(bound, cst.Name) else []
            if factory is not None and isinstance(factory.func, cst.Name):
                # `train = make_train_step(model, opt)` ... `train(x, y)`: the function it returns.
                return [
                    f
                    for maker in self._functions_by_name.get(factory.func.value, ())
                    for f in self.returned_functions(maker)
                ]
            return self._handed_functions(site)
        if isinstance(func, cst.Attribute):
            receiver = func.value
            method = func.attr.value
            if isinstance(receiver, cst.Name) and receiver.value in {"self", "cls"}:
                cls = site.frame.enclosing_class()
                found = self._methods(cls, (method,)) if cls else []
                if cls is not None:
                    # `self.train_iter(...)` in a base class runs a subclass's override on its instances,
                    # or the subclasses' only definitions (XLM's `self.evaluate_mt(...)` in `Evaluator`)
                    found = found + self._overrides(cls, method)
                if not found:
                    # `self.encoder(x)` with `self.encoder = Encoder(...)`, a class of this module.
                    owner = self.class_of(func, site.scope)
                    local_class = self.index.classes.get(owner[8:]) if owner and owner.startswith("<local>.") else None
                    if local_class is not None:
                        found = self._methods(local_class, ("forward", "__call__"))
                return found
            if isinstance(receiver, cst.Name):
                cls = self._class_of_instance(receiver.value, site)
                if cls is not None:
                    return self._methods(cls, (method,))
            # `self.agent.play_step(...)`, `callback.on_train_batch_end(...)`: an object we cannot
            # type: the methods of this module's classes with that name that the call fits.
            # Within the module, only a method that one class alone defines: following every namesake
            # here would make their calls into other modules per-step edges, which carry CUDA (the
            # project's by-name edges do not: project.py).
            if self.by_name(site):
                owners = [f for f in self._methods_named.get(method, []) if _fits(f, site.call)]
                return owners if len(owners) == 1 else []
        return self._handed_functions(site)

    def calls_partial(self, site: CallSite) -> bool:
        """Is the called name bound to `functools.partial(f, ...)`? Its arguments then fill `f`'s
        parameters after the ones the partial binds."""
        return _is_partial(self._factory_call(site.call.func, site.scope), self.index.imports)

    def _handed_callables(self, site: CallSite) -> list[tuple[cst.Name | cst.Attribute, str]]:
        """The functions and methods a call to code we cannot read hands over uncalled, to call
        them itself: `retry_call(model.train, tries=3)` (stylegan2-pytorch's step),
        `checkpoint(self.block, x)`, `map(fn, items)`. Each as (the reference, the method or function
        name). Not a constructor's (`Thread(target=worker)` runs it once, elsewhere), nor a
        container's (`callbacks.append(fn)` only keeps it)."""
        func = site.call.func
        name = terminal_name(func) or ""
        if looks_like_class(name) or name in _KEEPS_CALLABLES or self.call_site_enters_own(site):
            return []
        handed: list[tuple[cst.Name | cst.Attribute, str]] = []
        for arg in site.call.args:
            value = arg.value
            if arg.star or (arg.keyword is not None and arg.keyword.value in ("target", "callback", "hook")):
                continue
            if isinstance(value, cst.Name) and self.local_functions(value, site.scope):
                handed.append((value, value.value))
            elif isinstance(value, cst.Attribute) and isinstance(value.value, (cst.Name, cst.Attribute)):
                handed.append((value, value.attr.value))
        return handed

    def call_site_enters_own(self, site: CallSite) -> bool:
        """Does the call name a function of this module (which then says what it does with its arguments)?"""
        func = site.call.func
        return isinstance(func, cst.Name) and func.value in self._functions_by_name

    def _handed_functions(self, site: CallSite) -> list[FunctionInfo]:
        """This module's functions and methods among the callables a call hands over (`_handed_callables`).
        Asked for every call site whose autograd mode or arguments are wanted: answered once per call."""
        cached = self._handed.get(id(site.call))
        if cached is None:
            cached = self._handed[id(site.call)] = self._find_handed_functions(site)
        return cached

    def _find_handed_functions(self, site: CallSite) -> list[FunctionInfo]:
        found: list[FunctionInfo] = []
        for value, method in self._handed_callables(site):
            if isinstance(value, cst.Name):
                candidates = self.local_functions(value, site.scope)
            elif isinstance(value.value, cst.Name) and value.value.value in ("self", "cls"):
                cls = site.frame.enclosing_class()
                candidates = self._methods(cls, (method,)) if cls is not None else []
            elif isinstance(value.value, cst.Name):
                cls = self._class_of_instance(value.value.value, site)
                candidates = self._methods(cls, (method,)) if cls is not None else []
            else:
                candidates = []
            found.extend(f for f in candidates if f not in found)
        return found

    def called_parameter(self, site: CallSite) -> tuple[FunctionInfo, str] | None:
        """`fn(...)` where `fn` is a parameter of the function making the call (and never rebound
        there): that function and the parameter. A callback its callers pass in
        (`def sample2dir(n, sample_fn): ... sample_fn(n)`)."""
        func = site.call.func
        if not isinstance(func, cst.Name):
            return None
        found = site.scope.lookup(func.value)
        if found is None or found[0] or found[1].function is None:
            return None
        function = self._by_node.get(id(found[1].function))
        return (function, func.value) if function is not None else None

    def _passed_functions(self, site: CallSite) -> list[FunctionInfo]:
        """The functions of this module that the callers of a function pass for the parameter `site`
        calls (`run(train_step)` for `def run(step_fn): ... step_fn(b)`)."""
        called = self.called_parameter(site)
        if called is None:
            return []
        function, param = called
        found: list[FunctionInfo] = []
        for caller in function.call_sites:
            if self.hands_over(caller, function):
                continue  # `trainer.eval(evaluate, ...)` hands `evaluate` over: its arguments are not evaluate's
            arg = argument_for(function, param, caller.call)
            if isinstance(arg, cst.Name):
                found.extend(f for f in self.local_functions(arg, caller.scope) if f not in found)
        return found

    def local_functions(self, expr: cst.BaseExpression, scope: Scope) -> list[FunctionInfo]:
        """The functions of this module (top-level or nested) a bare name passed as a value names:
        `sample_fn` in `sample2dir(..., sample_fn)`. None when the name is a variable there."""
        if not isinstance(expr, cst.Name) or scope.lookup(expr.value) is not None:
            return []
        return list(self._functions_by_name.get(expr.value, ()))

    def _runs_passed_step(self, loop: LoopInfo) -> bool:
        """Does every iteration call a callback that does a step's work (and holds no step loop of
        its own): `for n in amortize(total, size): samples = sample_fn(n)`, whose callers pass a
        `sample_fn` that runs the model? The callers may be here or in other modules (ProjectFacts)."""
        for site in loop.direct_calls:
            if not _on_every_iteration(site.frame, loop.frame):
                continue
            called = self.called_parameter(site)
            if called is None:
                continue
            if any(
                self.function_does_step_work(f) and not self.has_step_loop(f)
                for f in self._passed.get(id(site.call), ())
            ):
                return True
            if self.facts is not None and (called[0].qualname, called[1]) in self.facts.passed_step_work:
                return True
        return False

    def option_params(self, function: FunctionInfo, depth: int = 0) -> tuple[str, ...]:
        """The parameters whose value selects an arm of code (options.py): those the function's own
        `if`s compare with literals (`if skip_type == 'logSNR':`); for an `__init__`, those it stores
        in a setting a method of the class compares (`self.schedule = schedule`); and those it hands
        on to such a parameter of a function or class of this module (`InterestEvolving(...,
        gru_type=gru_type)`). Other modules' callers report what they pass for these."""
        key = (id(function), depth)
        if key in self._options:
            return self._options[key]
        self._options[key] = ()
        found = {test.param for test in _option_tests(function)}
        cls = function.class_info
        if function.name == "__init__" and cls is not None:
            settings = {test.param[5:] for method in cls.methods.values() for test in _option_tests(method)}
            for attribute in settings & cls.attributes.keys():
                found.update(
                    b.value.value
                    for b in cls.attributes[attribute]
                    if b.kind == "value" and isinstance(b.value, cst.Name) and b.value.value in function.scope.params
                )
        if depth < 3:
            for site in function.all_calls:
                func = site.call.func
                made = self.index.classes.get(func.value) if isinstance(func, cst.Name) else None
                init = made.methods.get("__init__") if made is not None else None
                for target in [init] if init is not None else self.resolve(site):
                    for param in self.option_params(target, depth + 1):
                        passed = argument_for(target, param, site.call)
                        if isinstance(passed, cst.Name) and passed.value in function.scope.params:
                            found.add(passed.value)
        answer = tuple(sorted(name for name in found if not name.startswith("self.")))
        self._options[key] = answer
        return answer

    def _constructions(self, cls: ClassInfo) -> list[CallSite]:
        """The calls of this module that construct `cls` by its name."""
        return [
            site
            for site in self.index.calls
            if isinstance(site.call.func, cst.Name)
            and site.call.func.value == cls.name
            and self.index.classes.get(cls.name) is cls
            and site.scope.lookup(cls.name) is None
        ]

    def by_name(self, site: CallSite) -> bool:
        """Is this method call one to resolve by the method's name? Its receiver's class is unknown, yet
        nothing says it is no object of the project: not a module, a container, a string or number, nor
        what a library call returns. Names that the containers, tensors, modules and optimizers of
        torch define (`step`, `train`, `append`) are left out unless the call's arguments say otherwise
        (`update` of a dict takes one mapping; a meter's or an agent's `update` takes more)."""
        func = site.call.func
        if not isinstance(func, cst.Attribute):
            return False
        method = func.attr.value
        if method in _COMMON_METHODS and not (method in _NAMESAKE_METHODS and _fits_no_builtin(method, site.call)):
            return False
        key = id(site.call)
        if key not in self._by_name:
            self._by_name[key] = not self._foreign(func.value, site.scope)
        return self._by_name[key]

    def _foreign(self, receiver: cst.BaseExpression, scope: Scope) -> bool:
        """Is the receiver evidently not an instance of a project class?"""
        while isinstance(receiver, cst.Subscript):
            receiver = receiver.value  # `meters["loss"].update(...)`: an element of what it holds
            if isinstance(receiver, (cst.Name, cst.Attribute)):
                return False
        if isinstance(receiver, _LITERAL_VALUES):
            return True
        if isinstance(receiver, cst.Call):
            return self._foreign_value(receiver)
        if self._library_class(self.class_of(receiver, scope)):
            return True  # `pipe = Lumina2Pipeline.from_pretrained(...)` ... `pipe.encode_prompt(...)`
        if isinstance(receiver, cst.Name):
            found = scope.lookup(receiver.value)
            if found is None:
                return receiver.value in _BUILTINS
            bindings, _ = found
        elif (
            isinstance(receiver, cst.Attribute)
            and isinstance(receiver.value, cst.Name)
            and receiver.value.value == "self"
        ):
            cls = scope.owner_class
            bindings = cls.attributes.get(receiver.attr.value, []) if cls is not None else []
        else:
            return self.index.imports.qualify(receiver) is not None  # `np.random`, `torch.cuda`
        values = [b.value for b in bindings if b.kind == "value"]
        return bool(values) and len(values) == len(bindings) and all(self._foreign_value(v) for v in values)

    def _library_class(self, cls: str | None) -> bool:
        """Is this class (as class_of names it) a known library's, not the project's?"""
        if cls is None or cls.startswith(("<local>.", "@")):
            return False
        root = cls.split(".", 1)[0]
        roots = self.facts.roots if self.facts is not None else frozenset()
        return root in _KNOWN_LIBRARIES and root not in roots

    def _foreign_value(self, value: cst.BaseExpression) -> bool:
        value = _unmoved(value)
        if isinstance(value, _LITERAL_VALUES):
            return True
        if not isinstance(value, cst.Call):
            return False
        if isinstance(value.func, cst.Name) and value.func.value in _BUILTINS:
            return True
        qualified = self.index.imports.qualify(value.func)
        if qualified is None:
            return False
        roots = self.facts.roots if self.facts is not None else frozenset()
        root = qualified.split(".", 1)[0]
        # `collections.defaultdict(...)`, `torch.optim.Adam(...)`: a library's object. What a call into
        # the project (or an unknown library's registry: `hydra.utils.instantiate`) returns may be ours.
        return root in _KNOWN_LIBRARIES and root not in roots

    def _overrides(self, cls: ClassInfo, method: str) -> list[FunctionInfo]:
        """The `method`s of this module's subclasses of `cls` that override it."""
        found = []
        for other in self.index.classes.values():
            if other is not cls and method in other.methods and self._inherits(other, cls):
                found.append(other.methods[method])
        return found

    def _inherits(self, cls: ClassInfo, ancestor: ClassInfo, depth: int = 0) -> bool:
        for base in cls.bases:
            parent = self.index.classes.get(terminal_name(base) or "")
            if parent is ancestor or (
                parent is not None and parent is not cls and depth < 8 and self._inherits(parent, ancestor, depth + 1)
            ):
                return True
        return False

    def call_site(self, call: cst.Call) -> CallSite | None:
        """The recorded site of a call node (where it sits, in which scope)."""
        if self._sites_by_call is None:
            self._sites_by_call = {id(site.call): site for site in self.index.calls}
        return self._sites_by_call.get(id(call))

    def returned_functions(self, maker: FunctionInfo) -> list[FunctionInfo]:
        """The functions defined inside `maker` that it returns (`def step(...): ...; return step`)."""
        names = {value.value for value in maker.returns if isinstance(value, cst.Name)}
        if not names:
            return []
        if self._nested is None:
            self._nested = {}
            for function in self.index.functions:
                outer = function.frame.parent.enclosing_function() if function.frame.parent is not None else None
                if outer is not None:
                    self._nested.setdefault(id(outer), []).append(function)
        return [f for f in self._nested.get(id(maker), ()) if f.name in names]

    def _factory_call(self, func: cst.BaseExpression, scope: Scope) -> cst.Call | None:
        """The call whose result a called name holds: `train = train_fns.GAN_training_function(...)`."""
        if not isinstance(func, cst.Name):
            return None
        found = scope.lookup(func.value)
        if found is None:
            return None
        calls = [b.value for b in found[0] if b.kind == "value" and isinstance(b.value, cst.Call)]
        if not calls or len(calls) != len(found[0]):
            return None
        # `train = make_step(...) if cfg else make_dummy()`: the first factory stands for them all.
        return next((c for c in calls if not looks_like_class(terminal_name(c.func) or "")), None)

    def external_target(self, site: CallSite) -> str | None:
        """What a call that enters no function of this module calls, as a qualified name through
        this module's imports: `engine.train_one_epoch`, `.utils.reduce` (relative), or
        `models.Net.forward` for `model(x)` / `self.model(x)` when `model = Net(...)` and `Net` is
        imported. None when it cannot be told (or it enters this module)."""
        key = id(site.call)
        if key not in self._external:
            self._external[key] = None  # a recursive question (through class_of) is answered "unknown"
            self._external[key] = None if self._enters_own(site) else self._external_target(site)
        return self._external[key]

    def hands_over(self, site: CallSite, function: FunctionInfo) -> bool:
        """Does the call hand `function` over uncalled rather than call it (`trainer.eval(evaluate)`)?"""
        return function in self._handed_functions(site)

    def _enters_own(self, site: CallSite) -> bool:
        """Does the call enter a function of this module itself, not only hand one over (`trainer.train(
        get_loss)` hands `get_loss` to another module's method, which is the call's own target)?"""
        resolved = self.resolve(site)
        return bool(resolved) and any(f not in self._handed_functions(site) for f in resolved)

    def external_targets(self, site: CallSite) -> list[str]:
        """external_target, and for a call through a registry (`trainer_dict[cfg.TRAINER](...)`), each
        of its members: qualified through this module's imports where the dict is this module's,
        "<dict's qualified name>[]" where it is imported (project.py reads its members there)."""
        func = site.call.func
        if isinstance(func, cst.Subscript):
            name = dotted_name(func.value)
            if name is not None and "." not in name and self.registry(name):
                return [m for m in self.registry(name) if not m.startswith("<local>.")]
            qualified = self.index.imports.qualify(func.value)
            if qualified is not None:
                return [qualified + "[]"]
            return []
        target = self.external_target(site)
        found = [target] if target is not None else []
        if not self._enters_own(site):
            # `retry_call(model.train)` where `model = Trainer(...)` of another module: its `train`
            for value, method in self._handed_callables(site):
                if isinstance(value, cst.Attribute) and not (
                    isinstance(value.value, cst.Name) and value.value.value in ("self", "cls")
                ):
                    owner = self.class_of(value.value, site.scope)
                    if (
                        owner is not None
                        and not owner.startswith("<local>.")
                        and owner.split(".", 1)[0] not in _KNOWN_LIBRARIES
                    ):
                        found.append(f"{owner}.{method}")
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self":
            cls = site.frame.enclosing_class()
            if cls is not None and self._methods(cls, (func.attr.value,)):
                # `self.train_iter(data)` in a base class: the overrides of subclasses in other modules
                found.append(f"^{cls.name}.{func.attr.value}")
        return found

    def registry(self, name: str) -> tuple[str, ...]:
        """The members of a module-level dict literal bound to `name`, when every value is a name of a
        class or function (imported: qualified; this module's own: "<local>.X")."""
        found = self.index.module_scope.lookup(name)
        if (
            not found
            or len(found[0]) != 1
            or found[0][0].kind != "value"
            or not isinstance(found[0][0].value, cst.Dict)
        ):
            return ()
        members = []
        for element in found[0][0].value.elements:
            if not isinstance(element, cst.DictElement):
                return ()
            value = element.value
            qualified = self.index.imports.qualify(value)
            if qualified is not None:
                members.append(qualified)
            elif isinstance(value, cst.Name) and (
                value.value in self.index.classes or value.value in self._functions_by_name
            ):
                members.append(f"<local>.{value.value}")
            else:
                return ()
        return tuple(members)

    def _external_target(self, site: CallSite) -> str | None:
        func = site.call.func
        qualified = self.index.imports.qualify(func)
        if qualified is not None:
            return qualified
        factory = self._factory_call(func, site.scope)
        if factory is not None:
            made_by = self.index.imports.qualify(factory.func)
            if made_by is not None:
                return made_by + "()"  # the function another module's factory returns
        if isinstance(func, cst.Attribute):
            owner = self.class_of(func.value, site.scope)
            if owner is not None:
                return f"{owner}.{func.attr.value}"
        owner = self.class_of(func, site.scope)
        if owner is not None:
            return f"{owner}.forward"
        if (
            isinstance(func, cst.Name)
            and self.index.imports.star_modules
            and not _is_builtin(func.value)
            and func.value not in self.index.classes
        ):
            # `from layers import *` ... `transformation_from_parameters(...)`: a function of one of
            # those modules (the project index finds which defines it).
            found = site.scope.lookup(func.value)
            if found is None:
                return "&" + ",".join(self.index.imports.star_modules) + ":" + func.value
        if self.by_name(site):
            # `model.parse_batch(batch)`, `self.agent.update(batch, step)` on an object we cannot
            # type: the project's methods of that name that the call fits (project.py decides).
            return f"*.{cast(cst.Attribute, func).attr.value}"  # (by_name: a method call)
        return None

    def class_of(self, expr: cst.BaseExpression, scope: Scope, depth: int = 0) -> str | None:
        """The class `expr` is an instance of, when it is imported or passed in by another module
        (a qualified name, or "@file:Class"), or this module's own class ("<local>.Class"):
        `model` after `model = models.Net(...).to(device)`, through `DistributedDataParallel(model)`,
        a factory of this module (`model = load_model(hp)` returning `Tacotron2(hp).cuda()`), or a
        parameter its callers fill with one; `self.model` after `self.model = Net(...)` in any method."""
        if depth > 4:
            return None
        if isinstance(expr, cst.Name):
            found = scope.lookup(expr.value)
            if found is None:
                return None
            bindings, owner = found
            # `pipe = pipe.to(device)` keeps what the name held: the parameter's class, if it is one
            bindings = [b for b in bindings if not _moves_itself(b, expr.value)]
            if not bindings and expr.value in owner.params:
                return self._parameter_class(expr.value, owner, depth)
        elif isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
            cls = scope.owner_class
            bindings = cls.attributes.get(expr.attr.value, []) if cls is not None else []
        else:
            return None
        fallback = None
        for binding in bindings:
            if binding.kind == "element":
                found_class = self._class_of_element(binding, depth)
            elif binding.kind == "value":
                found_class = self._class_of_value(binding.value, binding.scope, depth)
            else:
                continue
            if found_class is not None:
                if found_class.split(".", 1)[0] not in _KNOWN_LIBRARIES:
                    return found_class
                fallback = fallback or found_class
        # `self.Prediction = nn.Linear(...)` or `Attention(...)` by configuration: the project's class
        # is the one whose code can run per step; the library's only where nothing else is bound.
        return fallback

    def _class_of_element(self, binding: Binding, depth: int) -> str | None:
        """`model, criterion = set_model(opt)` where this module's `set_model` returns
        `model, criterion` after `criterion = SupConLoss(...)`: that element's class."""
        value = binding.value
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        for function in self._functions_by_name.get(value.func.value, ()):
            for returned in function.returns:
                if isinstance(returned, cst.Tuple) and binding.position < len(returned.elements):
                    element = returned.elements[binding.position].value
                    found = self._class_of_value(element, function.scope, depth + 1)
                    if found is not None:
                        return found
        return None

    def _class_of_value(self, value: cst.BaseExpression, scope: Scope, depth: int) -> str | None:
        if depth > 4:  # as in class_of: a factory may return its own call (`return build(n - 1)`)
            return None
        value = _unmoved(value)  # look through `.to(device)`, `.cuda()`, `.train()`
        if isinstance(value, (cst.Name, cst.Attribute)) and not isinstance(value, cst.Call):
            return self.class_of(value, scope, depth + 1)  # `model_without_ddp = model`
        if not isinstance(value, cst.Call):
            return None
        qualified = self.index.imports.qualify(value.func)
        positional = [arg.value for arg in value.args if arg.keyword is None and not arg.star]
        if qualified in _MODEL_WRAPPERS or (terminal_name(value.func) or "") in _MODEL_WRAPPER_NAMES:
            return self._class_of_value(positional[0], scope, depth + 1) if positional else None
        site = self.call_site(value)
        target = self.external_target(site) if site is not None and self.facts is not None else None
        if target is not None:
            made = next(
                (cls for called, cls in cast(ProjectFacts, self.facts).return_classes if called == target), None
            )
            if made is not None:
                return made  # `model = self.exp.get_model()`: what another module's function returns
        name = terminal_name(value.func) or ""
        if (
            name in _ALTERNATE_CONSTRUCTORS
            and isinstance(value.func, cst.Attribute)
            and isinstance(value.func.value, cst.Name)
        ):
            # `Ner.from_pretrained(path)`, `Model.load_from_checkpoint(ckpt)`: an instance of that
            # class (a library's too: `self.tokenizer = CLIPTokenizer.from_pretrained(...)` says the
            # attribute holds no class of the project, though another module's `tokenizer` does).
            owner = value.func.value.value
            if owner in self.index.classes and scope.lookup(owner) is None:
                return f"<local>.{owner}"
            return self.index.imports.qualify(value.func.value)
        if looks_like_class(name):
            if qualified is not None:
                return qualified
            if isinstance(value.func, cst.Name) and name in self.index.classes:
                return f"<local>.{name}"
            return None
        if isinstance(value.func, cst.Name):
            # A factory of this module: what its `return` statements give back.
            for function in self._functions_by_name.get(name, ()):
                for returned in function.returns:
                    found = self._class_of_value(returned, function.scope, depth + 1)
                    if found is not None:
                        return found
        return None

    def class_made_by(self, value: cst.BaseExpression, scope: Scope) -> str | None:
        """The class a value constructs (`Generator(...)`, `Generator(...).to(device)`, `DDP(Net())`), or
        holds when it names one (`generator` after `generator = Generator(...)`, `self.model`)."""
        if isinstance(value, cst.Call):
            return self._class_of_value(value, scope, 1)
        return self.class_of(value, scope, 1)

    def returned_class(self, function: FunctionInfo) -> str | None:
        """The class of the object `function` returns (`def get_model(self): ...; return self.model`
        after `self.model = YOLOX(backbone, head)`), when one is known."""
        for returned in function.returns:
            found = self._class_of_value(returned, function.scope, 1)
            if found is not None:
                return found
        return None

    def _parameter_class(self, name: str, scope: Scope, depth: int) -> str | None:
        function = self.function_info(scope.function) if scope.function is not None else None
        if function is None:
            return None
        for site in function.call_sites[:8]:
            argument = argument_for(function, name, site.call)
            if argument is not None:
                found = self.class_of(argument, site.scope, depth + 1)
                if found is not None:
                    return found
        if self.facts is not None:
            for qualname, param, cls in self.facts.argument_classes:
                if param == name and qualname == function.qualname:
                    return cls
        return None

    def _known_elsewhere(self, kind: str, sites: list[CallSite]) -> bool:
        """Does one of these calls enter a function of another module that trains / has a step loop /
        does a step's work (kind: a field of ProjectFacts)?"""
        if self.facts is None:
            return False
        known = getattr(self.facts, kind)
        if not known:
            return False
        return any(target in known for site in sites for target in self.external_targets(site))

    def _entered_from_elsewhere(self) -> dict[int, str]:
        """id(function) -> where it is entered per step from, for the functions other modules call per step."""
        if self.facts is None or not self.facts.entered:
            return {}
        entered: dict[int, str] = {}
        module_functions = {f.name: f for f in self.index.functions if f.class_info is None}
        for qualname, origin in self.facts.entered:
            cls_name, _, method = qualname.rpartition(".")
            if not cls_name:
                targets = [module_functions[method]] if method in module_functions else []
            elif cls_name in module_functions and cls_name not in self.index.classes:
                targets = [f for f in self.returned_functions(module_functions[cls_name]) if f.name == method]
            else:
                cls = self.index.classes.get(cls_name)
                names = (method, "__call__") if method == "forward" else (method,)
                targets = self._methods(cls, names) if cls is not None else []
            for function in targets:
                entered.setdefault(id(function), origin)
        return entered

    def _find_engine_hooks(self) -> dict[int, str]:
        """Functions an engine calls once per batch: pytorch-ignite's `Engine(process_function)`, and
        handlers of its per-iteration events (`@trainer.on(Events.ITERATION_COMPLETED)`,
        `add_event_handler(Events.ITERATION_STARTED, fn)`; `Events.ITERATION_COMPLETED(every=N)` is periodic)."""
        if not self.index.imports.imports_module("ignite"):
            return {}
        hooks: dict[int, str] = {}

        def mark(expr: cst.BaseExpression | None, hook: str) -> None:
            if isinstance(expr, cst.Name):
                for function in self._functions_by_name.get(expr.value, ()):
                    hooks.setdefault(id(function), hook)

        call: cst.BaseExpression  # a call site's call, then a decorator
        for site in self.index.calls:
            call = site.call
            positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
            qualified = self.index.imports.qualify(call.func) or ""
            if qualified.startswith("ignite.") and qualified.rsplit(".", 1)[-1] in _IGNITE_ENGINES and positional:
                mark(positional[0], "ignite.Engine process function")
            elif terminal_name(call.func) == "add_event_handler" and len(positional) >= 2:
                if _per_iteration_event(positional[0]):
                    mark(positional[1], "ignite per-iteration event handler")
        for function in self.index.functions:
            for decorator in function.node.decorators:
                call = decorator.decorator
                if (
                    isinstance(call, cst.Call)
                    and terminal_name(call.func) == "on"
                    and call.args
                    and _per_iteration_event(call.args[0].value)
                ):
                    hooks.setdefault(id(function), "ignite per-iteration event handler")
        return hooks

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
        # Through a factory of the module (`model, criterion = set_model()`), as class_of reads it.
        known = self.class_of(cst.Name(name), site.scope) if any(b.kind == "element" for b in found[0]) else None
        if known is not None and known.startswith("<local>."):
            return self.index.classes.get(known[len("<local>.") :])
        return None

    def _methods(
        self, cls: ClassInfo, names: tuple[str, ...], seen: frozenset[int] = frozenset()
    ) -> list[FunctionInfo]:
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
        if runs_once(loop.node) or _counts_to_one(loop):
            return False  # its body runs once (it always leaves the loop, or counts to one), not once per step
        if self._accumulates_gradients(loop):
            return False  # micro-steps of one step: the optimizer steps once, after the loop
        if loop.trains_directly or any(self.trains(f) for site in loop.direct_calls for f in self.resolve(site)):
            return True
        if self._known_elsewhere("trains", loop.direct_calls):
            return True  # `for batch in loader_like: engine.train_step(batch)`, train_step in another file
        if self.has_inner_step_loop(loop):
            return False  # an epoch loop (or an outer loop over splits, models, ...)
        if self.iterates_loader(loop) or self.fetches_batch(loop):
            return True
        if self._runs_passed_step(loop):
            return True  # `for n in sizes: sample_fn(n)`, a callback that runs the model
        if self.walks_data(loop) and self.does_step_work(loop.all_calls):
            return True  # an inference or evaluation loop over samples, files or a batch generator
        if self._evaluates_each_item(loop):
            return True  # `for state in val_mem: qs.append(dqn.evaluate_q(state))`
        if self._runs_model_on_items(loop):
            return True  # `for n, batch in enumerate(generator): ... with torch.no_grad(): model(x)`
        if self._evaluation_walk(loop):
            return True  # `def evaluate(model, dataset): for u in users: ... model.predict(u, seq)`
        # A loop that only *looks* like it counts steps (`while num_iters < n`, `for b in
        # range(nbatches)`) must also do a step's work: train, run a forward pass, or fetch a batch.
        # Not inside a model's own methods: there a counted loop unrolls the computation (an
        # autoregressive decoder's `while True:`), which runs within one step.
        if (
            loop.function is not None
            and loop.function.class_info is not None
            and self.is_torch_module(loop.function.class_info)
        ):
            return False
        return self.counts_steps(loop) and self.does_step_work(loop.all_calls)

    def _accumulates_gradients(self, loop: LoopInfo) -> bool:
        """A gradient-accumulation loop: its body runs backward passes (`for i in range(accum):
        loss.backward()`) and never steps an optimizer, which the code around it steps once after
        it (nanoGPT's micro-steps, stylegan2-pytorch's `gradient_accumulate_contexts`). Each of its
        iterations is part of one step, so the step is the code around it."""
        body = [site for site in loop.all_calls if is_training_call(site.call, self.index.imports)]
        helpers = [f for site in loop.all_calls for f in self.resolve(site)]
        if not body and not any(f.trains_directly for f in helpers):
            return False
        if any(_steps_optimizer(site.call) for site in body) or any(
            _steps_optimizer(site.call) for f in helpers for site in f.all_calls
        ):
            return False
        around = (
            loop.parent_loop.direct_calls
            if loop.parent_loop is not None
            else (loop.function.direct_calls if loop.function is not None else [])
        )
        return any(_steps_optimizer(site.call) and is_training_call(site.call, self.index.imports) for site in around)

    def _evaluates_each_item(self, loop: LoopInfo) -> bool:
        """Does every iteration of a loop over items hand its item to a function of the project that
        runs a forward pass with autograd off (an `evaluate`/`predict` method)? Each iteration is then
        an evaluation step, whatever the loop walks. A call resolved by the method's name alone counts
        only when one method of the module has that name."""
        if not isinstance(loop.node, cst.For) or indexed_walk(loop) is not None:
            return False
        if _walks_written_out(loop):
            return False  # `for psi in [0.5, 0.7, 1.0]`: a few settings, not a walk over data
        items = loop_target_names(loop.node)
        for site in loop.direct_calls:
            if not _on_every_iteration(site.frame, loop.frame):
                continue
            passed = {n.value for arg in site.call.args for n in iter_subtree(arg.value) if isinstance(n, cst.Name)}
            targets = self.resolve(site) if passed & items else []
            if self.by_name(site) and len(targets) != 1:
                continue
            for function in targets:
                if (
                    self._evaluates(function)
                    and self.function_does_step_work(function)
                    and not self._repeats_work(function)
                ):
                    return True
        return False

    def _runs_model_on_items(self, loop: LoopInfo) -> bool:
        """Does every iteration run a forward pass with autograd off on data drawn from the loop's item,
        whatever the items come from (audioset's `for n, batch_data_dict in enumerate(generator):`,
        with a `generator` two modules away from its DataLoader)? Each iteration is then an
        evaluation step. Not a count (`for i in range(n)`: counts_steps decides), nor a few settings
        written out, nor a loop inside a model (which unrolls one forward)."""
        if not isinstance(loop.node, cst.For) or (counted_range(loop) is not None and indexed_walk(loop) is None):
            return False
        if _walks_written_out(loop) or self._walks_model_output(loop):
            return False
        if (
            loop.function is not None
            and loop.function.class_info is not None
            and self.is_torch_module(loop.function.class_info)
        ):
            return False
        drawn = self.drawn_in(loop)
        for site in loop.direct_calls:
            name = terminal_name(site.call.func) or ""
            if not (calls_a_model(name) and name not in self.index.classes) or not _on_every_iteration(
                site.frame, loop.frame
            ):
                continue
            # The model's input is the item's data: `for scale in scales: model(resize(x, scale_factor=scale))`
            # and `for alpha in alphas: generator(x, lerp(a, b, alpha))` vary a setting over one input.
            if _data_of(site.call.func) & loop_target_names(loop.node):
                continue  # `for tokenizer, text_encoder in zip(...)`: a walk over models, not over data
            first = next((arg.value for arg in site.call.args if arg.keyword is None and not arg.star), None)
            if first is not None and _data_of(first) & drawn and self.under_no_grad(site.frame):
                return True
        return False

    def _evaluation_walk(self, loop: LoopInfo) -> bool:
        """A loop of an evaluation function (`evaluate`, `validate`, `test`: EVALUATION_FUNCTION) over
        items that are no count (users, sequences, episodes' states), which runs the model on every
        iteration (`model(x)`, `model.predict(u, seq)`): each iteration is an evaluation step, with
        or without autograd (SASRec's `evaluate`). Only the function's outermost loops; not a walk over
        a few settings written out, nor over the parts of one forward's output."""
        function = loop.function
        if not isinstance(loop.node, cst.For) or function is None or not EVALUATION_FUNCTION.match(function.name):
            return False
        if loop.parent_loop is not None:
            return False  # the function's own walk, not a loop inside one (over crops, over a batch's parts)
        if counted_range(loop) is not None or _walks_written_out(loop) or self._walks_model_output(loop):
            return False
        if function.class_info is not None and self.is_torch_module(function.class_info):
            return False
        return any(
            runs_a_model(site.call)
            and (terminal_name(site.call.func) or "") not in self.index.classes
            and _on_every_iteration(site.frame, loop.frame)
            for site in loop.direct_calls
        )

    def _walks_model_output(self, loop: LoopInfo) -> bool:
        """`output = model(input)` ... `for o in output: loss += criterion(o, target)`: the parts of one
        forward's output (a stacked hourglass's stages, a multi-scale head), which one step walks."""
        iterable = loop.node.iter if isinstance(loop.node, cst.For) else None
        if not isinstance(iterable, cst.Name):
            return False
        found = loop.scope.lookup(iterable.value)
        return found is not None and any(
            b.kind == "value"
            and isinstance(b.value, cst.Call)
            and calls_a_model(terminal_name(b.value.func) or "")
            and terminal_name(b.value.func) not in self.index.classes
            for b in found[0]
        )

    def _repeats_work(self, function: FunctionInfo) -> bool:
        """Does the function (or one it calls) loop over a step's work itself: a benchmark's
        `for _ in range(NUM_WARMUP_ROUNDS): model(**inp)`? Then one call is many steps, not one."""
        callees = [f for site in function.all_calls for f in self.resolve(site) if f is not function]
        return any(self.does_step_work(loop.all_calls) for f in (function, *callees) for loop in f.loops)

    def _evaluates(self, function: FunctionInfo) -> bool:
        """Is autograd off in `function`: a no-grad decorator, or its body inside `with torch.no_grad():`."""
        if any(self.disables_grad(d.decorator) for d in function.node.decorators):
            return True
        statements = function.node.body.body if isinstance(function.node.body, cst.IndentedBlock) else ()
        return any(
            isinstance(statement, cst.With) and any(self.disables_grad(item.item) for item in statement.items)
            for statement in statements
        )

    def fetches_batch(self, loop: LoopInfo) -> bool:
        """`for i in range(0, n, bptt): data, targets = get_batch(source, i)`: one batch per iteration."""
        for site in loop.direct_calls:
            iterator = next_of(site.call, site.scope)
            if iterator is not None:
                if self.is_loader(iterator, site.scope):
                    return True
            elif BATCH_FETCH.match(terminal_name(site.call.func) or ""):
                return True
        return False

    def does_step_work(self, calls: list[CallSite], seen: frozenset[int] = frozenset()) -> bool:
        for site in calls:
            if is_training_call(site.call, self.index.imports):
                return True
            name = terminal_name(site.call.func) or ""
            iterator = next_of(site.call, site.scope)
            if iterator is not None:
                # `next(it)` fetches a batch only when `it` comes from a loader: `it = iter(train_loader)`.
                if self.is_loader(iterator, site.scope):
                    return True
            elif BATCH_FETCH.match(name) or (calls_a_model(name) and name not in self.index.classes):
                return True
            for function in self.resolve(site):
                if id(function) not in seen and self.function_does_step_work(function, seen):
                    return True
            called = self.called_parameter(site) if self.facts is not None else None
            if (
                called is not None
                and (called[0].qualname, called[1]) in cast(ProjectFacts, self.facts).passed_step_work
            ):
                return True  # a callback that callers in other modules pass: one that runs a model
        return self._known_elsewhere("step_work", calls)

    def function_does_step_work(self, function: FunctionInfo, seen: frozenset[int] = frozenset()) -> bool:
        key = id(function)
        if key not in self._step_work:
            self._step_work[key] = False
            self._step_work[key] = self.does_step_work(function.all_calls, seen | {key})
        return self._step_work[key]

    def has_inner_step_loop(self, loop: LoopInfo) -> bool:
        # Only what runs on most iterations counts: an evaluation loop run every N steps
        # (`if step % eval_every == 0: evaluate()`) does not turn the training loop into an epoch loop.
        children = [child for child in loop.children if _on_every_iteration(child.frame.parent, loop.frame)]
        if any(self.is_step_loop(child) or self.has_inner_step_loop(child) for child in children):
            return True
        calls = [site for site in loop.all_calls if _on_every_iteration(site.frame, loop.frame)]
        if any(self.has_step_loop(f) for site in calls for f in self.resolve(site)):
            return True
        return self._known_elsewhere("has_step_loop", calls)

    def trains(self, function: FunctionInfo) -> bool:
        """Does calling this function train (outside any loop of its own)?"""
        key = id(function)
        if key not in self._trains:
            self._trains[key] = False
            self._trains[key] = (
                function.trains_directly
                or any(self.trains(f) for site in function.direct_calls for f in self.resolve(site))
                or self._known_elsewhere("trains", function.direct_calls)
            )
        return self._trains[key]

    def has_step_loop(self, function: FunctionInfo) -> bool:
        key = id(function)
        if key not in self._has_step_loop:
            self._has_step_loop[key] = False
            self._has_step_loop[key] = (
                any(self.is_step_loop(loop) for loop in function.loops)
                or any(self.has_step_loop(f) for site in function.all_calls for f in self.resolve(site))
                or self._known_elsewhere("has_step_loop", function.all_calls)
            )
        return self._has_step_loop[key]

    def loop_trains(self, loop: LoopInfo) -> bool:
        """Does one iteration of the loop train: backward / optimizer.step here, or in a function it
        calls (of this module or another)?"""
        return (
            loop.trains_directly
            or any(self.trains(f) for site in loop.direct_calls for f in self.resolve(site))
            or self._known_elsewhere("trains", loop.direct_calls)
        )

    def iterated_params(self, function: FunctionInfo) -> tuple[tuple[str, bool, bool], ...]:
        """The parameters a step loop of `function` iterates (`def train_one_epoch(model, data_loader):
        for x, y in data_loader:`), each with whether that loop trains and whether it iterates it again
        and again (an epoch loop around it, in this function or around the calls of it)."""
        found: dict[str, tuple[bool, bool]] = {}

        def note(param: str, loop: LoopInfo) -> None:
            trains, again = found.get(param, (False, False))
            found[param] = (trains or self.feeding_trains(loop), again or self.in_epoch_loop(loop))

        for loop in function.loops:
            if not self.feeds_steps(loop):
                continue
            for expr in drawn_from(loop):
                if not isinstance(expr, cst.Name):
                    continue
                if expr.value in function.scope.params:
                    if expr.value not in function.scope.assignments:
                        note(expr.value, loop)
                    continue
                # `loader = tqdm.tqdm(trainloader)`, `it = iter(data_loader)`: a local name wrapping one
                for param in function.scope.params:
                    if param not in function.scope.assignments and self._refers_to(
                        expr, param, function.scope, loop.scope, 1
                    ):
                        note(param, loop)
        cls = function.class_info
        if function.name == "__init__" and cls is not None:
            # `Solver(celeba_loader, ...)` keeps the loader (`self.celeba_loader = celeba_loader`) for a
            # step loop of another method to iterate (`data_iter = iter(self.celeba_loader)`).
            class_step_loops = [
                (method, loop)
                for method in self.index.functions
                if method.class_info is cls
                for loop in method.loops
                if self.is_step_loop(loop)
            ]
            for attr, bindings in cls.attributes.items():
                kept = [b.value.value for b in bindings if isinstance(b.value, cst.Name) and b.scope is function.scope]
                params = [p for p in kept if p in function.scope.params]
                for method, loop in class_step_loops if params else ():
                    if any(
                        self._refers_to(expr, f"self.{attr}", method.scope, loop.scope, 0) for expr in drawn_from(loop)
                    ):
                        for param in params:
                            note(param, loop)
        return tuple(sorted((param, trains, again) for param, (trains, again) in found.items()))

    def remote_step_loops(self, value: cst.BaseExpression) -> list[tuple[CallSite, bool]]:
        """The calls of this module that hand what `value` evaluates to (a `DataLoader(...)`) to a
        function of another module whose step loop iterates it (DeiT's `train_one_epoch(model, criterion,
        data_loader_train, ...)`), each with whether that loop trains."""
        bound = self.bound_name(value)
        if bound is None:  # `train(model, DataLoader(...))`, handed over as it is made
            return [(site, trains) for site, trains, _ in self.handed_uses(value)]
        return [(site, trains) for site, trains, _ in self._remote_uses(*bound)]

    def handed_uses(self, value: cst.BaseExpression) -> list[tuple[CallSite, bool, bool]]:
        """`_remote_uses` of a value passed straight to another module's function or class, unnamed:
        `Trainer(data_loader.loader(), config)` (SAGAN)."""
        return self._remote_uses_of(lambda argument, where: argument is value)

    def _remote_uses(self, name: str, scope: Scope) -> list[tuple[CallSite, bool, bool]]:
        """(call site, trains, again) for the calls handing what `name` holds to another module's
        function whose step loop iterates it (again: that function iterates it once per epoch)."""
        return self._remote_uses_of(lambda argument, where: self.refers_to(argument, name, scope, where))

    def _remote_uses_of(
        self, is_ours: Callable[[cst.BaseExpression, Scope], bool]
    ) -> list[tuple[CallSite, bool, bool]]:
        if self.facts is None or not self.facts.iterates:
            return []
        wanted: dict[str, list[tuple[str, int, bool, bool]]] = {}
        for target, param, position, trains, again in self.facts.iterates:
            wanted.setdefault(target, []).append((param, position, trains, again))
        found = []
        for site in self.index.calls:
            for param, position, trains, again in (w for t in self.external_targets(site) for w in wanted.get(t, ())):
                argument = argument_at(site.call, param, position)
                if argument is not None and is_ours(argument, site.scope):
                    found.append((site, trains, again))
        return found

    def step_loop_uses(self, name: str, scope: Scope, made_in_loop: bool) -> list[tuple[bool, bool]]:
        """(trains, again and again) for each step loop that iterates what `name` in `scope` holds: a
        loop of this module, or another module's loop that a call of this one hands it to. `made_in_loop`:
        the name is bound inside a loop, so a new value comes with each pass."""
        uses = []
        for loop in self.index.loops:
            if not self.feeds_steps(loop):
                continue
            if any(self._refers_to(expr, name, scope, loop.scope, 0) for expr in drawn_from(loop)):
                uses.append((self.feeding_trains(loop), not made_in_loop and self.in_epoch_loop(loop)))
        for site, trains, again in self._remote_uses(name, scope):
            uses.append((trains, not made_in_loop and (again or self._inside_loop(site.frame, frozenset()))))
        return uses

    def returned_step_uses(self, value: cst.BaseExpression) -> list[tuple[bool, bool]]:
        """(trains, again and again) for each step loop of another module that iterates `value` (a
        `DataLoader(...)`) after a function of this one returns it (RepDistiller's
        `get_cifar100_dataloaders()` returning `train_loader, val_loader, n_data`)."""
        if self.facts is None or not self.facts.returned_uses:
            return []
        bound = self.index.bound_names.get(id(value))
        if bound is not None and bound[0].startswith("self.") and bound[1].owner_class is not None:
            # `self.dataloader = DataLoader(...)` in `initialize`, `def load_data(self): return
            # self.dataloader` (pix2pixHD's loader class): what the class's methods hand back.
            def is_kept(expr: cst.BaseExpression) -> bool:
                return stored_name(expr) == bound[0]

            methods = bound[1].owner_class.methods.values()
            return [use for method in methods for use in self.returned_uses_of(method, is_kept)]
        if bound is not None:
            name, scope = bound
            function = self.function_info(scope.function) if scope.function is not None else None

            def is_ours(expr: cst.BaseExpression) -> bool:
                return isinstance(expr, cst.Name) and expr.value == name
        else:  # `return DataLoader(...)`
            function = self.returning(value)

            def is_ours(expr: cst.BaseExpression) -> bool:
                return expr is value

        return self.returned_uses_of(function, is_ours) if function is not None else []

    def returned_uses_of(
        self, function: FunctionInfo, is_ours: Callable[[cst.BaseExpression], bool]
    ) -> list[tuple[bool, bool]]:
        """(trains, again and again) of the step loops elsewhere that iterate what `function` returns,
        where what it returns (whole, or an element of a returned tuple) is ours."""
        if self.facts is None or not self.facts.returned_uses:
            return []
        elements = set()
        for returned in function.returns:
            if is_ours(returned):
                elements.add(-1)
            elif isinstance(returned, cst.Tuple):
                elements.update(i for i, element in enumerate(returned.elements) if is_ours(element.value))
        return [
            (trains, again)
            for qualname, element, trains, again in self.facts.returned_uses
            if qualname == function.qualname and element in elements
        ]

    def returned_call_uses(self, call: cst.Call, scope: Scope) -> list[tuple[int, bool, bool]]:
        """(element, trains, again) of the step loops elsewhere that iterate what a call returns, when
        its function hands the call's result straight back (`return _build_loader(config)`, Swin's
        `data/__init__.py`): the callers' uses of each element are the call's own."""
        function = self.function_info(scope.function) if scope.function is not None else None
        if function is None or self.facts is None or not self.facts.returned_uses:
            return []
        callers = [
            (element, trains, again)
            for qualname, element, trains, again in self.facts.returned_uses
            if qualname == function.qualname
        ]
        uses = []
        for returned in function.returns:
            if returned is call:
                uses.extend(callers)  # returned whole: each element is the call's own
            elif isinstance(returned, cst.Tuple):
                slots = {i for i, element in enumerate(returned.elements) if element.value is call}
                uses.extend((-1, trains, again) for element, trains, again in callers if element in slots)
        return uses

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
        name: str | None
        if isinstance(expr, cst.Call):
            qualified = self.index.imports.qualify(expr.func) or ""
            name = terminal_name(expr.func) or ""
            if qualified.endswith("DataLoader") or name.endswith("DataLoader") or LOADER_NAME.search(name):
                return True
            # A call wrapping a loader (not `len`/`range`, which turn it into a count).
            return any(self.is_loader(inner, scope, depth + 1) for inner in unwrap_iterable(expr)[1:])
        name = terminal_name(expr)
        if name is None:
            return False
        if LOADER_NAME.search(name):
            return True
        if isinstance(expr, cst.Name) and scope is not None:
            found = scope.lookup(name)
            if found is not None:
                return any(b.kind == "value" and self.is_loader(b.value, scope, depth + 1) for b in found[0])
        return False

    def walks_data(self, loop: LoopInfo) -> bool:
        """Does the loop draw one item of data per iteration from something other than a DataLoader:
        a generator function of this module (`for img_batch, mel_batch in datagen(frames, mels)`), a
        dataset read by index (`for i in range(len(dataset)): data = dataset[i]`), or a list of
        files (`for filename in filelist`)? With a forward pass in its body, each iteration is an
        evaluation or inference step."""
        if not isinstance(loop.node, cst.For):
            return False
        walked = indexed_walk(loop)
        if walked is not None and _DATASET.search(walked) and _indexed_in(loop, walked, loop_target_names(loop.node)):
            return True
        if batch_stride(loop) is not None:
            return True  # `for i in range(0, len(images), batch_size)`: one batch of samples per iteration
        for expr in unwrap_iterable(loop.node.iter):
            if self._made_by_generator(expr, loop.scope):
                return True
            name = terminal_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
            if name is not None and _FILE_LIST.search(name):
                return True
        return self._reads_item_files(loop)

    def _reads_item_files(self, loop: LoopInfo) -> bool:
        """Does every iteration read a file its item names (`for img_name in test_dataset: img =
        cv2.imread(folder + img_name)`, Retinaface's evaluation scripts): a walk over files, whatever
        the list is called?"""
        drawn = self.drawn_in(loop)
        return any(
            _FILE_READER.match(terminal_name(site.call.func) or "")
            and site.call.args
            and _data_of(site.call.args[0].value) & drawn
            and _on_every_iteration(site.frame, loop.frame)
            for site in loop.direct_calls
        )

    def drawn_in(self, loop: LoopInfo) -> set[str]:
        """The loop's item names and the names its body binds from them (_drawn_in)."""
        found = self._drawn.get(id(loop))
        if found is None:
            found = self._drawn[id(loop)] = _drawn_in(loop)
        return found

    def _made_by_generator(self, expr: cst.BaseExpression, scope: Scope) -> bool:
        if isinstance(expr, cst.Name):
            found = scope.lookup(expr.value)
            values = [b.value for b in found[0] if b.kind == "value"] if found else []
            return bool(values) and all(isinstance(v, cst.Call) and self._made_by_generator(v, scope) for v in values)
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            return any(f.is_generator for f in self._functions_by_name.get(expr.func.value, ()))
        return False

    def counts_steps(self, loop: LoopInfo) -> bool:
        node = loop.node
        if isinstance(node, cst.While):
            test = node.test
            if isinstance(test, cst.Name) and test.value == "True":
                return True  # `while True:` ... `break`: a step loop if it does a step's work
            return mentions_step_bound(test)
        targets = loop_target_names(node)
        iterable = counted_range(loop)
        if iterable is None:
            return False
        if any(is_step_variable(name) for name in targets):
            return True
        bounds = iterable.args
        return any(mentions_step_bound(arg.value) or self._mentions_loader_length(arg.value, loop) for arg in bounds)

    def _mentions_loader_length(self, expr: cst.BaseExpression, loop: LoopInfo) -> bool:
        if isinstance(expr, cst.Call) and terminal_name(expr.func) == "len" and expr.args:
            return self.is_loader(expr.args[0].value, loop.scope)
        return False

    # --- loaders -------------------------------------------------------------------------------

    def loops_over(self, value: cst.BaseExpression, depth: int = 0) -> list[LoopInfo]:
        """The loops that iterate what `value` (say a `DataLoader(...)` call) evaluates to: through the
        name it is bound to (`train_loader = DataLoader(...)`), `self.<name>`, or a parameter of a
        function whose call sites pass that name (`train(model, train_loader)`)."""
        held = self.index.held_in.get(id(value))
        if held is not None:
            return self._loops_over_entry(*held)
        bound = self.bound_name(value)
        if bound is None:
            # `def make_loader(): return DataLoader(...)`: what each call of the maker is bound to.
            maker = self.returning(value)
            if maker is None or depth > 2 or not any(r is value for r in maker.returns):
                return []  # (an element of a returned tuple would need the unpacking followed)
            return [loop for site in maker.call_sites[:8] for loop in self.loops_over(site.call, depth + 1)]
        name, scope = bound
        found = []
        for loop in self.index.loops:
            if any(self._refers_to(expr, name, scope, loop.scope, depth=0) for expr in drawn_from(loop)):
                found.append(loop)
        return found

    def device_placed_loops(self) -> set[int]:
        """ids of the loops over an iterator built to place its batches on a device itself
        (torchtext's `BucketIterator(data, batch_size=b, device=device)`): their items are device
        tensors, not a batch to copy."""
        if self._device_placed is None:
            self._device_placed = {
                id(loop)
                for site in self.index.calls
                if _places_on_device(site.call)
                for loop in self.loops_over(site.call)
            }
        return self._device_placed

    def _loops_over_entry(self, container: str, scope: Scope, key: str | bytes | None) -> list[LoopInfo]:
        """The loops over `container[key]`, or over `container[phase]` with any key: the loaders of
        `loaders = {"train": DataLoader(...), "val": ...}` in `for x in loaders[phase]`."""
        found = []
        for loop in self.index.loops:
            for expr in drawn_from(loop):
                if self._entry_of(expr, container, scope, key, loop.scope):
                    found.append(loop)
                    break
        return found

    def _entry_of(
        self, expr: cst.BaseExpression, container: str, scope: Scope, key: str | bytes | None, where: Scope
    ) -> bool:
        """Is `expr` (read in `where`) the container's entry under `key`: `loaders["train"]`,
        `loaders[phase]`, or `loader` of `for phase, loader in loaders.items()` (or `.values()`)?"""
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            read = string_key(expr)
            return (key is None or read is None or read == key) and self._refers_to(
                expr.value, container, scope, where, depth=0
            )
        if not isinstance(expr, cst.Name):
            return False
        found = where.lookup(expr.value)
        for binding in found[0] if found else ():
            value = binding.value
            if binding.kind != "loop" or not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
                continue
            wanted = {"items": 1, "values": 0}.get(value.func.attr.value)
            if wanted == binding.position and self._refers_to(value.func.value, container, scope, where, depth=0):
                return True
        return False

    def returning(self, value: cst.BaseExpression) -> FunctionInfo | None:
        """The function whose `return` statement gives back `value` itself (or as an element of a tuple)."""
        for function in self.index.functions:
            for returned in function.returns:
                if returned is value or (
                    isinstance(returned, cst.Tuple) and any(e.value is value for e in returned.elements)
                ):
                    return function
        return None

    def bound_name(self, value: cst.BaseExpression) -> tuple[str, Scope] | None:
        """What the value of this expression is called, and where: the name it is assigned to, or the
        parameter it is passed to."""
        return self.index.bound_names.get(id(value)) or self._parameter_receiving(value)

    def refers_to(self, expr: cst.BaseExpression, name: str, scope: Scope, where: Scope) -> bool:
        """Does `expr` (read in `where`) hold what `name` in `scope` holds, through names and parameters?"""
        return self._refers_to(expr, name, scope, where, depth=0)

    def _parameter_receiving(self, value: cst.BaseExpression) -> tuple[str, Scope] | None:
        """`cycle(DataLoader(...))`: a value passed straight to a function of this module is known
        there by its parameter's name."""
        for site in self.index.calls:
            for position, arg in enumerate(site.call.args):
                if arg.value is not value or arg.star:
                    continue
                for function in self.resolve(site):
                    names = function.positional_params
                    if arg.keyword is not None:
                        return arg.keyword.value, function.scope
                    if position < len(names):
                        return names[position], function.scope
                return None
        return None

    def _refers_to(self, expr: cst.BaseExpression, name: str, scope: Scope, where: Scope, depth: int) -> bool:
        if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
            if name.startswith("self."):
                return expr.attr.value == name[5:]
            # `self.data_loader`, stored from a parameter the constructor's callers pass our name for:
            # `Trainer(data_loader=loader)` ... `for batch in self.data_loader:`
            owner_class = where.owner_class
            stored = owner_class.attributes.get(expr.attr.value, ()) if owner_class is not None and depth < 3 else ()
            return any(b.kind == "value" and self._refers_to(b.value, name, scope, b.scope, depth + 1) for b in stored)
        if not isinstance(expr, cst.Name):
            return False
        found = where.lookup(expr.value)
        if found is None:
            return False
        bindings, owner = found
        if expr.value == name and owner is scope:
            return True
        if depth < 3 and any(
            # `pbar = tqdm(train_loader)`, `it = iter(loader)`, `with tqdm(enumerate(loader)) as t:`: a
            # name bound to something wrapping ours
            b.kind in ("value", "with")
            and any(self._refers_to(inner, name, scope, owner, depth + 1) for inner in unwrap_iterable(b.value))
            for b in bindings
        ):
            return True
        if depth < 3 and any(self._returned_by(b, name, scope, depth) for b in bindings):
            return True
        if depth < 3 and any(
            # `for loader, split in zip([valid_loader, test_loader], ["val", "test"]):`: each pass
            # walks one of the listed loaders
            b.kind == "loop" and any(self._refers_to(e, name, scope, owner, depth + 1) for e in _listed(b.value))
            for b in bindings
        ):
            return True
        if (
            depth < 3
            and owner.function is not None
            and (keys := {k for b in bindings if (k := _keyword_read(b, owner.function))})
        ):
            # `def train(**kwargs): data_loader = kwargs['data_loader']` (WS-DAN): the keyword argument
            # of that name at each call site
            function = self.function_info(owner.function)
            for site in self._sites_of(function)[:8] if function is not None else ():
                for arg in site.call.args:
                    if (
                        arg.keyword is not None
                        and arg.keyword.value in keys
                        and self._refers_to(arg.value, name, scope, site.scope, depth + 1)
                    ):
                        return True
        if depth < 3 and expr.value in owner.params and owner.function is not None:
            # a parameter (perhaps rebound later, `loader = sample_data(loader)`, but read as passed first):
            # does any call site pass our name for it?
            function = self.function_info(owner.function)
            if function is None:
                return False
            for site in self._sites_of(function)[:8]:
                argument = argument_for(function, expr.value, site.call)
                if argument is not None and self._refers_to(argument, name, scope, site.scope, depth + 1):
                    return True
        return False

    def _sites_of(self, function: FunctionInfo) -> list[CallSite]:
        """The calls of `function` in this module; for `__init__`, its class's constructions too
        (`Trainer(data_loader=loader)`)."""
        if function.name == "__init__" and function.class_info is not None:
            return [*function.call_sites, *self._constructions(function.class_info)]
        return list(function.call_sites)

    def _returned_by(self, binding: Binding, name: str, scope: Scope, depth: int) -> bool:
        """`train_loader, valset = prepare_dataloaders(hp)` where prepare_dataloaders, a function of
        this module, returns our `train_loader` (as that element of its tuple)."""
        value = binding.value
        if binding.kind not in ("value", "element") or not isinstance(value, cst.Call):
            return False
        site = self.call_site(value)
        for function in self.resolve(site) if site is not None else ():
            for returned in function.returns:
                if binding.kind == "element":
                    if not isinstance(returned, cst.Tuple) or binding.position >= len(returned.elements):
                        continue
                    returned = returned.elements[binding.position].value
                if self._refers_to(returned, name, scope, function.scope, depth + 1):
                    return True
        return False

    def feeds_steps(self, loop: LoopInfo) -> bool:
        """Does every iteration of the loop drive the GPU: a step loop, or a loop whose iterations hold
        step loops of their own (vid2vid draws a batch of videos, then steps over its frames)? What
        such a loop draws from a loader is copied to the device like a step loop's batch."""
        return self.is_step_loop(loop) or self.has_inner_step_loop(loop)

    def feeding_trains(self, loop: LoopInfo) -> bool:
        """Does an iteration of a loop that feeds steps train (itself, or in the step loops it holds)?"""
        return self.loop_trains(loop) or any(
            self.is_step_loop(child) and self.loop_trains(child) for child in loop.children
        )

    def in_epoch_loop(self, loop: LoopInfo) -> bool:
        """Does this loop iterate its loader again and again: inside another loop, or in a function
        called from one, or restarting the iterator it draws from itself?"""
        return self._inside_loop(loop.frame.parent, frozenset()) or restarts_iterator(loop)

    def inside_loop(self, frame: Frame | None) -> bool:
        """Does code at `frame` run again and again: in a loop, or in a function called from one?"""
        return self._inside_loop(frame, frozenset())

    def _inside_loop(self, frame: Frame | None, seen: frozenset[int]) -> bool:
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

    def under_no_grad(self, frame: Frame, seen: frozenset[int] = frozenset()) -> bool:
        """Does code in `frame` run with autograd off: inside `with torch.no_grad():` /
        `torch.inference_mode()` / `torch.set_grad_enabled(False)`, in a function decorated with one,
        or in a function all of whose call sites are, in this module and in the others that call it?"""
        current: Frame | None = frame
        while current is not None:
            if current.kind is FrameKind.WITH and any(
                self.disables_grad(item.item)
                for item in current.node.items  # type: ignore[union-attr]
            ):
                return True
            if current.kind is FrameKind.FUNCTION:
                function = current.function
                if function is None:
                    return self._grad_off_by_statement()
                if any(self.disables_grad(d.decorator) for d in function.node.decorators):
                    return True
                elsewhere = self._grad_off_elsewhere.get(function.qualname)  # None: no caller in another module
                # A call that only hands the function over (`trainer.eval(evaluate)`) does not run it:
                # the module it is handed to says how it is called (`elsewhere`).
                sites = [site for site in function.call_sites if not self.hands_over(site, function)]
                if id(function) in seen or (not sites and elsewhere is None) or elsewhere is False:
                    return self._grad_off_by_statement()
                return self._grad_off_by_statement() or all(
                    self.under_no_grad(site.frame, seen | {id(function)}) for site in sites
                )
            current = current.parent
        return self._grad_off_by_statement()

    def _grad_off_by_statement(self) -> bool:
        """Does the module turn autograd off with a statement, `torch.set_grad_enabled(False)`, and never
        back on (Retinaface's test scripts, before their loops over images)? Everything after it runs
        without autograd; the module's code is taken to run after it."""
        if self._grad_statement is None:
            switches = [
                site.call
                for site in self.index.calls
                if (self.index.imports.qualify(site.call.func) or dotted_name(site.call.func) or "")
                in ("torch.set_grad_enabled", "torch.autograd.set_grad_enabled")
            ]
            statements = (
                {id(node.value) for node in iter_subtree(self.index.module) if isinstance(node, cst.Expr)}
                if switches
                else set()
            )
            settings = [
                literal(call.args[0].value) if call.args else None for call in switches if id(call) in statements
            ]
            self._grad_statement = bool(settings) and all(setting is False for setting in settings)
        return self._grad_statement

    def disables_grad(self, expr: cst.BaseExpression) -> bool:
        """Does this context manager or decorator turn autograd off (`torch.no_grad()`,
        `torch.inference_mode()`, `torch.set_grad_enabled(False)`)?"""
        call = expr if isinstance(expr, cst.Call) else None
        target = call.func if call else expr
        # `torch` that no import binds came in through a star import (`from modeling.deeplab import *`):
        # read the name as written.
        qualified = self.index.imports.qualify(target) or dotted_name(target) or ""
        if qualified in (
            "torch.no_grad",
            "torch.inference_mode",
            "torch.autograd.no_grad",
            "torch.autograd.grad_mode.no_grad",
        ):
            return True
        if qualified == "torch.set_grad_enabled" and call is not None and call.args:
            value = call.args[0].value
            return isinstance(value, cst.Name) and value.value == "False"
        return False

    # --- framework hooks -----------------------------------------------------------------------

    def hook_name(self, function: FunctionInfo) -> str | None:
        cls = function.class_info
        if cls is None:
            return self._engine_hooks.get(id(function))
        if function.name in self.extra_hooks:
            return f"{cls.name}.{function.name}"
        framework = self.framework_of(cls)
        if framework is not None and function.name in FRAMEWORK_HOOKS[framework]:
            return f"{framework}.{function.name}"
        return None

    def framework_of(self, cls: ClassInfo, seen: frozenset[int] = frozenset()) -> str | None:
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

    def is_torch_module(self, cls: ClassInfo, seen: frozenset[int] = frozenset()) -> bool:
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

    def _own_distributed(self) -> tuple[bool, bool]:
        """(wraps DDP, calls set_epoch) for this module itself, asked once per analysis."""
        if self._distributed is None:
            self._distributed = (wraps_ddp(self.index), sets_sampler_epoch(self.index))
        return self._distributed

    def wraps_ddp(self) -> bool:
        """Is a model of this project trained under DistributedDataParallel: wrapped here, or in any
        module of the scanned project connected to this one (distributed.py)?"""
        return (self.facts is not None and self.facts.wraps_ddp) or self._own_distributed()[0]

    def communication_helper(self, function: FunctionInfo) -> str | None:
        """The collective (`"all_reduce"`) that calling `function` runs, when it is a helper that
        communicates on its caller's behalf (`reduce_tensor(loss)`) rather than a training function."""
        key = id(function)
        if key not in self._helpers:
            trains = self.trains(function) or self.has_step_loop(function)
            self._helpers[key] = None if trains else helper_collective(function, self.index)
        return self._helpers[key]

    def collective_called(self, site: CallSite) -> str | None:
        """The collective a call runs through a communication helper: of this module, another module
        of the project, or a library (`timm.utils.reduce_tensor`)."""
        if (name := library_collective(site.call, self.index)) is not None:
            return name
        for function in self.resolve(site):
            if (name := self.communication_helper(function)) is not None:
                return name
        if self.facts is None or not self.facts.collectives:
            return None
        known = dict(self.facts.collectives)
        return next((known[target] for target in self.external_targets(site) if target in known), None)

    def sets_sampler_epoch(self) -> bool:
        """Does this module, or any module of the scanned project connected to it, call `.set_epoch(...)`?"""
        return (self.facts is not None and self.facts.sets_sampler_epoch) or self._own_distributed()[1]

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
        if kind is FrameKind.OPTION:
            # `if warm_start:`, `elif skip_type == 'logSNR':`: per-step only if a caller's value selects it
            return self.reason(frame.parent) if frame.parent is not None and self._option_taken(frame) else None
        if kind is FrameKind.PERIODIC and self._guards_training(frame):
            # `if T % replay_frequency == 0: agent.learn(mem)`, `if (i + 1) % accumulate == 0:
            # optimizer.step()`: the guard sets the training step's cadence; its body is the step.
            return self.reason(frame.parent) if frame.parent is not None else None
        if kind in (FrameKind.PERIODIC, FrameKind.RARE, FrameKind.DEFERRED, FrameKind.CLASS, FrameKind.MODULE):
            return None
        if kind is FrameKind.LOOP and self.is_step_loop(frame.loop):  # type: ignore[arg-type]
            return StepReason("loop", frame.node)  # type: ignore[arg-type]
        if kind is FrameKind.FUNCTION:
            return self.function_reason(frame.function)  # type: ignore[arg-type]
        return self.reason(frame.parent) if frame.parent is not None else None

    def _guards_training(self, frame: Frame) -> bool:
        """Is this periodic guard the training step's cadence: its body trains (backward or an
        optimizer step, here or in a function it calls), and the loop around it trains nowhere else?
        (`if T % replay_frequency == 0: agent.learn(mem)`.) A loop that trains every iteration keeps
        its guards periodic: gradient accumulation's `if (i + 1) % k == 0: optimizer.step()`, or an
        evaluation every N steps through the same step function."""
        if self._guarded_calls is None:
            self._guarded_calls = {}
            outer: Frame | None
            for site in self.index.calls:
                outer = site.frame
                while outer is not None and outer.kind not in (FrameKind.FUNCTION, FrameKind.LOOP, FrameKind.MODULE):
                    if outer.kind is FrameKind.PERIODIC:
                        self._guarded_calls.setdefault(id(outer), []).append(site)
                    outer = outer.parent
        loop = frame.innermost_loop()
        if loop is None or not any(self._trains_at(site) for site in self._guarded_calls.get(id(frame), [])):
            return False
        return not any(self._trains_at(site) for site in loop.all_calls if _on_every_iteration(site.frame, loop.frame))

    def _option_taken(self, frame: Frame) -> bool:
        """Can the callers select this arm: does a value they pass for the parameter its `if` tests,
        or the default where they leave it out, take it? (options.py)"""
        function = frame.enclosing_function()
        flag = (
            constant_flag(frame.node.test, function.scope if function is not None else self.index.module_scope)
            if isinstance(frame.node, cst.If)
            else None
        )
        if flag is not None:
            # `classify = False` ... `if classify:`: what the code itself sets, wherever it sets it
            found = (function.scope if function is not None else self.index.module_scope).lookup(flag)
            values = {literal(b.value) if b.kind == "value" else UNREAD for b in found[0]} if found else {UNREAD}
            negated = isinstance(cast(cst.If, frame.node).test, cst.UnaryOperation)  # (a flag: an `if`'s)
            return any(value is UNREAD or bool(value) != negated for value in values)
        if function is None:
            return True
        test: OptionTest | None
        if isinstance(frame.node, cst.Else):
            # `else:` after `if schedule == 'linear': ... elif ...`: for the values no test before it takes
            tests = [option_test(branch.test, function.node) for branch in self.index.else_chains[id(frame.node)]]
            test = OptionTest(tests[0].param, lambda value: not any(t.takes(value) for t in tests))  # type: ignore[union-attr]
        else:
            test = option_test(cast(cst.If, frame.node).test, function.node)  # an OPTION frame: an `if` or `else`
        if test is None:
            return True
        if test.param.startswith("self."):
            values = self.setting_values(function.class_info, test.param[5:])
        else:
            found = function.scope.lookup(test.param)
            if found is None or found[0]:
                return True  # assigned anew in the function: the test no longer reads what was passed
            values = self.parameter_values(function, test.param)
        return any(value is UNREAD or test.takes(value) for value in values)

    def setting_values(self, cls: ClassInfo | None, attribute: str) -> set[object]:
        """The values an object's setting can have: what `__init__` stores in `self.<attribute>`, a
        literal or what the constructions pass for the parameter it stores. UNREAD when another
        method sets it too, or when a class of this module derives from it (its `super().__init__`
        may pass anything)."""
        bindings = cls.attributes.get(attribute, []) if cls is not None else []
        init = cls.methods.get("__init__") if cls is not None else None
        if not bindings or init is None or any(b.scope is not init.scope for b in bindings):
            return {UNREAD}
        if any(
            other is not cls and self._inherits(other, cast(ClassInfo, cls)) for other in self.index.classes.values()
        ):
            return {UNREAD}
        values: set[object] = set()
        for binding in bindings:
            value = literal(binding.value) if binding.kind == "value" else UNREAD
            stored = binding.value if binding.kind == "value" and isinstance(binding.value, cst.Name) else None
            if (
                value is UNREAD
                and stored is not None
                and stored.value in init.scope.params
                and not init.scope.assignments.get(stored.value)
            ):
                values |= self.parameter_values(init, stored.value)
            else:
                values.add(value)
        return values

    def parameter_values(self, function: FunctionInfo, name: str, depth: int = 0) -> set[object]:
        """The values the callers of `function` pass for its parameter `name`, here and in other
        modules (UNREAD for one that cannot be read), followed through a caller's own parameter
        (`get_time_steps(skip_type=skip_type)` in `sample(..., skip_type='logSNR')`). With no caller
        known, the default."""
        default = default_of(function.node, name)
        facts = self.facts
        elsewhere = [
            (tag, value)
            for qualname, param, tag, value in (facts.option_values if facts is not None else ())
            if qualname == function.qualname and param == name
        ]
        sites = function.call_sites
        if function.name == "__init__" and function.class_info is not None:
            sites = [*sites, *self._constructions(function.class_info)]  # `NoiseScheduleVP(schedule='linear')`
        if not sites and not elsewhere:
            return {default}
        values: set[object] = set()
        for site in sites[:16]:
            argument = argument_for(function, name, site.call)
            if argument is None:
                # Left out, or inside `*args` / `**kwargs` where it cannot be seen: the default, as an
                # option that a caller turns on out of sight is no cost this scan can attribute.
                values.add(default)
                continue
            value = literal(argument)
            forwarded = (
                site.scope.lookup(argument.value) if value is UNREAD and isinstance(argument, cst.Name) else None
            )
            caller = (
                self.function_info(forwarded[1].function)
                if forwarded and not forwarded[0] and forwarded[1].function
                else None
            )
            if caller is not None and depth < 3:
                values |= self.parameter_values(caller, cast(cst.Name, argument).value, depth + 1)
            else:
                values.add(value)
        for tag, value in elsewhere:
            values.add(value if tag == "=" else default if tag == "default" else UNREAD)
        return values

    def _trains_at(self, site: CallSite) -> bool:
        return (
            is_training_call(site.call, self.index.imports)
            or any(self.trains(f) for f in self.resolve(site))
            or self._known_elsewhere("trains", [site])
        )

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
                    answer = StepReason(
                        outer.kind, outer.node, outer.hook, (*outer.via, function.qualname), outer.origin
                    )
                    break
            if answer is None and key in self._entered:
                answer = StepReason("external", function.node, origin=self._entered[key])
        self._function_reason[key] = answer
        return answer


# Names of datasets an evaluation walks by index (`for i in range(len(val_dataset))`), not lists of
# settings (`for i in range(len(ALL_C))`).
_DATASET = re.compile(r"(?i)(dataset|data_?set|_set$|samples|(^|_)data$)")
# Calls that read a file named by their first argument: an image, an array, a recording.
_FILE_READER = re.compile(
    r"(?i)^(imread|imread_\w+|read_image|read_video|load_image|load_img|open|load|loadmat|load_wav|read_wav|read|sf_read)$"
)
# Names of lists of files or samples that an inference script walks one by one.
_FILE_LIST = re.compile(
    r"(?i)^(file_?list|files|filenames|file_?names|paths|image_?paths|img_?list|image_?list|wav_?list|video_?list|samples)$"
)


def counted_range(loop: LoopInfo) -> cst.Call | None:
    """The `range(...)` or `trange(...)` a `for` loop iterates, looked for inside `tqdm(...)` and
    `enumerate(...)` (their first positional argument)."""
    if not isinstance(loop.node, cst.For):
        return None
    iterable = loop.node.iter
    while isinstance(iterable, cst.Call) and terminal_name(iterable.func) in ("tqdm", "enumerate"):
        args = [arg.value for arg in iterable.args if arg.keyword is None]
        if not args:
            break
        iterable = args[0]
    if isinstance(iterable, cst.Call) and terminal_name(iterable.func) in ("range", "trange"):
        return iterable
    return None


def indexed_walk(loop: LoopInfo) -> str | None:
    """ "dataset" for `for i in range(len(dataset))` (also inside `tqdm(...)` / `enumerate(...)`)."""
    iterable = counted_range(loop)
    if iterable is None or terminal_name(iterable.func) != "range" or len(iterable.args) != 1:
        return None
    length = iterable.args[0].value
    if isinstance(length, cst.Call) and terminal_name(length.func) == "len" and len(length.args) == 1:
        return dotted_name(length.args[0].value)
    return None


_BATCH_SIZE = re.compile(r"(?i)(batch_?size|^bs$|^bsz$|_bs$)")


def batch_stride(loop: LoopInfo) -> cst.BaseExpression | None:
    """The stride of `for i in range(start, stop, batch_size)` (also inside `tqdm(...)` /
    `enumerate(...)`), when it names a batch size: the loop walks its data one batch at a time."""
    iterable = counted_range(loop)
    if iterable is None:
        return None
    positional = [arg.value for arg in iterable.args if arg.keyword is None and not arg.star]
    if len(positional) != 3:
        return None
    names = [
        terminal_name(node) or "" for node in iter_subtree(positional[2]) if isinstance(node, (cst.Name, cst.Attribute))
    ]
    return positional[2] if any(_BATCH_SIZE.search(name) for name in names) else None


def _indexed_in(loop: LoopInfo, walked: str, targets: set[str]) -> bool:
    """Does the loop's body read `walked[i]` with its own loop variable `i`?"""
    for node in iter_subtree(loop.node.body):
        if isinstance(node, cst.Subscript) and dotted_name(node.value) == walked and len(node.slice) == 1:
            index = node.slice[0].slice
            if isinstance(index, cst.Index) and isinstance(index.value, cst.Name) and index.value.value in targets:
                return True
    return False


def looks_like_class(name: str) -> bool:
    """`ResNet`, `Tacotron2`, `MoCo`, `YOLOX`, `MLP`: a class by Python's naming convention; not
    `GAN_training_function`, nor a constant like `MAX_LEN`. A private class (`_RPN`, `_fasterRCNN`) too."""
    if name.startswith("_") and len(name) > 1 and name[1] != "_":
        name = name[1:]
        if name[:1].islower() and any(c.isupper() for c in name[1:]) and "_" not in name:
            return True  # `_fasterRCNN`: camel case behind the underscore
    if not name[:1].isupper() or re.search(r"_[a-z]", name) is not None:
        return False
    return any(c.islower() for c in name) or (len(name) > 1 and "_" not in name)


def _counts_to_one(loop: LoopInfo) -> bool:
    """`num_updates = 1` ... `for _ in range(num_updates):` (CURL's update loop, one update per
    environment step): a count the code sets to one runs its body once, as part of the loop around it."""
    counted = counted_range(loop)
    if counted is None or terminal_name(counted.func) != "range" or len(counted.args) != 1 or counted.args[0].star:
        return False
    count = counted.args[0].value
    if isinstance(count, cst.Name):
        found = loop.scope.lookup(count.value)
        if not found or not found[0] or count.value in found[1].params:
            return False
        return all(b.kind == "value" and literal(b.value) == 1 for b in found[0])
    return literal(count) == 1


def restarts_iterator(loop: LoopInfo) -> bool:
    """Does the loop draw batches with `next(it)` and make `it = iter(loader)` again in its own body
    when the loader runs out (SAGAN's `except StopIteration: data_iter = iter(self.data_loader)`)?
    Each restart is a new pass over the loader: an epoch."""
    for site in loop.direct_calls:
        iterator = next_of(site.call, site.scope)
        if isinstance(iterator, cst.Name):
            found = site.scope.lookup(iterator.value)
            bindings = found[0] if found else []
        elif (
            isinstance(iterator, cst.Attribute)
            and stored_name(iterator) is not None
            and site.scope.owner_class is not None
        ):
            bindings = site.scope.owner_class.attributes.get(iterator.attr.value, [])
        else:
            continue
        if any(
            b.kind == "value"
            and isinstance(b.value, cst.Call)
            and terminal_name(b.value.func) == "iter"
            and loop_within(b.loop, loop)
            for b in bindings
        ):
            return True
    return False


def _keyword_read(binding: Binding, function: cst.FunctionDef) -> str | None:
    """ "data_loader" for a name bound to `kwargs['data_loader']` or `kwargs.get('data_loader')`, where
    `kwargs` is the function's `**` parameter: a keyword argument its callers pass."""
    star = function.params.star_kwarg
    value = binding.value
    if star is None or binding.kind != "value":
        return None
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in ("get", "pop")
        and value.args
    ):
        holder, key = value.func.value, value.args[0].value
    elif isinstance(value, cst.Subscript) and len(value.slice) == 1 and isinstance(value.slice[0].slice, cst.Index):
        holder, key = value.value, value.slice[0].slice.value
    else:
        return None
    if not (isinstance(holder, cst.Name) and holder.value == star.name.value and isinstance(key, cst.SimpleString)):
        return None
    text = key.evaluated_value
    return text if isinstance(text, str) else None


def drawn_from(loop: LoopInfo) -> list[cst.BaseExpression]:
    """What the loop draws its items from: the parts of a `for` loop's iterable (`tqdm(loader)` gives
    the call and `loader`), and what `next(...)` reads in its body (`for i in range(n): x = next(it)`)."""
    drawn = list(unwrap_iterable(loop.node.iter)) if isinstance(loop.node, cst.For) else []
    drawn += [iterator for site in loop.direct_calls if (iterator := next_of(site.call, site.scope)) is not None]
    return drawn


# Iterators that take a `device=` and put each batch there: torchtext's (legacy) Iterator family.
_PLACING_ITERATOR = re.compile(r"(Bucket|BPTT)?Iterator$")


def _places_on_device(call: cst.Call) -> bool:
    """`BucketIterator(train, batch_size=b, device=device)`, with a device other than the CPU."""
    if not _PLACING_ITERATOR.search(terminal_name(call.func) or ""):
        return False
    device = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "device"), None)
    return device is not None and not (isinstance(device, cst.SimpleString) and "cpu" in device.value)


def _moves_itself(binding: Binding, name: str) -> bool:
    """`name = name.to(device)`, `name = name.cuda().eval()`: the same object, moved."""
    if binding.kind != "value":
        return False
    value = _unmoved(binding.value)
    return isinstance(value, cst.Name) and value.value == name and value is not binding.value


def _unmoved(value: cst.BaseExpression) -> cst.BaseExpression:
    """`model` for `model.to(device).eval()`: what a chain of moves and mode switches starts from."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in _MOVES:
        value = value.func.value
    return value


# Class methods that build an instance of their class (Hugging Face's, Lightning's).
_ALTERNATE_CONSTRUCTORS = frozenset({"from_pretrained", "from_config", "load_from_checkpoint"})


def _option_tests(function: FunctionInfo) -> Iterator[OptionTest]:
    """The option tests (options.py) of the `if`s in a function's body."""
    for node in iter_subtree(function.node.body):
        if isinstance(node, cst.If) and (test := option_test(node.test, function.node)) is not None:
            yield test


def _walks_written_out(loop: LoopInfo) -> bool:
    """Does a `for` loop walk nothing it can tell, or a collection written out in the code (`for psi
    in [0.5, 0.7, 1.0]`: a few settings, not data)?"""
    walked = unwrap_iterable(loop.node.iter)  # type: ignore[union-attr]
    return not walked or any(isinstance(expr, (cst.List, cst.Tuple, cst.Set, cst.Dict)) for expr in walked)


def _drawn_in(loop: LoopInfo) -> set[str]:
    """The loop's item names and the names its body binds from them (`x = move(batch['waveform'])`)."""
    drawn = set(loop_target_names(loop.node))
    bound = [
        (name, binding.value)
        for name, bindings in loop.scope.assignments.items()
        for binding in bindings
        if binding.loop is loop and binding.kind in ("value", "element")
    ]
    for _ in range(8):
        more = {name for name, value in bound if name not in drawn and _data_of(value) & drawn}
        if not more:
            break
        drawn |= more
    return drawn


def _data_of(expr: cst.BaseExpression) -> set[str]:
    """The names whose values flow into `expr` as its data. A call's data is its first positional
    argument and, for a method, its receiver: not its other arguments (`scale_model_input(x, t)`,
    `lerp(a, b, alpha)`, `scale_factor=scale` are settings), nor the callee, nor a tensor's device,
    dtype or shape (`.to(d.device)`)."""
    if isinstance(expr, cst.Name):
        return {expr.value}
    if isinstance(expr, cst.Attribute):
        return set() if expr.attr.value in ("device", "dtype", "shape", "ndim") else _data_of(expr.value)
    if isinstance(expr, cst.Call):
        first = next((arg.value for arg in expr.args if arg.keyword is None and not arg.star), None)
        found = _data_of(first) if first is not None else set()
        if isinstance(expr.func, cst.Attribute):
            found |= _data_of(expr.func.value)
        return found
    found = set()
    for child in expr.children:
        if isinstance(child, cst.Arg) and child.keyword is not None:
            continue
        if isinstance(child, (cst.BaseExpression, cst.Element, cst.SubscriptElement, cst.Index, cst.Arg)):
            found |= _data_of(child)  # type: ignore[arg-type]
    return found


def _on_every_iteration(frame: Frame | None, loop_frame: Frame) -> bool:
    """Does code in `frame` run on (most) iterations of the loop whose body is `loop_frame`: not under a
    periodic guard or in a rare branch between the two?"""
    while frame is not None and frame is not loop_frame:
        if frame.kind in (FrameKind.PERIODIC, FrameKind.RARE, FrameKind.DEFERRED, FrameKind.OPTION):
            return False
        frame = frame.parent
    return True
