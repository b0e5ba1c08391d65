"""A module's `ModuleSummary`, read from its per-step model and tensor kinds once it is analysed."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import libcst as cst

from loopaudit.analysis.argument_values import CPU_COUNT, At, declared_defaults, setting_value
from loopaudit.analysis.cross_module import CallEdge, FunctionFacts, ModuleSummary
from loopaudit.analysis.device import names_cuda
from loopaudit.analysis.distributed import sets_sampler_epoch, wraps_ddp
from loopaudit.analysis.module_index import FrameKind, ModuleIndex
from loopaudit.analysis.names import dotted_name
from loopaudit.analysis.options import UNREAD, literal
from loopaudit.analysis.stepmodel import StepModel
from loopaudit.analysis.tensors import TensorInference
from loopaudit.analysis.walk import iter_subtree

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopaudit.analysis.module_index import CallSite, Frame, FunctionInfo, Scope
    from loopaudit.analysis.stepmodel import StepReason

    _Describe = Callable[[StepReason, cst.Call], str]


def summarize(
    index: ModuleIndex, steps: StepModel, tensors: TensorInference, cuda: bool, describe: _Describe
) -> ModuleSummary:
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
    for site, target in ((call, target) for call in index.calls for target in steps.external_targets(call)):
        if not facts.reaches_project(target):
            continue
        reason = steps.reason(site.frame)
        if (
            target.startswith("*")
            and reason is None
            and site.frame.innermost_loop() is None
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
            (
                arg.keyword.value if arg.keyword is not None else str(position),
                function.qualname,
                steps.function_does_step_work(function),
                steps.has_step_loop(function),
            )
            for position, arg in enumerate(site.call.args)
            if not arg.star
            for function in steps.local_functions(arg.value, site.scope)[:1]
        )
        literals = tuple(
            (
                arg.keyword.value if arg.keyword is not None else str(position),
                "unread" if value is UNREAD else "=",
                None if value is UNREAD else value,
            )
            for position, arg in enumerate(site.call.args)
            if not arg.star
            for value in (literal(arg.value),)
        )
        edges.append(
            CallEdge(
                target,
                per_step,
                _passes_device(site.call),
                tuple(arguments),
                tuple(classes),
                _result_uses(steps, site),
                tuple(values),
                _outermost_class(site.frame),
                -1 if starred else sum(1 for arg in site.call.args if arg.keyword is None),
                tuple(arg.keyword.value for arg in site.call.args if arg.keyword is not None),
                callables=callables,
                literals=literals,
                grad_off=steps.under_no_grad(site.frame),
                keyword_kinds=tuple(
                    (arg.keyword.value, tensors.shown_kind_at(arg.value, site.scope, site.frame).value)
                    for arg in site.call.args
                    if arg.keyword is not None
                ),
            )
        )
    step_loops = [loop for loop in index.loops if steps.is_step_loop(loop)]
    has_hook = any(steps.hook_name(function) is not None for function in index.functions)
    feeds_models = has_hook or any(
        steps.loop_trains(loop)
        or steps.fetches_batch(loop)
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
        site.call.func.value
        for site in index.calls
        if isinstance(site.call.func, cst.Name) and site.call.func.value in index.classes
    )
    registries = {name: members for name in index.module_scope.assignments if (members := steps.registry(name))}
    return ModuleSummary(
        functions,
        bases,
        tuple(edges),
        cuda,
        returns,
        factories,
        bool(step_loops) or has_hook,
        returned_classes,
        _field_classes(index, steps),
        classes_made,
        feeds_models,
        names_cuda=names_cuda(index),
        names_cuda_device=bool(index.cuda_strings),
        moves_to_device=index.moves_to_device,
        registries=registries,
        wraps_ddp=wraps_ddp(index),
        sets_sampler_epoch=sets_sampler_epoch(index),
        command_line_defaults=tuple(
            sorted(
                (dest, value)
                for dest, value in declared_defaults(At(index.module_scope, index, steps)).items()
                if type(value) in (int, bool)
                or value == CPU_COUNT
                or (type(value) is str and "device" in dest.lower() and value.startswith(("cuda", "cpu")))
            )
        ),
    )


def _outermost_class(frame: Frame | None) -> str:
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


def _result_uses(steps: StepModel, site: CallSite) -> tuple[tuple[int, bool, bool], ...]:
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


def _returned_on(steps: StepModel, scope: Scope, name: str) -> list[tuple[bool, bool]]:
    """(trains, again) of the step loops elsewhere that iterate what the function of `scope` returns,
    where it returns `name` (whole, or as an element of a returned tuple)."""
    function = steps.function_info(scope.function) if scope.function is not None else None
    if function is None:
        return []
    return steps.returned_uses_of(function, lambda expr: isinstance(expr, cst.Name) and expr.value == name)


def _function_facts(steps: StepModel, function: FunctionInfo, describe: _Describe) -> FunctionFacts:
    called: dict[str, str] = {}
    grad_off: dict[str, bool] = {}
    for site in function.all_calls:
        parameter = steps.called_parameter(site)
        reason = steps.reason(site.frame) if parameter is not None and parameter[0] is function else None
        if reason is not None:
            param = cast("tuple[FunctionInfo, str]", parameter)[1]  # (a reason: a parameter's call)
            called.setdefault(param, describe(reason, site.call))
            grad_off[param] = grad_off.get(param, True) and steps.under_no_grad(site.frame)
    return FunctionFacts(
        steps.trains(function),
        steps.has_step_loop(function),
        steps.function_does_step_work(function),
        function.positional_params,
        steps.iterated_params(function),
        _settings_params(steps, function),
        _is_abstract(function),
        function.signature,
        tuple(sorted(called.items())),
        steps.option_params(function),
        tuple(sorted(param for param, off in grad_off.items() if off)),
        steps.communication_helper(function) or "",
    )


def _is_abstract(function: FunctionInfo) -> bool:
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
            if isinstance(small, cst.Expr) and isinstance(
                small.value, (cst.SimpleString, cst.ConcatenatedString, cst.Ellipsis)
            ):
                continue
            if (
                isinstance(small, cst.Raise)
                and small.exc is not None
                and "NotImplementedError" in _raised_name(small.exc)
            ):
                continue
            return False
    return True


def _raised_name(exc: cst.BaseExpression) -> str:
    return dotted_name(exc.func if isinstance(exc, cst.Call) else exc) or ""


def _settings_params(steps: StepModel, function: FunctionInfo) -> tuple[str, ...]:
    """The parameters that are settings the rules read: handed straight to a DataLoader
    (`DataLoader(ds, num_workers=workers)`), or setting a loop's cadence (`(i + 1) % update_freq == 0`,
    gradient accumulation's factor)."""
    params = function.scope.params
    found: set[str] = {
        node.right.value
        for node in iter_subtree(function.node.body)
        if isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Modulo)
        and isinstance(node.right, cst.Name)
        and node.right.value in params
    }
    for site in function.all_calls:
        qualified = steps.index.imports.qualify(site.call.func) or ""
        if qualified.endswith("DataLoader"):
            found.update(
                arg.value.value
                for arg in site.call.args
                if isinstance(arg.value, cst.Name) and arg.value.value in params
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
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value in ("cuda", "to")
        ):
            return True
        while isinstance(node, cst.Attribute):
            if "device" in node.attr.value or node.attr.value in ("gpu", "local_rank"):
                return True
            node = node.value
        if isinstance(node, cst.Name) and ("device" in node.value or node.value in ("gpu", "local_rank")):
            return True
    return False
