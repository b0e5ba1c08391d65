"""Project-wide analysis: the per-step model across the modules of one scan.

Real projects put the loop in train.py and the step in engine.py, models.py or utils.py. When a scan
covers several files, each file is still parsed and analysed on its own (in worker processes), but
its analysis also yields a small, picklable `ModuleSummary`: what its functions do (train, hold a
step loop, do a step's work) and which calls it makes into other modules, with why each runs once
per step. From all the summaries, `derive_facts` computes each module's `ProjectFacts`: the functions
of other modules its calls enter that train (so its loop is a step loop), the functions of its own
that other modules call once per step (and from where), and whether a CUDA module drives it. A module
whose facts changed is analysed again with them; a few rounds settle the longest call chains. A file
scanned alone gets no facts and keeps the single-file behaviour.

Imports resolve the way Python would from the project's folders: `from engine import f` and
`import utils` to a module of that name nearest the importing file, `from ..losses import f` against
the importing file's package.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import libcst as cst

from ..canonical import content_digest
from .config_files import read_config_values
from .constants import CPU_COUNT, At, declared_defaults, setting_value
from .device import names_cuda
from .module_index import STAR_KWARGS, FrameKind, Signature
from .names import dotted_name
from .options import UNREAD, literal
from ..positions import source_lines

if TYPE_CHECKING:
    from .module_index import ModuleIndex
    from .stepmodel import StepModel
    from .tensors import TensorInference

MAX_ROUNDS = 10  # each round settles one more link of a cross-module call chain
# A function is per-step when a per-step line calls it from at most this many modules away: training
# code reaches its step through a few of its own modules (train.py -> engine.py -> utils.py), while
# following every call on into a library scanned with it would mark the whole library per-step.
MAX_HOPS = 3


@dataclass(frozen=True)
class ProjectFacts:
    """What the rest of the project says about one module. Equal facts give equal findings, so the
    scan re-analyses a module only when its facts change (and a cache can key on them)."""

    # First parts of the project's module names: calls to anything else (torch, numpy) never enter it.
    roots: frozenset[str] = frozenset()
    trains: frozenset[str] = frozenset()  # call targets (as this module's imports name them) that train
    has_step_loop: frozenset[str] = frozenset()  # ... that run a step loop of their own
    step_work: frozenset[str] = frozenset()  # ... that train, run a forward pass or fetch a batch
    entered: tuple[tuple[str, str], ...] = ()  # (qualname, origin): own functions entered per step elsewhere
    cuda: bool = False  # a module that targets CUDA drives this one's code
    # (qualname, parameter, kind): what the callers in other modules pass (a Kind's value, merged here)
    argument_kinds: tuple[tuple[str, str, str], ...] = ()
    # (qualname, parameter, value): the setting (an int or bool, such as a worker count) that the callers
    # in other modules pass for a parameter that a function of this module hands to a DataLoader
    argument_values: tuple[tuple[str, str, object], ...] = ()
    # (qualname, parameter, "@file:Class"): the class of the object the callers pass
    argument_classes: tuple[tuple[str, str, str], ...] = ()
    # (call target as this module names it, (whole, element 0, ...) Kind values): what calls return
    return_kinds: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # (call target as this module names it, "@file:Class"): the class of the object a call returns
    # (YOLOX's `model = self.exp.get_model()`)
    return_classes: tuple[tuple[str, str], ...] = ()
    # (call target, parameter, its position or -1, whether the loop trains): functions of other modules
    # whose step loop iterates what the call passes for that parameter (a DataLoader built here)
    iterates: tuple[tuple[str, str, int, bool, bool], ...] = ()  # (..., whether the loop trains, whether again and again)
    # (qualname, element or -1 for the whole value, trains, again and again): what a function of this
    # module returns is iterated by a step loop elsewhere (a DataLoader a helper builds and returns)
    returned_uses: tuple[tuple[str, int, bool, bool], ...] = ()
    # (destination, value): the declared defaults of the command-line options of the other modules
    # (int or bool, the same wherever declared): `args.num_workers` in a data factory handed `args`
    command_line_defaults: tuple[tuple[str, object], ...] = ()
    # (key, value): the integer and boolean settings the repository's YAML configuration files agree
    # on (config_files.py): `config["num_workers"]` in a script that loads one
    config_file_values: tuple[tuple[str, object], ...] = ()
    # The prefilter ruled the module out, but it loops and imports a module whose functions train or
    # hold a step loop: its loops may feed them, so it is parsed after all.
    imports_training: bool = False
    # It targets CUDA (itself or through a caller) and runs code per step (its own loop or hook, or
    # entered from elsewhere): the only kind of module whose findings values and CUDA can change.
    active: bool = False
    # An active module calls into it (not necessarily per step): what it returns or builds, a model
    # made by a factory method (YOLOX's `exp.get_model()`), is needed there, so it is analysed even
    # when the prefilter sees no step code in it. Or it defines a model in a repository that trains
    # on CUDA, whose caller may be one the scan cannot follow (derive_facts).
    reached: bool = False
    # (qualname, parameter): a function of this module whose callers elsewhere pass, for a parameter it
    # calls, a function that does a step's work (a callback that runs the model: `sample2dir(...,
    # sample_fn)`); a loop calling it on every iteration is then a step loop
    passed_step_work: tuple[tuple[str, str], ...] = ()
    # (qualname, parameter, tag, value): what the callers in other modules pass for a parameter that
    # selects an arm of a function of this module (options.py): tag "=" a literal value, "default"
    # left out, "unread" something that cannot be read statically
    option_values: tuple[tuple[str, str, str, object], ...] = ()
    # (qualname, whether every call from other modules runs with autograd off): a function of this module
    # that other modules call, and whether they all call it under `torch.no_grad()` (drqv2's `act`)
    grad_off_callers: tuple[tuple[str, bool], ...] = ()

    def demand_analysis(self) -> bool:
        """Does the project need the module analysed whatever it looks like? Its step loop, its torch
        import or its device may be in the caller, and the project may wait for its summary."""
        return bool(self.entered) or self.cuda or self.imports_training or self.reached

    def analysis_key(self) -> tuple:
        """What the module's analysis depends on: facts equal in this key give the same findings and
        summary, so the module need not be analysed again. Outside an active module only the facts
        about steps matter (CUDA and values change no finding there, and no summary)."""
        steps = (
            self.trains, self.has_step_loop, self.step_work, self.entered, self.iterates, self.returned_uses,
            self.argument_values, self.imports_training, self.active, self.reached, self.passed_step_work,
            self.option_values, self.grad_off_callers,
        )
        if not self.active:
            return steps
        return (
            *steps, self.cuda, self.argument_kinds, self.argument_classes, self.return_kinds, self.return_classes,
            self.command_line_defaults, self.config_file_values,
        )

    def grown(self, newer: ProjectFacts) -> ProjectFacts:
        """These facts joined with a later round's. What is known about steps and CUDA only grows,
        so the rounds settle instead of swinging between two answers; what values are (argument and
        return kinds, classes) is refined from round to round, so the later word stands."""
        if newer == self:
            return self  # the common case in later rounds (the tuples are sorted sets, so joining changes nothing)
        return replace(
            newer,
            trains=self.trains | newer.trains,
            has_step_loop=self.has_step_loop | newer.has_step_loop,
            step_work=self.step_work | newer.step_work,
            iterates=tuple(sorted(set(self.iterates) | set(newer.iterates))),
            returned_uses=tuple(sorted(set(self.returned_uses) | set(newer.returned_uses))),
            entered=tuple(sorted({**dict(newer.entered), **dict(self.entered)}.items())),
            cuda=self.cuda or newer.cuda,
            imports_training=self.imports_training or newer.imports_training,
            active=self.active or newer.active,
            reached=self.reached or newer.reached,
            passed_step_work=tuple(sorted(set(self.passed_step_work) | set(newer.passed_step_work))),
            option_values=tuple(sorted(set(self.option_values) | set(newer.option_values), key=repr)),
        )

    def reaches_project(self, target: str) -> bool:
        # ".x" relative, "@file:Class.m" a class a caller handed in, "*.m" a method of an untyped object,
        # "&mods:name" a star import, "^Class.m" the overrides of a method called on self
        return target.startswith((".", "@", "*", "&", "^")) or target.split(".", 1)[0] in self.roots


@dataclass(frozen=True)
class CallEdge:
    target: str  # qualified through the caller's imports: "engine.train_one_epoch", ".utils.f", "models.Net.forward"
    per_step: str | None  # why the call runs once per step, with marks for its lines (origins.py); None if not
    passes_device: bool  # an argument names the device (`device`, `args.device`, `x.cuda()`, `gpu`)
    # (position or keyword, Kind value) of each argument, and (position or keyword, class) where the
    # argument is an object whose class is known ("models.Net" as the caller imports it, "<local>.Net")
    arguments: tuple[tuple[str, str], ...] = ()
    classes: tuple[tuple[str, str], ...] = ()
    # (element or -1, trains, again and again) for each step loop that iterates what the call returns
    result_uses: tuple[tuple[int, bool, bool], ...] = ()
    # (position or keyword, value) of each argument that is a setting read statically (constants.py)
    values: tuple[tuple[str, object], ...] = ()
    caller_class: str = ""  # the top-level class whose method makes the call ("" outside any class)
    # How many positional arguments it passes (-1: a `*args` or `**kwargs` makes it unknown) and the
    # keywords: which methods of that name it could call, when the receiver's class is unknown.
    positional: int = -1
    keywords: tuple[str, ...] = ()
    # Resolved by the method's name alone (derive_facts sets it on the edges it fans out): a guess good
    # enough to follow the step, not to carry CUDA from one module to another.
    by_name: bool = False
    # (position or keyword, qualname, does a step's work, holds a step loop) of each argument that names
    # a function of the caller's module (a callback: `sample2dir(..., sample_fn)`)
    callables: tuple[tuple[str, str, bool, bool], ...] = ()
    # (position or keyword, tag, value) of each argument: tag "=" with a literal's value, else "unread"
    literals: tuple[tuple[str, str, object], ...] = ()
    grad_off: bool = False  # the call runs with autograd off (`with torch.no_grad():` around it, here or up its callers)
    # (keyword, Kind value) of each keyword argument as the code shows it, names not taken at their
    # word: what lands in a `**kwargs` (`meters.update(loss=loss)`)
    keyword_kinds: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class FunctionFacts:
    trains: bool
    has_step_loop: bool
    step_work: bool
    params: tuple[str, ...] = ()  # positional parameters, `self` left out: position -> name
    # parameters a step loop of its own iterates, whether it trains, and whether it iterates them again
    # and again (once per epoch: a loader the constructor keeps for `train()` to iterate every epoch)
    iterates: tuple[tuple[str, bool, bool], ...] = ()
    loader_settings: tuple[str, ...] = ()  # parameters it passes on as a DataLoader's arguments (`num_workers=workers`)
    abstract: bool = False  # a method a subclass must provide: `pass`, `...` or `raise NotImplementedError` only
    signature: Signature = Signature()  # what calls it accepts (a call resolved by method name must fit)
    # (parameter, why the call runs per step) for each parameter it calls per step: a callback
    # (`def run(step_fn): for b in loader: step_fn(b)`), entered per step in the module that passes it
    called_params: tuple[tuple[str, str], ...] = ()
    options: tuple[str, ...] = ()  # parameters whose value selects an arm of its code (options.py)
    # the called parameters it calls only with autograd off (`with torch.no_grad(): evaluate(model, batch)`)
    grad_off_params: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModuleSummary:
    functions: dict[str, FunctionFacts] = field(default_factory=dict)  # qualname -> what calling it does
    class_bases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # class -> bases (qualified if imported)
    edges: tuple[CallEdge, ...] = ()
    cuda: bool = False  # the module's own evidence that it targets CUDA (device.py)
    # qualname -> (whole, element 0, ...) Kind values of what it returns, where something is known
    returns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    factories: dict[str, str] = field(default_factory=dict)  # qualname -> "qualname.inner", the function it returns
    has_step_code: bool = False  # a step loop or a step hook of its own
    # qualname -> the class of the object it returns (as class_of names it: imported, or "<local>.X")
    returned_classes: dict[str, str] = field(default_factory=dict)
    # attribute or keyword name -> the class of the object stored under it (`self.generator = Generator()`,
    # `Munch(generator=Generator(...))`), where the module says so
    field_classes: dict[str, str] = field(default_factory=dict)
    # its own classes it builds (a block of a bigger model defined beside it)
    classes_made: frozenset[str] = frozenset()
    # a step loop that trains, fetches batches (`get_batch`), or runs models on what a loader yields;
    # or a step hook: a job that feeds models data, not only a loop of a library's own algorithms
    # (a batched RANSAC, `for data in data_iter: check(data)`)
    feeds_models: bool = False
    # (destination, value) of its command-line options whose declared default is an int or a bool
    command_line_defaults: tuple[tuple[str, object], ...] = ()
    # It names CUDA without moving anything to a device, or the reverse: with a module of the same
    # repository doing the other half, the project runs on CUDA (device.names_cuda).
    names_cuda: bool = False
    names_cuda_device: bool = False  # a "cuda" string: a device, not just a `torch.cuda` call (seeding)
    moves_to_device: bool = False
    # module-level name -> what its dict literal maps keys to, as this module names them
    # (`trainer_dict = {"base": BaseTrainer, "crd": CRDTrainer}`): a call `trainer_dict[key](...)`
    # may construct or call any of them
    registries: dict[str, tuple[str, ...]] = field(default_factory=dict)


def summarize(index: ModuleIndex, steps: StepModel, tensors: TensorInference, cuda: bool, describe) -> ModuleSummary:
    """The summary of one analysed module. `describe(reason, call)` renders why `call` runs per step."""
    facts = steps.facts
    assert facts is not None
    functions = {}
    factories = {}
    for function in index.functions:
        qualname = function.qualname
        if function.frame.parent is not None and function.frame.parent.kind not in (FrameKind.MODULE, FrameKind.CLASS):
            continue  # a nested function is only reached through its enclosing one (or as a factory's product)
        for made in steps.returned_functions(function):
            factories[qualname] = f"{qualname}.{made.name}"
            functions[factories[qualname]] = _function_facts(steps, made, describe)
        functions[qualname] = _function_facts(steps, function, describe)
    returns = {}
    for function in index.functions:
        if function.qualname in functions and function.returns:
            kinds = tensors.function_returns(function)
            if any(kind.value != "unknown" for kind in kinds):
                returns[function.qualname] = tuple(kind.value for kind in kinds)
    bases = {
        name: tuple(index.imports.qualify(base) or _plain(base) for base in cls.bases)
        for name, cls in index.classes.items()
    }
    edges = []
    for site, target in ((site, target) for site in index.calls for target in steps.external_targets(site)):
        if not facts.reaches_project(target):
            continue
        reason = steps.reason(site.frame)
        if (
            target.startswith("*") and reason is None and site.frame.innermost_loop() is None
            and id(site.call) not in index.bound_names
        ):
            continue  # an untyped method call matters where it may train or run per step, or makes a value
        if target.startswith("^") and reason is None:
            continue  # the overrides of a method called on self matter only where the call runs per step
        per_step = describe(reason, site.call) if reason is not None else None
        arguments, classes, values = [], [], []
        at = At(site.scope, index, steps)
        for position, arg in enumerate(site.call.args):
            if arg.star:
                break
            if position >= 16 and arg.keyword is None:
                continue  # (every keyword counts: a caller turning an option on, `use_amp=args.use_amp`)
            key = arg.keyword.value if arg.keyword is not None else str(position)
            arguments.append((key, tensors.kind_at(arg.value, site.scope, site.frame).value))
            value = setting_value(arg.value, at)
            if type(value) in (int, bool):
                values.append((key, value))
            cls = steps.class_made_by(arg.value, site.scope)
            if cls is not None:
                classes.append((key, cls))
        starred = any(arg.star for arg in site.call.args)
        callables = tuple(
            (arg.keyword.value if arg.keyword is not None else str(position), function.qualname,
             steps.function_does_step_work(function), steps.has_step_loop(function))
            for position, arg in enumerate(site.call.args) if not arg.star
            for function in steps.local_functions(arg.value, site.scope)[:1]
        )
        literals = tuple(
            (arg.keyword.value if arg.keyword is not None else str(position), "unread" if value is UNREAD else "=",
             None if value is UNREAD else value)
            for position, arg in enumerate(site.call.args) if not arg.star
            for value in (literal(arg.value),)
        )
        edges.append(CallEdge(
            target, per_step, _passes_device(site.call), tuple(arguments), tuple(classes), _result_uses(steps, site),
            tuple(values), _outermost_class(site.frame),
            -1 if starred else sum(1 for arg in site.call.args if arg.keyword is None),
            tuple(arg.keyword.value for arg in site.call.args if arg.keyword is not None),
            callables=callables, literals=literals, grad_off=steps.under_no_grad(site.frame),
            keyword_kinds=tuple(
                (arg.keyword.value, tensors.shown_kind_at(arg.value, site.scope, site.frame).value)
                for arg in site.call.args if arg.keyword is not None
            ),
        ))
    step_loops = [loop for loop in index.loops if steps.is_step_loop(loop)]
    has_hook = any(steps.hook_name(function) is not None for function in index.functions)
    feeds_models = has_hook or any(
        steps.loop_trains(loop) or steps.fetches_batch(loop)
        or (steps.iterates_loader(loop) and steps.does_step_work(loop.all_calls))
        for loop in step_loops
    )
    returned_classes = {}
    for function in index.functions:
        if function.qualname in functions:
            cls = steps.returned_class(function)
            if cls is not None:
                returned_classes[function.qualname] = cls
    classes_made = frozenset(
        site.call.func.value for site in index.calls
        if isinstance(site.call.func, cst.Name) and site.call.func.value in index.classes
    )
    registries = {name: members for name in index.module_scope.assignments if (members := steps.registry(name))}
    return ModuleSummary(
        functions, bases, tuple(edges), cuda, returns, factories, bool(step_loops) or has_hook, returned_classes,
        _field_classes(index, steps), classes_made, feeds_models,
        names_cuda=names_cuda(index), names_cuda_device=bool(index.cuda_strings), moves_to_device=index.moves_to_device, registries=registries,
        command_line_defaults=tuple(sorted(
            (dest, value) for dest, value in declared_defaults(At(index.module_scope, index, steps)).items()
            if type(value) in (int, bool) or value == CPU_COUNT
            or (type(value) is str and "device" in dest.lower() and value.startswith(("cuda", "cpu")))
        )),
    )


def _outermost_class(frame) -> str:
    """The top-level class a call is made in ("" outside any class): whether a model makes it (a
    block built or called by another model is reached through that model: _enter_unseen_models)."""
    found = ""
    while frame is not None:
        if frame.kind is FrameKind.CLASS and frame.class_info is not None:
            found = frame.class_info.name
        frame = frame.parent
    return found


def _field_classes(index: ModuleIndex, steps: StepModel) -> dict[str, str]:
    """Name -> class for objects stored under a name: `self.generator = Generator(...)` in a class,
    `Munch(generator=Generator(...), ...)` or `dict(style_encoder=StyleEncoder(...))`. A name given two
    classes in the module is left out."""
    found: dict[str, set[str]] = {}
    for cls in index.classes.values():
        for name, bindings in cls.attributes.items():
            for binding in bindings:
                if binding.kind == "value":
                    made = steps.class_made_by(binding.value, binding.scope)
                    if made is not None:
                        found.setdefault(name, set()).add(made)
    for site in index.calls:
        for arg in site.call.args:
            if arg.keyword is not None:
                made = steps.class_made_by(arg.value, site.scope)
                if made is not None:
                    found.setdefault(arg.keyword.value, set()).add(made)
    return {name: classes.pop() for name, classes in found.items() if len(classes) == 1}


def _result_uses(steps: StepModel, site) -> tuple[tuple[int, bool, bool], ...]:
    """How step loops use what a call returns: `train_loader, val_loader, n = get_loaders(...)` then
    `for x, y in train_loader:` (here, or in another module the loader is handed to)."""
    uses = set()
    for name, bindings in site.scope.assignments.items():
        for binding in bindings:
            if binding.value is not site.call or binding.kind not in ("value", "element"):
                continue
            element = binding.position if binding.kind == "element" else -1
            for trains, again in steps.step_loop_uses(name, site.scope, binding.loop is not None):
                uses.add((element, trains, again))
            for trains, again in _returned_on(steps, site.scope, name):
                uses.add((element, trains, again))  # mdistiller's get_dataset(cfg) passes its loaders on
    for _, trains, again in steps.handed_uses(site.call):
        # `Trainer(data_loader.loader(), config)`: the result handed straight to a step loop elsewhere
        # (made anew at each pass when the handing call is itself in a loop)
        uses.add((-1, trains, again and not steps.inside_loop(site.frame)))
    uses.update(steps.returned_call_uses(site.call, site.scope))
    return tuple(sorted(uses))


def _returned_on(steps: StepModel, scope, name: str) -> list[tuple[bool, bool]]:
    """(trains, again) of the step loops elsewhere that iterate what the function of `scope` returns,
    where it returns `name` (whole, or as an element of a returned tuple)."""
    function = steps.function_info(scope.function) if scope.function is not None else None
    if function is None:
        return []
    return steps.returned_uses_of(function, lambda expr: isinstance(expr, cst.Name) and expr.value == name)


def _function_facts(steps: StepModel, function, describe) -> FunctionFacts:
    called = {}
    grad_off: dict[str, bool] = {}
    for site in function.all_calls:
        parameter = steps.called_parameter(site)
        reason = steps.reason(site.frame) if parameter is not None and parameter[0] is function else None
        if reason is not None:
            called.setdefault(parameter[1], describe(reason, site.call))
            grad_off[parameter[1]] = grad_off.get(parameter[1], True) and steps.under_no_grad(site.frame)
    return FunctionFacts(
        steps.trains(function), steps.has_step_loop(function), steps.function_does_step_work(function),
        function.positional_params,
        steps.iterated_params(function),
        _loader_settings(steps, function),
        _is_abstract(function),
        function.signature,
        tuple(sorted(called.items())),
        steps.option_params(function),
        tuple(sorted(param for param, off in grad_off.items() if off)),
    )


def _is_abstract(function) -> bool:
    """A method whose body does nothing but stand in for a subclass's (CycleGAN's BaseModel.set_input)."""
    if function.class_info is None:
        return False
    if any((dotted_name(d.decorator) or "").endswith("abstractmethod") for d in function.node.decorators):
        return True
    body = function.node.body
    statements = list(body.body) if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        if not isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            return False
        for small in statement.body:
            if isinstance(small, cst.Pass):
                continue
            if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis)):
                continue
            if isinstance(small, cst.Raise) and small.exc is not None and "NotImplementedError" in _raised_name(small.exc):
                continue
            return False
    return True


def _raised_name(exc: cst.BaseExpression) -> str:
    return dotted_name(exc.func if isinstance(exc, cst.Call) else exc) or ""


def _loader_settings(steps: StepModel, function) -> tuple[str, ...]:
    """The parameters `function` hands straight to a DataLoader: `DataLoader(ds, num_workers=workers)`."""
    params = function.scope.params
    found = set()
    for site in function.all_calls:
        qualified = steps.index.imports.qualify(site.call.func) or ""
        if qualified.endswith("DataLoader"):
            found.update(
                arg.value.value for arg in site.call.args if isinstance(arg.value, cst.Name) and arg.value.value in params
            )
    return tuple(sorted(found))


def _plain(node: cst.BaseExpression) -> str:
    return node.value if isinstance(node, cst.Name) else ""


def _passes_device(call: cst.Call) -> bool:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value in ("device", "gpu", "gpu_id", "rank", "local_rank"):
            return True
        node = arg.value
        if isinstance(node, cst.SimpleString) and node.value.strip("'\"").startswith("cuda"):
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in ("cuda", "to"):
            return True
        while isinstance(node, cst.Attribute):
            if "device" in node.attr.value or node.attr.value in ("gpu", "local_rank"):
                return True
            node = node.value
        if isinstance(node, cst.Name) and ("device" in node.value or node.value in ("gpu", "local_rank")):
            return True
    return False


_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import\b|import[ \t]+([\w.]+))", re.M)


# A top-level class and the methods of its body (`def m(self`), read from the text of a file that was
# not parsed: enough to tell which class a `sampler.update(...)` call enters.
# The names a module defines at its top level (functions, classes, assigned names), read from its text;
# what a package's __init__.py imports from its submodules is found in those submodules instead.
_CUDA_DEVICE_TEXT = re.compile(r"""["']cuda(:\d+)?["']""")
_MOVE_TEXT = re.compile(r"\.(cuda|to)\(")
_TOP_LEVEL = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)|^(\w+)[ \t]*(?::[^=\n]*)?=[^=]", re.M)
_CLASS = re.compile(r"class[ \t]+(\w+)")
_METHOD = re.compile(r"([ \t]+)(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\([ \t]*self\b")
# A top-level class with a `Module` among its bases: a model, which the project asks to have analysed
# where its repository trains on CUDA (derive_facts); the prefilter does not pass it for that.
_MODULE_CLASS = re.compile(r"^class[ \t]+\w+[ \t]*\([^)\n]*\bModule\b", re.M)


# Packages that are libraries wherever their sources sit: a call into them is never into the project.
LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "numpy", "scipy", "transformers", "diffusers",
    "timm", "accelerate", "lightning", "pytorch_lightning", "lightning_fabric", "datasets", "peft", "trl",
    "deepspeed", "apex", "ignite", "torch_geometric", "dgl", "jax", "tensorflow", "sklearn", "pandas",
})


# What marks the top of a repository. A scan of a folder holding several (a corpus of sdists, a
# workspace of clones) holds several projects, and one's training does not run another's models.
REPOSITORY_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def marked_folders(paths: Iterable[str]) -> list[str]:
    """The folders holding a repository marker, from the files' common folder down to each file's:
    what the scan's split into repositories is made from (sorted; the paths are absolute)."""
    folders = {os.path.dirname(path) for path in paths}
    if not folders:
        return []
    top = os.path.commonpath(folders)
    ancestors = set()
    for folder in folders:
        while folder not in ancestors and len(folder) >= len(top):
            ancestors.add(folder)
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
    return sorted(
        folder for folder in ancestors
        if any(os.path.exists(os.path.join(folder, marker)) for marker in REPOSITORY_MARKERS)
    )


class TextFacts(NamedTuple):
    """What the text of a file says, for files the prefilter kept from being parsed."""

    imports: list[str]  # the modules it imports
    methods: tuple[str, ...]  # "Class.method" of its top-level classes
    defined: frozenset[str]  # the names it defines at its top level
    defines_model: bool  # a top-level class with a `Module` among its bases
    # it names a CUDA device ("cuda", 'cuda:0') and moves nothing (no `.cuda(`, `.to(`): settings
    names_cuda_device: bool = False


class ProjectLayout:
    """Which file each module name of the scan stands for."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = sorted({os.path.abspath(p) for p in paths})
        self._by_name: dict[str, list[str]] = {}
        self._files = set(self.paths)
        self._texts: dict[str, TextFacts] = {}
        self._text_digests: dict[str, str] = {}
        self._resolved: dict[tuple[str, str], tuple[str, str] | None] = {}
        # method name -> [(file, "Class.method")], filled in from the summaries (derive_facts)
        self.methods: dict[str, list[tuple[str, str]]] = {}
        # field name -> "@file:Class" of the one class the project stores under that name (derive_facts)
        self.fields: dict[str, str] = {}
        # (the summaries it was read from, "@file:Base" -> ["@file:Sub"]) (_subclasses)
        self.subclasses: tuple[dict, dict[str, list[str]]] | None = None
        self._loose_folders: set[str] = set()
        self._libraries: dict[str, bool] = {}
        self._packages_on_disk: dict[str, bool] = {}
        self._repositories: tuple[str, ...] = ()
        self._configs: dict[str, tuple[tuple[str, object], ...]] = {}  # folder -> its YAML settings
        if not self.paths:
            self.root = self.scanned_root = ""
            return
        self.root = os.path.commonpath([os.path.dirname(p) for p in self.paths])
        self.scanned_root = self.root  # (self.root may climb to name packages; nothing is read above this)
        self._repositories = self._outermost_repositories(self.root)
        # The scanned folder may be a package itself (`scan pytorchyolo/`, whose modules import
        # `pytorchyolo.utils.loss`): names start up to a few package levels above it.
        scanned = self.root
        for _ in range(3):
            parent = os.path.dirname(self.root)
            if parent == self.root or not os.path.basename(self.root).isidentifier():
                break
            self.root = parent
        # The scanned folder, when it has no `__init__.py`, is a project folder rather than a
        # package: when it is named like one of its modules (raft/ holding core/raft.py, put on
        # sys.path by the script), `from raft import RAFT` means that module.
        if scanned != self.root and not os.path.isfile(os.path.join(scanned, "__init__.py")):
            parts = os.path.relpath(scanned, self.root).split(os.sep)
            self._loose_folders = {".".join(parts[i:]) for i in range(len(parts))}
        for path in self.paths:
            for name in self.module_names(path):
                self._by_name.setdefault(name, []).append(path)
        self._children: dict[str, list[str]] = {}  # package -> the module names directly in it
        self._packages: set[str] = set()  # every package a module name lies in (`yolox`, `yolox.models`)
        for name in self._by_name:
            package, _, _ = name.rpartition(".")
            if package:
                self._children.setdefault(package, []).append(name)
            parts = name.split(".")
            self._packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    def _outermost_repositories(self, top: str) -> tuple[str, ...]:
        """The repositories the scan holds below its common folder, each with its folder's separator:
        the outermost marked folders (a repository's CUDA extension with a setup.py of its own, or a
        vendored clone, stays part of it). None, the empty tuple, when the common folder is marked
        itself: a scan of one repository is one project."""
        outermost: list[str] = []
        for folder in marked_folders(self.paths):
            if folder == top:
                return ()
            if not any(folder.startswith(known) for known in outermost):
                outermost.append(folder + os.sep)
        return tuple(outermost)

    def repository_of(self, path: str) -> str:
        """The folder of the repository the file lies in: one of the outermost marked folders below
        the scan's common folder, or "" for the rest of the scan."""
        for folder in self._repositories:
            if path.startswith(folder):
                return folder
        return ""

    def is_library(self, path: str) -> bool:
        """Is the file part of a library's own sources (`torch/_inductor/ir.py` in a scan of
        site-packages/torch)? It is analysed as a file of its own: a library's internals are not
        the steps of a project, and following them would only cost time. The name that says so is
        the scan's longest one, or the one Python imports the file by from its outermost package:
        a clone of the library's repository (`diffusers/src/diffusers/models/unet.py`, where `src/`
        is no package) is its sources too."""
        known = self._libraries.get(path)
        if known is None:
            names = self.module_names(path)
            known = bool(names) and (
                names[0].split(".", 1)[0] in self.libraries or self._package_name(path).split(".", 1)[0] in self.libraries
            )
            self._libraries[path] = known
        return known

    def _package_name(self, path: str) -> str:
        """`a.b.c` for `.../a/b/c.py` where a/ and b/ hold an `__init__.py` and a/'s folder does not."""
        stem = os.path.basename(path)[:-3]
        parts = [] if stem == "__init__" else [stem]
        folder = os.path.dirname(path)
        while self._is_package(folder):
            parts.append(os.path.basename(folder))
            parent = os.path.dirname(folder)
            if parent == folder:
                break
            folder = parent
        return ".".join(reversed(parts))

    @functools.cached_property
    def libraries(self) -> frozenset[str]:
        """The LIBRARIES this scan's project does not shadow. A research repository's own `datasets/`
        folder (or `datasets.py`) beside its scripts is what `from datasets.loader import ...` imports
        there: Python puts the script's folder first on sys.path. A library's own sources keep their
        name: they sit in site-packages or a `src/` folder, beside their distribution's metadata, or
        at the top of a checkout with its packaging files or named after them (a clone of
        pytorch-image-models' `timm/`)."""
        named = set()  # (folder, name) of each file or folder named like a library
        for path in self.paths:
            folder, name = os.path.dirname(path), os.path.basename(path)[:-3]
            while True:  # the file itself, then each folder above it, up to the scanned folder's top
                if name in LIBRARIES:
                    named.add((folder, name))
                if not folder.startswith(self.scanned_root) or folder == self.scanned_root:
                    break
                folder, name = os.path.dirname(folder), os.path.basename(folder)
        # (each place read once: a library's own checkout holds thousands of files below its name)
        return LIBRARIES - {name for folder, name in named if self._top_level_of_project(folder, name)}

    def _top_level_of_project(self, folder: str, name: str) -> bool:
        """Is `folder/name` a top-level module or package of a project rather than a library's own?"""
        if self._is_package(folder) or os.path.basename(folder) in ("src", "site-packages", "dist-packages", name):
            return False  # (`timm/timm/`: a clone of the library, in a folder named after it)
        packaging = ("setup.py", "setup.cfg", "pyproject.toml", "PKG-INFO")
        try:
            beside = os.listdir(folder)
            inside = os.listdir(os.path.join(folder, name)) if os.path.isdir(os.path.join(folder, name)) else []
        except OSError:
            return False
        if any(entry in packaging or (entry.startswith(name) and entry.endswith((".dist-info", ".egg-info"))) for entry in beside):
            return False
        # A checkout of the library named after it (`diffusers/src/diffusers/`, `peft/peft/`), not a package
        return not any(entry in packaging or entry == name for entry in inside) and not (
            "src" in inside and os.path.isdir(os.path.join(folder, name, "src", name))
        )

    def _is_package(self, folder: str) -> bool:
        known = self._packages_on_disk.get(folder)
        if known is None:
            known = self._packages_on_disk[folder] = os.path.isfile(os.path.join(folder, "__init__.py"))
        return known

    def module_names(self, path: str) -> list[str]:
        """`root/a/b/c.py` may be imported as `c`, `b.c` or `a.b.c` (whichever folder is on sys.path)."""
        inside = self.root if self.root.endswith(os.sep) else self.root + os.sep
        # The paths are absolute and under the root (as the layout's own are): cut instead of relpath.
        relative = path[len(inside):] if path.startswith(inside) else os.path.relpath(path, self.root)
        parts = relative.split(os.sep)
        parts[-1] = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
        if parts[-1] == "__init__":
            parts.pop()
        return [".".join(parts[i:]) for i in range(len(parts)) if all(p.isidentifier() for p in parts[i:])]

    @functools.cached_property
    def signature(self) -> str:
        """What the layout is made of: equal signatures resolve every name the same way."""
        return repr((self.root, sorted(self._loose_folders), self._repositories, self.paths))

    def config_values(self, path: str) -> tuple[tuple[str, object], ...]:
        """The settings the YAML configuration files of the file's repository agree on (config_files.py)."""
        folder = self.repository_of(path) or self.scanned_root
        if folder not in self._configs:
            self._configs[folder] = read_config_values(folder)
        return self._configs[folder]

    def configs_read(self) -> dict[str, tuple[tuple[str, object], ...]]:
        """What was read from YAML configuration files so far, by folder."""
        return dict(self._configs)

    def text_facts(self, path: str) -> TextFacts:
        return self._read(path)

    def texts_read(self) -> dict[str, tuple[str, TextFacts]]:
        """What was read so far from the text of files (resolving names, skipped files), with the
        digest of the bytes it was read from."""
        return {path: (self._text_digests[path], facts) for path, facts in self._texts.items()}

    def imported_modules(self, path: str) -> list[str]:
        """The modules a file imports, read from its text (for files that were not parsed)."""
        return self._read(path).imports

    def methods_in_text(self, path: str) -> tuple[str, ...]:
        """"Class.method" for the methods of the file's top-level classes, read from its text."""
        return self._read(path).methods

    def _read(self, path: str) -> TextFacts:
        cached = self._texts.get(path)
        if cached is None:
            try:
                with open(path, "rb") as stream:
                    data = stream.read()
            except OSError:
                data = b""
            self._text_digests[path] = content_digest(data)
            # As a text-mode read: undecodable bytes replaced, universal newlines.
            text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
            cached = self._texts[path] = TextFacts(
                imports=[match.group(1) or match.group(2) for match in _IMPORT.finditer(text)],
                methods=_text_methods(text),
                defined=frozenset(match.group(1) or match.group(2) for match in _TOP_LEVEL.finditer(text)),
                defines_model=_MODULE_CLASS.search(text) is not None,
                names_cuda_device=_CUDA_DEVICE_TEXT.search(text) is not None and _MOVE_TEXT.search(text) is None,
            )
        return cached

    @functools.cached_property
    def roots(self) -> frozenset[str]:
        """First parts of the module names a call may enter. A library scanned together with its
        users (torch's own sources, whose tests call into torch) stays a library: its internals are
        not the project's steps."""
        return frozenset(name.split(".", 1)[0] for name in self._by_name) - self.libraries

    def resolve(self, importer: str, target: str) -> tuple[str, str] | None:
        """(file, qualname in it) for a call target, or None when it is not in the project."""
        if target.startswith("*."):
            return self._resolve(importer, target)  # by method name: `methods` changes every round
        key = (importer, target)
        if key not in self._resolved:
            # The files and their names are fixed for the scan: each round asks the same questions.
            self._resolved[key] = self._resolve(importer, target)
        return self._resolved[key]

    def _resolve(self, importer: str, target: str) -> tuple[str, str] | None:
        if target.split(".", 1)[0] in self.libraries:
            return None
        if target.startswith("@"):
            file, _, qualname = target[1:].rpartition(":")
            return (file, qualname) if file in self._files else None
        if target.startswith("*."):
            owners = self.methods.get(target[2:], ())
            if not owners and target[2:] in self.fields:
                # `nets.discriminator(x)`: calling what the project stores under that name, its forward
                file, _, cls = self.fields[target[2:]][1:].rpartition(":")
                return (file, f"{cls}.forward") if file in self._files else None
            return owners[0] if len(owners) == 1 else None
        if target.startswith("&"):
            return self._resolve_star(importer, target)
        if target.startswith("."):
            return self._resolve_relative(importer, target)
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module, qualname = ".".join(parts[:cut]), ".".join(parts[cut:])
            candidates = self._by_name.get(module)
            if module in self._packages and not (module in self._loose_folders and candidates):
                # `yolox` is the package, not yolox/models/yolox.py known by its short name
                candidates = [c for c in candidates or () if os.path.basename(c) == "__init__.py"]
            if candidates:
                # The module nearest the importing file: two projects in one scan both have utils.py.
                best = max(candidates, key=lambda c: (len(os.path.commonpath([c, importer])), c))
                if os.path.basename(best) != "__init__.py" or parts[cut] in self._read(best).defined:
                    return best, qualname
            found = self._reexported(module, qualname)
            if found is not None or (module in self._packages and module not in self._loose_folders):
                # A package of the scan (`yolox.utils`) that does not define the name: the call leaves
                # the scanned files. A shorter cut would only find a module named like the package
                # (yolox/models/yolox.py for `yolox`).
                return found
        return None

    def _resolve_star(self, importer: str, target: str) -> tuple[str, str] | None:
        """"&utils,layers:name": `name` from whichever star-imported module of the scan defines it
        (the last import wins, as in Python)."""
        modules, _, name = target[1:].rpartition(":")
        for module in reversed(modules.split(",")):
            found = self.resolve(importer, f"{module}.{name}")
            if found is not None and name in self._read(found[0]).defined:
                return found
        return None

    def files_in_package(self, package: str) -> list[str]:
        """The files of the modules directly in a package of the scan (none for a plain module)."""
        return [path for child in self._children.get(package, ()) for path in self._by_name[child]]

    def _reexported(self, package: str, qualname: str) -> tuple[str, str] | None:
        """`from model import FasterRCNNVGG16`, where model/__init__.py re-exports it from a submodule
        (or was not scanned): the one module directly in the package that defines it."""
        head = qualname.split(".", 1)[0]
        found = [path for path in self.files_in_package(package) if head in self._read(path).defined]
        return (found[0], qualname) if len(set(found)) == 1 else None

    def _resolve_relative(self, importer: str, target: str) -> tuple[str, str] | None:
        level = len(target) - len(target.lstrip("."))
        base = os.path.dirname(importer)
        for _ in range(level - 1):
            base = os.path.dirname(base)
        parts = target[level:].split(".")
        for cut in range(len(parts) - 1, -1, -1):
            folder = os.path.join(base, *parts[:cut])
            for candidate in (folder + ".py", os.path.join(folder, "__init__.py")):
                if cut and candidate.endswith("/.py"):
                    continue
                if candidate in self._files and cut < len(parts):
                    return candidate, ".".join(parts[cut:])
        return None


def derive_facts(
    layout: ProjectLayout, summaries: dict[str, ModuleSummary], unanalysable: Iterable[str] = ()
) -> dict[str, ProjectFacts]:
    """Every module's facts from the modules' summaries (files without a summary were not analysed
    yet: the prefilter ruled them out; they get facts when another module enters them).
    `unanalysable`: files the project asked for that gave no summary (a syntax error): nothing
    waits for them."""
    # Who has a method of a given name, in order of trust: methods of analysed modules; then methods
    # read from the text of modules the prefilter skipped; then abstract stand-ins (`def set_input(self):
    # pass` in a base class), which a subclass replaces.
    layout.methods = {}
    read: dict[str, list[tuple[str, str]]] = {}
    stand_ins: dict[str, list[tuple[str, str]]] = {}
    for path in layout.paths:
        if path in summaries:
            for qualname, function in summaries[path].functions.items():
                cls, _, method = qualname.rpartition(".")
                if cls:
                    (stand_ins if function.abstract else layout.methods).setdefault(method, []).append((path, qualname))
        else:
            for qualname in layout.methods_in_text(path):
                read.setdefault(qualname.rpartition(".")[2], []).append((path, qualname))
    for fallback in (read, stand_ins):
        for method, owners in fallback.items():
            layout.methods.setdefault(method, owners)
    fields: dict[str, set[str]] = {}
    for path in sorted(summaries):
        for name, cls in summaries[path].field_classes.items():
            # A library's class (`torch.nn.Conv2d`) counts too: the name is then not the project's alone.
            fields.setdefault(name, set()).add(_absolute_class(layout, path, cls) or cls)
    layout.fields = {name: cls for name, (cls, *more) in fields.items() if not more and cls.startswith("@")}
    resolved = {path: list(_resolved_edges(layout, path, summaries)) for path in sorted(summaries)}
    split = (
        _split_cuda_evidence(layout, resolved, summaries) | _inherited_cuda(layout, summaries)
        | _cuda_by_option(layout, summaries) | _cuda_by_settings(layout, summaries)
    )
    cuda = _cuda_closure(resolved, summaries, split)

    # Calls into functions that train, hold a step loop or do a step's work; functions entered per step.
    trains: dict[str, set[str]] = {}
    iterates: dict[str, set[tuple[str, str, int, bool, bool]]] = {}
    returned: dict[str, set[tuple[str, int, bool, bool]]] = {}
    values: dict[str, set[tuple[str, str, object]]] = {}
    loops: dict[str, set[str]] = {}
    work: dict[str, set[str]] = {}
    entered: dict[str, dict[str, str]] = {}
    passed: dict[str, set[tuple[str, str]]] = {}
    selecting: dict[str, set[tuple[str, str, str, object]]] = {}  # option_values, by module
    grad_off: dict[str, dict[str, bool]] = {}  # grad_off_callers, by module
    for path, edges in resolved.items():
        for edge, file, qualname in edges:
            if file != path:
                known = grad_off.setdefault(file, {})
                known[qualname] = known.get(qualname, True) and edge.grad_off
            target = summaries[file].functions.get(qualname) if file in summaries else None
            if target is not None:
                # Callbacks: a function handed to `qualname` for a parameter it calls.
                called = dict(target.called_params)
                for key, callback, does_work, holds_loop in edge.callables:
                    param = _parameter_named(target.params, key)
                    if does_work and not holds_loop:
                        passed.setdefault(file, set()).add((qualname, param))
                    if param in called and called[param].count(" → ") <= MAX_HOPS:
                        entered.setdefault(path, {}).setdefault(callback, called[param])
                        # called with autograd off there (`with torch.no_grad(): evaluate(model, batch)`)
                        known = grad_off.setdefault(path, {})
                        known[callback] = known.get(callback, True) and param in target.grad_off_params
                # What the call passes for the parameters that select arms of the target's code.
                for param in target.options:
                    position = str(target.params.index(param)) if param in target.params else None
                    passed_value = next(((tag, value) for key, tag, value in edge.literals if key in (param, position)), None)
                    if passed_value is None:
                        passed_value = ("default", None)  # left out (or out of sight in `**kwargs`)
                    selecting.setdefault(file, set()).add((qualname, param, *passed_value))
                for known, found in ((trains, target.trains), (loops, target.has_step_loop), (work, target.step_work)):
                    if found:
                        known.setdefault(path, set()).add(edge.target)
                for param, trained, again in target.iterates:
                    position = target.params.index(param) if param in target.params else -1
                    iterates.setdefault(path, set()).add((edge.target, param, position, trained, again))
                for key, value in edge.values:
                    name = _parameter_named(target.params, key)
                    if name in target.loader_settings:
                        values.setdefault(file, set()).add((qualname, name, value))
            for element, trained, again in edge.result_uses:
                returned.setdefault(file, set()).add((qualname, element, trained, again))
            if edge.per_step is not None and edge.per_step.count(" → ") <= MAX_HOPS:
                entered.setdefault(file, {}).setdefault(qualname, edge.per_step)

    # The models of a repository that trains on CUDA: each one's forward may run per step, by a caller
    # the scan cannot follow. The prefilter skips a model file with no step code of its own, so
    # they are asked for first, and entered once all are analysed (the outermost only: which
    # models build which is known then).
    feeding = {layout.repository_of(path) for path, summary in summaries.items() if cuda.get(path) and summary.feeds_models}
    skipped = set(layout.paths) - summaries.keys() - set(unanalysable)
    models_asked = {
        path for path in skipped if layout.repository_of(path) in feeding and layout.text_facts(path).defines_model
    }
    unseen = set() if models_asked else _enter_unseen_models(layout, summaries, resolved, feeding, entered)
    if unseen:
        cuda = _cuda_closure(resolved, summaries, unseen | split)  # and on into what those models call

    # Values (argument and return kinds, classes) only matter where a finding can be: in a module
    # that targets CUDA and runs code per step. Elsewhere they would only stir more rounds.
    # A module the prefilter ruled out counts as active once CUDA reaches it: it is analysed then, and
    # its summary says whether it has step code.
    # A module that builds the DataLoaders step loops elsewhere iterate is active too: the loader rules
    # report there.
    active = {
        path for path in layout.paths
        if cuda.get(path) and (
            path in entered or path in iterates or path in returned or path not in summaries
            or summaries[path].has_step_code
        )
    }
    # The base classes' modules of code with steps, active or not yet: CUDA may come from a base (below).
    stepping = {path for path in summaries if summaries[path].has_step_code}
    reached = {file for path in active for _, file, _ in resolved.get(path, ())} | models_asked | _base_modules(layout, summaries, stepping)
    kinds: dict[str, dict[tuple[str, str], set[str]]] = {}
    classes: dict[str, dict[tuple[str, str], str]] = {}
    returns: dict[str, dict[str, tuple[str, ...]]] = {}
    returned_classes: dict[str, dict[str, str]] = {}
    for path, edges in resolved.items():
        for edge, file, qualname in edges:
            summary = summaries.get(file)
            if path in active and summary is not None and qualname in summary.returns:
                returns.setdefault(path, {})[edge.target] = summary.returns[qualname]
            if path in active and summary is not None and qualname in summary.returned_classes:
                where = _absolute_class(layout, file, summary.returned_classes[qualname])
                if where is not None:
                    returned_classes.setdefault(path, {})[edge.target] = where
            elif path in active and (made := _constructed_class(layout, path, edge, summaries)) is not None:
                returned_classes.setdefault(path, {})[edge.target] = made
            if file not in active:
                continue
            target = summary.functions.get(qualname) if summary is not None else None
            params = target.params if target is not None else ()
            for key, kind in edge.arguments:
                kinds.setdefault(file, {}).setdefault((qualname, _parameter_named(params, key)), set()).add(kind)
            for key, kind in edge.keyword_kinds:
                if target is not None and _into_star_kwargs(target.signature, key):
                    # `meters.update(loss=loss)` into `def update(self, **kwargs)`
                    kinds.setdefault(file, {}).setdefault((qualname, STAR_KWARGS), set()).add(kind)
            for key, cls in edge.classes:
                name = _parameter_named(params, key)
                where = _absolute_class(layout, path, cls)
                if where is not None:
                    classes.setdefault(file, {}).setdefault((qualname, name), where)

    # Modules whose functions train, or hold a step loop that feeds models (not an algorithm's counted
    # loop: every module of kornia imports one through its core utilities).
    training = {
        path for path, summary in summaries.items()
        if any(f.trains or (f.has_step_loop and summary.feeds_models) for f in summary.functions.values())
    }
    # The command-line defaults of the whole project, where every declaration of an option agrees.
    declared: dict[str, set] = {}
    for summary in summaries.values():
        for dest, value in summary.command_line_defaults:
            declared.setdefault(dest, set()).add((type(value), value))
    options = tuple(sorted((dest, value) for dest, ((_, value), *more) in declared.items() if not more))
    facts = {}
    for path in layout.paths:
        facts[path] = ProjectFacts(
            roots=layout.roots,
            trains=frozenset(trains.get(path, ())),
            has_step_loop=frozenset(loops.get(path, ())),
            step_work=frozenset(work.get(path, ())),
            iterates=tuple(sorted(iterates.get(path, ()))),
            returned_uses=tuple(sorted(returned.get(path, ()))),
            argument_values=tuple(sorted(values.get(path, ()), key=repr)),
            entered=tuple(sorted(entered.get(path, {}).items())),
            cuda=bool(cuda.get(path)),
            imports_training=path not in summaries and _imports_training(layout, path, training),
            argument_kinds=tuple(
                (qualname, param, kind) for (qualname, param), found in sorted(kinds.get(path, {}).items())
                for kind in sorted(found)
            ),
            argument_classes=tuple((q, p, c) for (q, p), c in sorted(classes.get(path, {}).items())),
            return_kinds=tuple(sorted(returns.get(path, {}).items())),
            return_classes=tuple(sorted(returned_classes.get(path, {}).items())),
            active=path in active,
            reached=path in reached,
            command_line_defaults=options if path in active else (),
            config_file_values=layout.config_values(path) if path in active else (),
            grad_off_callers=tuple(sorted(grad_off.get(path, {}).items())),
            passed_step_work=tuple(sorted(passed.get(path, ()))),
            option_values=tuple(sorted(selecting.get(path, ()), key=repr)),
        )
    return facts


# Why the forward of a model nobody in the scan is seen to call counts as per-step.
UNSEEN_CALLER = "the forward of a model whose caller the scan cannot follow (a registry, `importlib`, a file not scanned)"


def _enter_unseen_models(layout: ProjectLayout, summaries, resolved, feeding: set[str], entered) -> set[str]:
    """In a project that trains on CUDA, the `forward` of an `nn.Module` that no module of the scan is
    seen to call is still run once per step, by whatever builds the model: a registry
    (`models.__dict__[args.arch]`, `build_model(cfg)`), `importlib.import_module(args.model)` or a
    file outside the scan. Only the outermost such models are entered; what they call follows.
    "Trains" asks for a step loop that feeds models (trains, or draws batches) or a step hook: a
    library's counted loops (kornia's batched RANSAC) run its own algorithms, not the models'. And
    the training must be in the model's own repository, where the scan holds several: `feeding`,
    the repositories with a module on CUDA that feeds models."""
    if not feeding:
        return set()
    found = set()
    # A class another model builds or calls is one of its blocks, reached through it. One that code
    # outside any model builds or calls (a script's `criterion = CRDLoss(opt)`) is an outermost
    # model: where that code's per-step call is followed, its forward is entered already.
    referred = {
        (file, qualname.split(".", 1)[0]) for path, edges in resolved.items() for edge, file, qualname in edges
        if edge.caller_class and _is_torch_module(layout, path, edge.caller_class, summaries)
    }
    for path, summary in summaries.items():
        if layout.is_library(path) or layout.repository_of(path) not in feeding:
            continue
        for qualname in summary.functions:
            cls, _, method = qualname.rpartition(".")
            if method != "forward" or not cls or "." in cls or (path, cls) in referred or cls in summary.classes_made:
                continue
            if qualname in entered.get(path, {}) or not _is_torch_module(layout, path, cls, summaries):
                continue
            entered.setdefault(path, {})[qualname] = UNSEEN_CALLER
            found.add(path)
    return found


def _is_torch_module(layout: ProjectLayout, path: str, cls: str, summaries, depth: int = 0) -> bool:
    summary = summaries.get(path)
    if summary is None or depth > 4:
        return False
    for base in summary.class_bases.get(cls, ()):
        if base in ("torch.nn.Module", "torch.nn.modules.module.Module") or base.endswith("nn.Module"):
            return True
        if base in summary.class_bases and _is_torch_module(layout, path, base, summaries, depth + 1):
            return True
        if "." in base and (hit := layout.resolve(path, f"{base}.__init__")) is not None:
            if _is_torch_module(layout, hit[0], hit[1].rsplit(".", 1)[0], summaries, depth + 1):
                return True
    return False


def _into_star_kwargs(signature: Signature, key: str) -> bool:
    """Does the keyword argument `key` land in the function's `**kwargs`?"""
    return (
        not key.isdigit() and signature.star_kwargs
        and key not in signature.params and key not in signature.keyword_only
    )


def _parameter_named(params: tuple[str, ...], key: str) -> str:
    """The parameter an argument fills: its keyword, or the name at its position ("0" -> "model")."""
    return params[int(key)] if key.isdigit() and int(key) < len(params) else key


def _resolved_edges(layout: ProjectLayout, path: str, summaries: dict[str, ModuleSummary]):
    """(edge, file, qualname) for each call of `path` that enters another scanned module."""
    for edge in summaries[path].edges:
        if edge.target.startswith("*."):
            yield from _by_method_name(layout, path, edge, summaries)
            continue
        if edge.target.endswith("[]"):
            yield from _registry_members(layout, path, edge, summaries)
            continue
        if edge.target.startswith("^"):
            yield from _overrides_elsewhere(layout, path, edge, summaries)
            continue
        made = edge.target.endswith("()")
        hit = layout.resolve(path, edge.target[:-2] if made else edge.target)
        if hit is None or hit[0] == path:
            continue
        file, qualname = hit
        if made:
            if file in summaries and qualname in summaries[file].class_bases:
                # `net = vgg16(classes)` ... `net(x)`: a class named like a function; calling the
                # instance runs its forward (faster-rcnn.pytorch's `class vgg16(_fasterRCNN)`)
                qualname = f"{qualname}.forward"
            else:
                qualname = summaries[file].factories.get(qualname, "") if file in summaries else ""
            if not qualname:
                continue
        if file in summaries:
            if qualname not in summaries[file].functions and f"{qualname}.__init__" in summaries[file].functions:
                qualname = f"{qualname}.__init__"  # `YOLOX(backbone, head)` runs YOLOX.__init__ with them
            file, qualname = _through_bases(layout, file, qualname, summaries)
            if file == path:
                continue
        yield edge, file, qualname


def _overrides_elsewhere(layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]):
    """`self.train_iter(data)` in class C of `path`: the `train_iter` of each subclass of C (at any
    depth) that another module defines and overrides it in."""
    cls, _, method = edge.target[1:].rpartition(".")
    subclasses = _subclasses(layout, summaries)
    todo, seen = [f"@{path}:{cls}"], set()
    while todo:
        for sub in subclasses.get(todo.pop(), ()):
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            file, _, name = sub[1:].rpartition(":")
            if file != path and f"{name}.{method}" in summaries[file].functions:
                yield edge, file, f"{name}.{method}"


def _subclasses(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> dict[str, list[str]]:
    """"@file:Base" -> ["@file:Sub", ...], for the classes of the analysed modules (once per derivation)."""
    cached = layout.subclasses
    if cached is not None and cached[0] is summaries:
        return cached[1]
    found: dict[str, list[str]] = {}
    for file, summary in summaries.items():
        for name, bases in summary.class_bases.items():
            for base in bases:
                where = f"@{file}:{base}" if base in summary.class_bases else _absolute_class(layout, file, base)
                if where is not None:
                    found.setdefault(where, []).append(f"@{file}:{name}")
    layout.subclasses = (summaries, found)
    return found


def _registry_members(layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]):
    """`trainer_dict[cfg.TRAINER](...)` with `trainer_dict` imported from another module: a call of
    each member of that module's dict literal, resolved from there."""
    hit = layout.resolve(path, edge.target[:-2])
    if hit is None:
        return
    file, name = hit
    if file not in summaries:
        # Not analysed (a package's __init__.py with no step code): reached, so the next round reads it.
        yield replace(edge, per_step=None, result_uses=()), file, name
        return
    for member in summaries[file].registries.get(name, ()):
        target = layout.resolve(file, member) if not member.startswith("<local>.") else (file, member[8:])
        if target is None:
            continue
        owner, qualname = target
        if owner in summaries:
            if qualname not in summaries[owner].functions and f"{qualname}.__init__" in summaries[owner].functions:
                qualname = f"{qualname}.__init__"
            owner, qualname = _through_bases(layout, owner, qualname, summaries)
        if owner != path:
            yield edge, owner, qualname


# A method name that more of the project's classes than this define (with a signature the call fits)
# says nothing about which one a call means.
MAX_NAMESAKES = 6


def _by_method_name(layout: ProjectLayout, path: str, edge: CallEdge, summaries: dict[str, ModuleSummary]):
    """A call of a method on an object whose class cannot be known (built by `hydra.utils.instantiate`,
    a registry, `getattr(module, name)(...)`): every method of the project's classes with that name
    whose parameters the call's arguments fit, as call graphs resolve such calls (PyCG's fallback).
    The reach chain says it was resolved by name. A library scanned with the project is left out of a
    project's calls; methods read from the text of a module the prefilter skipped (no signature
    known) count only when they are the one method of that name."""
    method = edge.target[2:]
    owners = layout.methods.get(method, ())
    library = layout.is_library(path)
    fitting = []
    for file, qualname in owners:
        if file == path or (layout.is_library(file) and not library):
            continue
        facts = summaries[file].functions.get(qualname) if file in summaries else None
        if facts is None:
            if len(owners) == 1:
                fitting.append((file, qualname))
            elif edge.per_step is not None:
                # Known from its text only: not entered yet, but reached, so that it is analysed and
                # the next round can tell whether the per-step call fits it.
                yield replace(edge, per_step=None, result_uses=(), by_name=True), file, qualname
        elif not facts.abstract and facts.signature.accepts(edge.positional, edge.keywords):
            fitting.append((file, qualname))
    if not fitting and not owners and method in layout.fields:
        # `nets.discriminator(x)`: calling what the project stores under that name, its forward
        hit = layout.resolve(path, edge.target)
        fitting = [hit] if hit is not None else []
    if len(fitting) > MAX_NAMESAKES:
        return
    for file, qualname in fitting:
        named = edge
        if len(fitting) > 1:  # (one method of that name in the whole project is as good as typed)
            named = replace(edge, by_name=True)
            if edge.per_step is not None:
                named = replace(named, per_step=f"{edge.per_step}, resolved by name to `{qualname}`")
        yield named, file, qualname


def _text_methods(text: str) -> tuple[str, ...]:
    found = []
    owner, indent = None, None
    for line in source_lines(text):  # not splitlines: a form feed does not end a line
        if line[:1] not in ("", " ", "\t", "#", ")", "]", "}", '"', "'"):
            match = _CLASS.match(line)
            owner, indent = (match.group(1) if match else None), None  # a new top-level statement
            continue
        method = _METHOD.match(line) if owner is not None else None
        if method is not None:
            indent = indent or method.group(1)  # the class body's level; nested defs are deeper
            if method.group(1) == indent:
                found.append(f"{owner}.{method.group(2)}")
    return tuple(found)


def _split_cuda_evidence(layout: ProjectLayout, resolved, summaries: dict[str, ModuleSummary]) -> set[str]:
    """Modules whose CUDA evidence is split between them: one module names CUDA (Rainbow's main.py
    sets `args.device = torch.device("cuda")`) and calls into modules that move things to a device
    (agent.py's `.to(device=args.device)`), directly or through other modules. The namer and the
    movers it reaches count as targeting CUDA; unrelated scripts beside them do not, nor do other
    repositories of the scan, nor methods reached by their name alone."""
    found = set()
    for path, summary in summaries.items():
        if not summary.names_cuda or summary.moves_to_device:
            continue  # (a module with both halves decided for itself)
        repository = layout.repository_of(path)
        seen, todo = {path}, [path]
        while todo:
            for edge, file, _ in resolved.get(todo.pop(), ()):
                if file not in seen and not edge.by_name and layout.repository_of(file) == repository:
                    seen.add(file)
                    todo.append(file)
        movers = {file for file in seen if file in summaries and summaries[file].moves_to_device}
        if movers:
            found |= movers | {path}
    return found


def _cuda_by_option(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """The modules that move tensors to a device and declare, or import the module that declares, a
    command-line device option defaulting to CUDA (`parser.add_argument("--device", default="cuda")`
    in args.py, read as `torch.device(args.device)` in main.py, PyTorch-ENet): they run on CUDA
    unless told otherwise. Only those: in a repository of many scripts, one script's option says
    nothing about the others."""
    declaring = {
        path for path, summary in summaries.items()
        if any("device" in dest.lower() and isinstance(value, str) and value.startswith("cuda") for dest, value in summary.command_line_defaults)
    }
    if not declaring:
        return set()
    return {
        path for path, summary in summaries.items()
        if summary.moves_to_device and (path in declaring or _imports_one_of(layout, path, declaring))
    }


def _cuda_by_settings(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """The modules that move tensors to a device and import a module that names a CUDA device but
    neither moves anything nor runs steps: a settings module (Precipitation-Nowcasting's config.py sets
    `cfg.GLOBAL.DEVICE = torch.device("cuda" if ...)`, read as `.to(cfg.GLOBAL.DEVICE)` by the trainer
    and the models). Only a device named by a "cuda" string counts: a helper module that merely seeds
    `torch.cuda` names no device its importers move to."""
    def is_settings(path: str) -> bool:
        summary = summaries.get(path)
        if summary is None:  # a module the prefilter kept from being parsed: what its text says
            return layout.text_facts(path).names_cuda_device
        return summary.names_cuda_device and not summary.moves_to_device and not summary.has_step_code

    found = set()
    for path, summary in summaries.items():
        if not summary.moves_to_device or summary.cuda:
            continue
        for module in layout.imported_modules(path):
            hit = layout.resolve(path, module + ".*")
            if hit is not None and hit[0] != path and is_settings(hit[0]):
                found.add(path)
                break
    return found


def _cuda_closure(resolved, summaries: dict[str, ModuleSummary], sources: set[str] = frozenset()) -> dict[str, bool]:
    """CUDA flows from a module that targets it into the modules it calls per step, hands a device
    to, calls to run their steps (`train_one_epoch(model, optimizer)`), or takes a DataLoader from
    that its step loops then iterate. It also flows up, to a module whose
    steps call into one that targets CUDA itself (train.py's loop calling a trainer whose model is moved
    with `.cuda()`), or that hands such a module the loader its step loop iterates: that loop, that
    loader, drive the GPU. Only up from a module's own evidence, not from what
    flowed down into it: a helper that one CUDA script calls says nothing about its other callers.
    `sources`: modules that count as targeting CUDA besides their own evidence."""
    cuda = {path: summary.cuda or path in sources for path, summary in summaries.items()}

    def drives(edge, file, qualname) -> bool:
        # a per-step call, or a call handing over what the callee's step loop iterates (a loader)
        if edge.by_name:
            return False
        target = summaries[file].functions.get(qualname) if file in summaries else None
        return edge.per_step is not None or (target is not None and bool(target.iterates))

    changed = True
    while changed:
        changed = False
        for path, edges in resolved.items():
            if not cuda.get(path) and any(cuda.get(file) and drives(edge, file, qualname) for edge, file, qualname in edges):
                cuda[path] = True
                changed = True
    changed = True
    while changed:
        changed = False
        for path, edges in resolved.items():
            if not cuda.get(path):
                continue
            for edge, file, qualname in edges:
                if not edge.by_name and not cuda.get(file) and (
                    edge.per_step or edge.passes_device or edge.result_uses or _runs_steps(summaries, file, qualname)
                ):
                    cuda[file] = True
                    changed = True
    return cuda


def _runs_steps(summaries: dict[str, ModuleSummary], file: str, qualname: str) -> bool:
    """Does the called function train or hold a step loop (`train_one_epoch(model, optimizer)`)? Its
    steps run on whatever the CUDA caller hands it: the model it moved, the tensors it made there."""
    target = summaries[file].functions.get(qualname) if file in summaries else None
    return target is not None and (target.trains or target.has_step_loop)


def _imports_training(layout: ProjectLayout, path: str, training: set[str]) -> bool:
    """A file the prefilter ruled out that imports a module whose functions train or hold a step loop:
    its loop may be a step loop through them (`for batch in stream: engine.train_step(batch)`), an epoch
    loop handing them the loaders it builds (`train(epoch, train_loader, model)`), or, loop or not, it
    hands them loaders once (StarGAN's main.py: `Solver(celeba_loader, ...)`)."""
    return _imports_one_of(layout, path, training) or any(
        file in training for module in layout.imported_modules(path) for file in layout.files_in_package(module)
    )  # (the second: `from models import create_model`, a package)


def _imports_one_of(layout: ProjectLayout, path: str, files: set[str]) -> bool:
    """Does the file import (by its text) a module that is one of `files`?"""
    return any(
        (hit := layout.resolve(path, module + ".*")) is not None and hit[0] in files
        for module in layout.imported_modules(path)
    )


def _module_bases(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> dict[str, set[str]]:
    """Module -> the other modules defining project classes its classes derive from directly (read
    from _subclasses: through analysed modules, so a base module not analysed yet ends a chain)."""
    found: dict[str, set[str]] = {}
    for base, subs in _subclasses(layout, summaries).items():
        base_file = base[1:].rpartition(":")[0]
        for sub in subs:
            sub_file = sub[1:].rpartition(":")[0]
            if sub_file != base_file:
                found.setdefault(sub_file, set()).add(base_file)
    return found


def _project_bases(module_bases: dict[str, set[str]], path: str) -> set[str]:
    """The modules of `path`'s classes' project base classes, at any depth."""
    found: set[str] = set()
    todo = [path]
    while todo:
        for file in module_bases.get(todo.pop(), ()):
            if file != path and file not in found:
                found.add(file)
                todo.append(file)
    return found


def _base_modules(layout: ProjectLayout, summaries: dict[str, ModuleSummary], paths: set[str]) -> set[str]:
    """Modules whose classes the classes of `paths` derive from: reached, so that a base class's module
    the prefilter skipped (st-gcn's `IO`, which sets `self.dev = "cuda:0"`) is analysed."""
    module_bases = _module_bases(layout, summaries)
    return {file for path in paths for file in _project_bases(module_bases, path)}


def _inherited_cuda(layout: ProjectLayout, summaries: dict[str, ModuleSummary]) -> set[str]:
    """Modules whose classes derive from a class of a module that targets CUDA itself: what the base
    class sets up (`self.dev = "cuda:0"`, `self.model.to(self.dev)`) is the subclass's too, so its
    `data.to(self.dev)` in another module is a copy to the GPU."""
    module_bases = _module_bases(layout, summaries)
    return {
        path for path in module_bases
        if not summaries[path].cuda
        and any(summaries[base].cuda for base in _project_bases(module_bases, path) if base in summaries)
    }


def _constructed_class(layout: ProjectLayout, caller: str, edge: CallEdge, summaries: dict[str, ModuleSummary]) -> str | None:
    """"@file:Class" when the edge calls a class of another module by its imported name, whatever its
    case (faster-rcnn's `fasterRCNN = vgg16(imdb.classes)`, `class vgg16(_fasterRCNN)`): the call
    makes an instance of it."""
    if edge.target[:1] in "^*&@<" or edge.target.endswith(("()", "[]")):
        return None
    hit = layout.resolve(caller, edge.target)
    if hit is None or hit[0] == caller or hit[0] not in summaries:
        return None
    file, qualname = hit
    return f"@{file}:{qualname}" if qualname in summaries[file].class_bases else None


def _absolute_class(layout: ProjectLayout, caller: str, cls: str) -> str | None:
    """"@file:Class" for a class named in `caller` ("models.Net" imported, "<local>.Net" its own)."""
    if cls.startswith("@"):
        return cls
    if cls.startswith("<local>."):
        return f"@{caller}:{cls[8:]}"
    hit = layout.resolve(caller, cls + ".__init__")
    if hit is None:
        return None
    file, qualname = hit
    return f"@{file}:{qualname.rsplit('.', 1)[0]}"


def _through_bases(
    layout: ProjectLayout, file: str, qualname: str, summaries: dict[str, ModuleSummary], depth: int = 0
) -> tuple[str, str]:
    """`Net.forward` where Net inherits `forward` from a base class: the file and qualname that define
    it, in the same module or in the module a base class is imported from (faster-rcnn's
    `FasterRCNNVGG16.predict`, defined by `model.faster_rcnn.FasterRCNN`)."""
    summary = summaries.get(file)
    if summary is None or qualname in summary.functions or depth > 5:
        return file, qualname
    cls, _, method = qualname.rpartition(".")
    if method == "forward" and f"{cls}.__call__" in summary.functions:
        return file, f"{cls}.__call__"
    for base in summary.class_bases.get(cls, ()):
        if base in summary.class_bases:
            found = _through_bases(layout, file, f"{base}.{method}", summaries, depth + 1)
        elif "." in base and (hit := layout.resolve(file, f"{base}.{method}")) is not None and hit[0] != file:
            found = _through_bases(layout, *hit, summaries, depth + 1)
        else:
            continue
        defined = summaries[found[0]].functions if found[0] in summaries else layout.methods_in_text(found[0])
        if found[1] in defined:
            return found  # (a module the prefilter skipped is read from its text; entering it gets it analysed)
    return file, qualname
