"""The vocabulary of training code: what a training call, a periodic guard, a loader and a step
counter look like. Everything name-based that the per-step model relies on lives here, so it can be
read, and tuned, in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst

from loopaudit.analysis.names import ImportTable, dotted_name, param_default, stored_name, terminal_name
from loopaudit.analysis.walk import iter_subtree

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Protocol

    # What next_of reads of a scope: module_index's Scope, Binding and ClassInfo, which this module
    # does not import (module_index imports it).
    class _Binding(Protocol):
        @property
        def value(self) -> cst.BaseExpression: ...

    class _Class(Protocol):
        @property
        def attributes(self) -> Mapping[str, Sequence[_Binding]]: ...

    class _Scope(Protocol):
        @property
        def owner_class(self) -> _Class | None: ...
        def lookup(self, name: str) -> tuple[Sequence[_Binding], object] | None: ...


# `optimizer.step()`, `opt_g.step()`, `self.optim.step()`, `scaler.step(optimizer)`; not a scheduler.
_OPTIMIZER_NAME = re.compile(r"(?i)(optim|^opt(_|$)|_opt$|^opt\d|scaler)")
_SCHEDULER_NAME = re.compile(r"(?i)sched")

# Names of iterables that yield batches: train_loader, dataloaders[phase], self.val_dl, batches.
# torchtext's iterators go by train_iter / val_iter. `batch_iteration` counts, it yields nothing.
LOADER_NAME = re.compile(
    r"(?i)(loader|^dl$|_dl$|^dl_|data_?iter(?!ation)|batch_?iter(?!ation)|prefetcher|^batch_generator$"
    r"|^(train|val|valid|validation|test|eval|dev)_?iter(ator)?$)"
)
# Loop variables that count steps: `for step in ...`, `for it in ...`, `for batch_idx in ...`.
STEP_VARIABLE = re.compile(
    r"(?i)^(step|steps|it|iter|iteration|itr|i_?iter|iter_?num|global_step|.*_step|step_.*|"
    r"batch_?idx|batch_?i|batch_?num|i_?batch|update|n_?update)$"
)
# Bounds that count steps: `range(max_steps)`, `range(eval_iters)`, `while iter_num < max_iters`.
STEP_BOUND = re.compile(r"(?i)(steps$|iters$|max_iter|iterations$|batches$|updates$|iter_?num|global_step)")
# Callees that do a step's work when called: a forward pass (`model(x)`, `self.net(x)`, `forward_lip(x)`,
# `criterion(out, y)`) or fetching a batch (`next(it)`, `get_batch("train")`).
FORWARD_CALLEE = re.compile(
    r"(?i)(model|net$|network|^forward_|criterion|loss_?fn|loss_?func|lossfn|loss_fct|encoder|decoder|"
    r"classifier|backbone|generator|discriminator|^netg$|^netd$|critic|actor|policy|^module$|^ddp|^self$)"
)
# Functions that make, load or unwrap a model rather than run one: `unwrap_model(unet)`,
# `get_model(cfg)`, `build_encoder(...)` return a module, not a tensor.
_MAKES_A_MODEL = re.compile(
    r"(?i)^_?(get|load|build|create|make|init|unwrap|wrap|prepare|setup|define|instantiate|save|freeze|count)_"
)


def calls_a_model(name: str) -> bool:
    """Is a call of `name` a forward pass (`model(x)`, `self.criterion(out, y)`), not a factory?"""
    return bool(FORWARD_CALLEE.search(name)) and not _MAKES_A_MODEL.match(name)


# Methods that run a model other than through its forward: `model.predict(...)`, `model.encode(img)`.
# torch functions that make a new tensor from sizes or a range: on the host unless given `device=`.
TORCH_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "arange", "linspace", "logspace", "rand", "randn", "randint", "randperm", "eye"}
)
# torch functions that make a tensor from the data they are given.
TORCH_CONVERSIONS = frozenset({"tensor", "as_tensor", "asarray", "from_numpy"})

_INFERENCE_METHODS = frozenset({"predict", "inference", "infer", "encode", "decode", "generate", "reconstruct"})
# Receivers whose `encode`/`decode` turn text or labels into ids and back: a tokenizer, a CTC decoder.
_CODER = re.compile(r"(?i)((^|_)(en|de)coder$|^(enc|dec)$|token)")


def is_inference_method(method: str) -> bool:
    return method in _INFERENCE_METHODS


def runs_a_model(call: cst.Call) -> bool:
    """`model(x)`, `self.net(x)`, or an inference method called on a model: `model.predict(u, seq)`,
    `self.netG.inference(label)`, `model.encode(img)` (not `decoder.decode(out, sizes)`, a CTC decoder's)."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in _INFERENCE_METHODS:
        receiver = terminal_name(func.value) or ""
        if func.attr.value in ("encode", "decode") and _CODER.search(receiver):
            return False
        return calls_a_model(receiver)
    return calls_a_model(terminal_name(func) or "")


# Functions that evaluate: `evaluate`, `validate`, `test`, `eval_epoch`, `run_validation`, nanoGPT's
# `estimate_loss`. Not pytest's `test_*` functions, which test code rather than a model.
EVALUATION_FUNCTION = re.compile(
    r"(?i)^_?(run_)?(val|valid|validate|validation|eval|evaluate|evaluation|test|testing|estimate_loss)"
    r"(_(one_)?(epoch|model|loop|loss|accuracy|step))?$|^_?(eval|evaluate|validate)_\w+$"
)


BATCH_FETCH = re.compile(r"(?i)^(next|get_batch|get_batches|sample_batch|next_batch|fetch_batch|load_batch)$")
_EPOCH = re.compile(r"(?i)epoch")

# Names that, used in an `if` test, make it a periodic guard: intervals, frequencies, "should log".
PERIODIC_NAME = re.compile(
    r"(?i)(interval|_every$|^every_|freq|frequency|period|should_(log|eval|save|print|checkpoint)|"
    r"is_last|last_step|last_batch|do_(eval|log|save))"
)
_TIME_FUNCTIONS = {"time", "perf_counter", "monotonic", "process_time"}


def next_of(call: cst.BaseExpression, scope: _Scope | None = None) -> cst.BaseExpression | None:
    """The iterator a call advances: `it` in `next(it)`, `next(it, None)`, and, given the call's scope,
    `it.next()` (the Python 2 spelling FixMatch keeps) or `it.__next__()` where `it = iter(...)`; not
    a `next()` method of some object (YOLOX's `self.prefetcher.next()`, which hands back device
    tensors). None for any other call."""
    if not isinstance(call, cst.Call):
        return None
    func = call.func
    if isinstance(func, cst.Name) and func.value == "next" and call.args and not call.args[0].star:
        return call.args[0].value
    if (
        scope is not None
        and isinstance(func, cst.Attribute)
        and func.attr.value in ("next", "__next__")
        and not call.args
    ):
        receiver = func.value
        if isinstance(receiver, cst.Name):
            found = scope.lookup(receiver.value)
            values = [b.value for b in found[0]] if found else []
        elif (
            isinstance(receiver, cst.Attribute)
            and isinstance(receiver.value, cst.Name)
            and receiver.value.value == "self"
        ):
            owner = scope.owner_class  # `self.val_iter = iter(self.val_loader)` in another method (monodepth2)
            values = [b.value for b in owner.attributes.get(receiver.attr.value, ())] if owner is not None else []
        else:
            values = []
        if values and all(
            isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value == "iter" for v in values
        ):
            return func.value
    return None


def is_training_call(call: cst.Call, imports: ImportTable) -> bool:
    """Does this call train: `loss.backward()`, `optimizer.step()`, `scaler.step(opt)`, or
    `torch.autograd.grad(loss, params)` (TRPO's natural gradient, a hand-written update)?"""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if imports.qualify(func) in ("torch.autograd.grad", "torch.autograd.backward"):
        return True
    method = func.attr.value
    if method == "backward":
        return True
    if method == "step":
        receiver = terminal_name(func.value)
        if receiver is None and isinstance(func.value, cst.Call):
            receiver = terminal_name(func.value.func)  # self.optimizers().step()
        if receiver is None:
            return False
        return bool(_OPTIMIZER_NAME.search(receiver)) and not _SCHEDULER_NAME.search(receiver)
    return False


def _names_in(node: cst.CSTNode) -> list[str]:
    """Identifiers a condition mentions: the terminal names of names and attributes."""
    found: list[str] = []
    for n in iter_subtree(node):
        if isinstance(n, cst.Name):
            found.append(n.value)
        elif isinstance(n, cst.Attribute):
            found.append(n.attr.value)
    return found


def _is_step_counter(expr: cst.BaseExpression, loop_variables: set[str]) -> bool:
    name = terminal_name(expr)
    if name is None:
        return False
    return name in loop_variables or bool(STEP_VARIABLE.match(name)) or bool(_EPOCH.search(name))


def is_periodic_test(
    test: cst.BaseExpression, loop: cst.For | cst.While | None, extra_names: frozenset[str] = frozenset()
) -> bool:
    """Is `if <test>:` a guard that lets its body run only every so often?

    Periodic: a modulo (`step % log_interval == 0`, `not (i + 1) % N`), an equality with a step
    counter (`if step == 0`, `if i == len(loader) - 1`), an interval-like name
    (`if should_log`, `if step_in_interval`), or a wall-clock check (`if time.time() - t0 > 60`).
    """
    loop_variables = loop_target_names(loop) if loop is not None else set()
    for n in iter_subtree(test):
        if isinstance(n, cst.BinaryOperation):
            if isinstance(n.operator, cst.Modulo) and not isinstance(
                n.left, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
            ):
                return True
        elif isinstance(n, cst.Comparison):
            operands = [n.left, *(target.comparator for target in n.comparisons)]
            if any(isinstance(target.operator, cst.Equal) for target in n.comparisons) and any(
                _is_step_counter(operand, loop_variables) for operand in operands
            ):
                return True
            if _is_first_n_guard(n, loop_variables):
                return True
        elif isinstance(n, cst.Name):
            if PERIODIC_NAME.search(n.value) or n.value in extra_names:
                return True
        elif isinstance(n, cst.Attribute):
            if PERIODIC_NAME.search(n.attr.value) or n.attr.value in extra_names:
                return True
        elif isinstance(n, cst.Call) and terminal_name(n.func) in _TIME_FUNCTIONS:
            return True
    return False


def _is_first_n_guard(comparison: cst.Comparison, loop_variables: set[str]) -> bool:
    """`if i < 4:`, `if batch_idx <= 2:`, `if 10 > step:`: a step counter below a number written in
    the code lets the body run for the first few steps only (showing a few images, a warm-up check)."""
    if len(comparison.comparisons) != 1:
        return False
    target = comparison.comparisons[0]
    left, right, operator = comparison.left, target.comparator, target.operator
    if isinstance(operator, (cst.GreaterThan, cst.GreaterThanEqual)):
        left, right = right, left
    elif not isinstance(operator, (cst.LessThan, cst.LessThanEqual)):
        return False
    return (
        isinstance(right, cst.Integer)
        and _is_step_counter(left, loop_variables)
        and not _EPOCH.search(terminal_name(left) or "")
    )


def is_rare_branch(body: cst.BaseSuite, in_loop: bool = True) -> bool:
    """An `if` body that leaves the loop, the function or the program (raise, break, return, exit):
    on the per-step path it runs at most once, so it is not per-step. `in_loop`: the `if` is inside a
    loop of its function. Outside one, a `return` ends only this call: in a helper called once per
    step (`if isinstance(x, Tensor): return x.cpu()`), that branch is as per-step as the rest."""
    if not isinstance(body, cst.IndentedBlock) or not body.body:
        statements = getattr(body, "body", ())
    else:
        statements = body.body
    if not statements:
        return False
    last = statements[-1]
    small = last.body if isinstance(last, cst.SimpleStatementLine) else ()
    for statement in small:
        if isinstance(statement, (cst.Raise, cst.Break)) or (in_loop and isinstance(statement, cst.Return)):
            return True
        if isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
            name = terminal_name(statement.value.func)
            if name in {"exit", "_exit", "abort"}:
                return True
    return False


# Flags that switch on debugging output: code under them does not run in a normal training run.
_DEBUG_FLAG = re.compile(
    r"(?i)^(debug|debugging|debug_\w+|verbose|vis|visualize|visualise|visualization|plot|show|display)$"
)


def is_debug_test(test: cst.BaseExpression, function: cst.FunctionDef | None = None) -> bool:
    """`if args.debug:`, `if opt.debug > 0:`, `if self.verbose:`, `if vis:`: a branch taken only when
    the user asks for debugging output (issue 23 chose: not per-step, so not reported). A test that
    mixes in anything else (`if debug or step % 10 == 0`) is not one; one that narrows a debug flag
    (`if args.debug_loss and "filenames" in batch`) still is."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return is_debug_test(test.left, function) or is_debug_test(test.right, function)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        test = test.left
    if isinstance(test, cst.Name) and _on_by_default(test.value, function):
        return False  # `def fit(..., verbose=1)`: `if verbose > 0:` is what a normal run does
    if isinstance(test, (cst.Name, cst.Attribute)):
        name = terminal_name(test)
        return name is not None and _DEBUG_FLAG.match(name) is not None
    return False


def _on_by_default(name: str, function: cst.FunctionDef | None) -> bool:
    """Does `function` declare parameter `name` with a default that is on (`verbose=1`, `vis=True`)?"""
    default = param_default(function, name)
    return (isinstance(default, cst.Name) and default.value == "True") or (
        isinstance(default, cst.Integer) and default.evaluated_value != 0
    )


# Devices other than CUDA, as `torch.device(...).type` names them, and the flags scripts keep for them.
_OTHER_DEVICES = frozenset({"cpu", "npu", "xpu", "mps", "hpu", "mlu", "tpu", "xla", "musa"})
_OTHER_DEVICE_FLAG = re.compile(r"(?i)^(is|use|on|using)_(cpu|npu|xpu|mps|hpu|mlu|tpu|xla|musa)$")


def fills_a_cache(
    node: cst.If,
    setters: Callable[[], dict[str, frozenset[str]]],
    params: set[str] | frozenset[str] = frozenset(),
) -> bool:
    """`if pixel_coords is None or pixel_coords.size(2) < h: set_id_grid(depth)` (SfmLearner), `if
    self.grid is None: self.grid = make_grid(...)`: a branch that fills a cached value the test finds
    missing. It runs once (or when the shape changes), not once per step. The body must assign the
    tested name itself, or call a function of the module that sets it as a global (`setters()`:
    function name -> the globals it declares, asked only then). A parameter defaulting to None is no
    cache: `if states is None: states = torch.zeros(...)` builds it anew on every call that passes
    none (`params`: the enclosing function's parameters)."""
    missing = set()
    for found in iter_subtree(node.test):
        if (
            isinstance(found, cst.Comparison)
            and len(found.comparisons) == 1
            and isinstance(found.comparisons[0].operator, cst.Is)
            and isinstance(found.comparisons[0].comparator, cst.Name)
            and found.comparisons[0].comparator.value == "None"
        ):
            name = stored_name(found.left)
            if name is not None and name not in params:
                missing.add(name)
    if not missing:
        return False
    called = []
    for found in iter_subtree(node.body):
        if isinstance(found, (cst.Assign, cst.AnnAssign)):
            targets = [t.target for t in found.targets] if isinstance(found, cst.Assign) else [found.target]
            if any(stored_name(t) in missing for t in targets):
                return True
        elif isinstance(found, cst.Call) and isinstance(found.func, cst.Name):
            called.append(found.func.value)
    if not called:
        return False
    known = setters()
    return any(known.get(name, frozenset()) & missing for name in called)


def is_other_device_test(test: cst.BaseExpression) -> bool:
    """`if mode == "cpu":`, `elif device.type == 'npu':`, `if self.is_npu:`, `if not
    torch.cuda.is_available():`, `if torch.backends.mps.is_available():`: a branch that a run on a CUDA
    GPU does not take (YOLOX's CPU fallback after an out-of-memory error, timm's NPU branches)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = test.expression
        return isinstance(inner, cst.Call) and dotted_name(inner.func) in (
            "torch.cuda.is_available",
            "cuda.is_available",
        )
    if isinstance(test, cst.Call):
        name: str | None  # (terminal_name below may give None)
        name = dotted_name(test.func) or ""
        parts = name.split(".")
        return name.endswith(".is_available") and any(part in _OTHER_DEVICES for part in parts[:-1])
    if isinstance(test, (cst.Name, cst.Attribute)):
        name = terminal_name(test)
        return name is not None and _OTHER_DEVICE_FLAG.match(name) is not None
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.Is)):
        return False
    sides = (test.left, target.comparator)
    return any(isinstance(side, cst.SimpleString) and side.evaluated_value in _OTHER_DEVICES for side in sides)


def runs_once(node: cst.For | cst.While) -> bool:
    """A loop whose body always ends by leaving it (`return`, `break`, `raise` as its last statement,
    outside any `if`) runs its body at most once: `for x, y in loader: ...; return elapsed`."""
    return is_rare_branch(node.body)


def loop_target_names(node: cst.For | cst.While) -> set[str]:
    if not isinstance(node, cst.For):
        return set()
    return {n for n in _names_in(node.target)}


def unwrap_iterable(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """`enumerate(tqdm(loader))` -> [loader]; `zip(a_loader, b_loader)` -> both.

    Any call wrapping positional arguments is looked through (enumerate, tqdm, zip, islice,
    `metric_logger.log_every(loader, ...)`), except `len` and `range`, which turn a loader into a count;
    so are both arms of `tqdm(loader) if rank == 0 else loader`.
    """
    if isinstance(expr, cst.IfExp):
        return [expr, *unwrap_iterable(expr.body), *unwrap_iterable(expr.orelse)]
    if isinstance(expr, cst.Call):
        name = terminal_name(expr.func)
        if name in {"len", "range"}:
            return []
        inner = [arg.value for arg in expr.args if arg.keyword is None and not arg.star]
        found: list[cst.BaseExpression] = [expr]
        for arg in inner:
            found.extend(unwrap_iterable(arg))
        return found
    return [expr]


def mentions_step_bound(node: cst.CSTNode) -> bool:
    return any(STEP_BOUND.search(name) and not _EPOCH.search(name) for name in _names_in(node))


def is_step_variable(name: str) -> bool:
    return bool(STEP_VARIABLE.match(name)) and not _EPOCH.search(name)


@dataclass(frozen=True)
class TypeTest:
    """What an `if` test says of a name's type (type_test)."""

    subject: str  # the name tested
    types: tuple[str, ...]  # the types, as written (`torch.Tensor`, `list`); "" for one that is no name
    holds: bool  # the test passes when the name is of one of them (False: when it is of none)


def type_test(test: cst.BaseExpression) -> TypeTest | None:
    """`isinstance(x, T)`, `isinstance(x, (A, B))`, `torch.is_tensor(x)`, `type(x) is T`, `type(x) == T`,
    `type(x) in (A, B)`, and their negations (`not isinstance(...)`, `type(x) is not T`, `type(x) != T`,
    `type(x) not in [A, B]`), for a plain name `x`; None for any other test."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = type_test(test.expression)
        return TypeTest(inner.subject, inner.types, not inner.holds) if inner is not None else None
    if isinstance(test, cst.Call) and test.args and isinstance(test.args[0].value, cst.Name):
        subject = test.args[0].value.value
        if isinstance(test.func, cst.Name) and test.func.value == "isinstance" and len(test.args) == 2:
            return TypeTest(subject, _type_names(test.args[1].value), True)
        if (dotted_name(test.func) or "").endswith(".is_tensor") and len(test.args) == 1:
            return TypeTest(subject, ("torch.Tensor",), True)
        return None
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.left, cst.Call)
        and isinstance(test.left.func, cst.Name)
        and test.left.func.value == "type"
        and len(test.left.args) == 1
        and isinstance(test.left.args[0].value, cst.Name)
    ):
        operator = test.comparisons[0].operator
        if isinstance(operator, (cst.Is, cst.Equal, cst.In, cst.IsNot, cst.NotEqual, cst.NotIn)):
            holds = isinstance(operator, (cst.Is, cst.Equal, cst.In))
            return TypeTest(test.left.args[0].value.value, _type_names(test.comparisons[0].comparator), holds)
    return None


def _type_names(types: cst.BaseExpression) -> tuple[str, ...]:
    named = [e.value for e in types.elements] if isinstance(types, (cst.Tuple, cst.List)) else [types]
    return tuple(dotted_name(t) or "" for t in named)
