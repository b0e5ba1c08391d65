"""One traversal of a parsed module that records everything the analysis needs.

The walk never decides anything itself. It records:
- frames: where each node sits (which function, which loop body, which `if` branch, which handler);
- loops and functions with the training evidence and the calls found in them;
- assignments, so that later questions ("is `loss` a tensor?") can be answered per scope;
- hints that the module targets CUDA;
- every node of the types the rules asked for, with the frame it sits in.
The per-step model (stepmodel.py), tensor inference (tensors.py) and the rules read these records
afterwards, so each file is parsed once and walked once, however many rules there are.

The records hold syntax nodes, so their dataclasses have no generated repr (it would print subtrees).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, cast

import libcst as cst

from loopaudit.analysis.names import ImportTable, dotted_name, stored_name, string_key, target_names, terminal_name
from loopaudit.analysis.options import constant_flag, option_test
from loopaudit.analysis.patterns import (
    fills_a_cache,
    is_debug_test,
    is_other_device_test,
    is_periodic_test,
    is_rare_branch,
    is_training_call,
    type_test,
)
from loopaudit.analysis.walk import iter_subtree, walk

if TYPE_CHECKING:
    from types import EllipsisType

    from loopaudit.analysis.options import OptionTest


class FrameKind(enum.Enum):
    MODULE = "module"
    CLASS = "class"
    FUNCTION = "function"
    LOOP = "loop"  # the body (and, for `while`, the test) of a loop: runs once per iteration
    PERIODIC = "periodic"  # the body of `if step % N == 0:` and its kin
    RARE = "rare"  # exception handlers, `if bad: raise`, a loop's `else`: not the common path
    DEFERRED = "deferred"  # a lambda's body: it runs when something calls it, usually later
    # an arm a parameter's value selects (`if warm_start:`, `elif skip_type == 'logSNR':`): per-step
    # only when a caller's value (or the default) takes it (options.py; stepmodel decides)
    OPTION = "option"
    WITH = "with"  # the body of a `with` block: as its parent for the per-step model; rules read its items


@dataclass(eq=False, repr=False)
class Frame:
    kind: FrameKind
    parent: Frame | None
    node: cst.CSTNode | None
    loop: LoopInfo | None = None  # for LOOP frames
    function: FunctionInfo | None = None  # for FUNCTION frames
    class_info: ClassInfo | None = None  # for CLASS frames

    def enclosing_class(self) -> ClassInfo | None:
        frame: Frame | None = self
        while frame is not None:
            if frame.kind is FrameKind.CLASS:
                return frame.class_info
            frame = frame.parent
        return None

    def innermost_loop(self) -> LoopInfo | None:
        """The loop of this function (or module body) that this frame runs in, if any."""
        frame: Frame | None = self
        while frame is not None and frame.kind not in (FrameKind.FUNCTION, FrameKind.MODULE):
            if frame.kind is FrameKind.LOOP:
                return frame.loop
            frame = frame.parent
        return None

    def body(self) -> Frame:
        """The innermost loop body or function body this frame is part of (else the module or class
        body): the code that runs once each time that body runs, whatever `if` or `with` it sits in.
        Reports in one such body happen together, once per step when the body is a step's."""
        frame = self
        while frame.parent is not None and frame.kind not in (FrameKind.LOOP, FrameKind.FUNCTION, FrameKind.CLASS):
            frame = frame.parent
        return frame

    def enclosing_function(self) -> FunctionInfo | None:
        """The function whose body this frame is in; None at module level."""
        frame: Frame | None = self
        while frame is not None and frame.kind is not FrameKind.FUNCTION:
            frame = frame.parent
        return frame.function if frame is not None else None


@dataclass(eq=False, repr=False)
class Scope:
    """Assignments of one function body (or the module body), for dataflow questions."""

    parent: Scope | None
    assignments: dict[str, list[Binding]] = field(default_factory=dict)
    params: set[str] = field(default_factory=set)
    function: cst.FunctionDef | None = None
    owner_class: ClassInfo | None = None  # for a method's scope: the class whose `self` it sees

    def bind(self, name: str, binding: Binding) -> None:
        self.assignments.setdefault(name, []).append(binding)

    def lookup(self, name: str) -> tuple[list[Binding], Scope] | None:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.assignments:
                return scope.assignments[name], scope
            if name in scope.params:
                return [], scope
            scope = scope.parent
        return None


_BINDING_ORDER = itertools.count()


@dataclass(frozen=True, eq=False, repr=False)
class Binding:
    """One way a name got its value.

    kind is "value" (plain assignment: `value` is what was assigned), "augment" (`+=` and kin:
    `value` is the right-hand side), "element" (`a, b = value`: one element of `value`),
    "loop" (a `for` target: `value` is the iterable), or "with" (`with value as name`).
    """

    kind: str
    value: cst.BaseExpression
    scope: Scope
    position: int = 0  # which element, for kind "element" of a tuple target
    # The innermost loop (of the same function) the binding happens in; for a `for` target, that
    # loop itself. Lets `targets` in a validation loop be told from `targets` in the training loop.
    loop: LoopInfo | None = None
    # Increases in source order (bindings are made as the walk meets them): which came first.
    order: int = field(default_factory=lambda: next(_BINDING_ORDER))
    # The statement block (id of its IndentedBlock) the binding is made in: with `order`, which
    # binding a later read in the same block sees (tensors.py).
    block: int = 0


def _arms(node: cst.If) -> tuple[int, ...] | None:
    """The ids of the arm blocks of the chain starting at `node`, when it ends in `else:`."""
    arms = []
    current: cst.If | cst.Else | None = node
    while isinstance(current, cst.If):
        arms.append(id(current.body))
        current = current.orelse
    if not isinstance(current, cst.Else):
        return None
    arms.append(id(current.body))
    return tuple(arms)


# Containers a test can say a value is not (`type(depth) not in [list, tuple]: depth = [depth]`).
_CONTAINERS = frozenset({"list", "tuple"})


def _tensor_check(test: cst.BaseExpression) -> str | None:
    """The name a test narrows so that skipping the `if` leaves it no tensor: `isinstance(v,
    torch.Tensor)`, `torch.is_tensor(v)`, `type(v) == torch.Tensor` (skipped: not a tensor), and
    `not isinstance(v, (list, tuple))`, `type(v) not in [list, tuple]` (skipped: a list or tuple)."""
    tested = type_test(test)
    if tested is None:
        return None
    if tested.holds and len(tested.types) == 1 and "Tensor" in tested.types[0]:
        return tested.subject
    if not tested.holds and tested.types and all(t in _CONTAINERS for t in tested.types):
        return tested.subject
    return None


@dataclass(eq=False, repr=False)
class CallSite:
    call: cst.Call
    frame: Frame
    scope: Scope


@dataclass(eq=False, repr=False)
class LoopInfo:
    node: cst.For | cst.While
    frame: Frame  # the frame of the loop's body
    function: FunctionInfo | None
    parent_loop: LoopInfo | None
    scope: Scope
    children: list[LoopInfo] = field(default_factory=list)
    # Training calls (backward, optimizer.step, scaler.step) in the body, outside nested loops.
    trains_directly: bool = False
    # Calls to other code in the body: outside nested loops / anywhere in the body.
    direct_calls: list[CallSite] = field(default_factory=list)
    all_calls: list[CallSite] = field(default_factory=list)


def loop_within(inner: LoopInfo | None, outer: LoopInfo) -> bool:
    """Is `inner` the loop `outer` or one nested in it?"""
    while inner is not None:
        if inner is outer:
            return True
        inner = inner.parent_loop
    return False


@dataclass(eq=False, repr=False)
class FunctionInfo:
    node: cst.FunctionDef
    name: str
    frame: Frame  # the frame of the body
    scope: Scope
    class_info: ClassInfo | None
    loops: list[LoopInfo] = field(default_factory=list)
    trains_directly: bool = False  # training calls outside any loop of this function
    direct_calls: list[CallSite] = field(default_factory=list)  # outside loops
    all_calls: list[CallSite] = field(default_factory=list)
    call_sites: list[CallSite] = field(default_factory=list)  # filled in when calls are resolved
    returns: list[cst.BaseExpression] = field(default_factory=list)  # what its `return` statements give back
    is_generator: bool = False  # it has a `yield`: calling it returns an iterator

    @property
    def qualname(self) -> str:
        return f"{self.class_info.name}.{self.name}" if self.class_info else self.name

    @property
    def positional_params(self) -> tuple[str, ...]:
        """The names a call's positional arguments fill, in order (a method's `self` or `cls` left out)."""
        params = self.node.params
        names = tuple(p.name.value for p in (*params.posonly_params, *params.params))
        if self.class_info is not None and names[:1] in (("self",), ("cls",)):
            names = names[1:]
        return names

    @property
    def signature(self) -> Signature:
        params = self.node.params
        named = self.positional_params
        if self.class_info is not None and any(
            (dotted_name(d.decorator) or "") == "staticmethod" for d in self.node.decorators
        ):
            named = tuple(p.name.value for p in (*params.posonly_params, *params.params))
        defaulted = sum(1 for p in (*params.posonly_params, *params.params) if p.default is not None)
        return Signature(
            named,
            max(0, len(named) - defaulted),
            isinstance(params.star_arg, cst.Param),
            tuple(p.name.value for p in params.kwonly_params),
            isinstance(params.star_kwarg, cst.Param),
        )


# The parameter name under which what callers pass into a function's `**kwargs` is kept (project.py's
# argument kinds, tensors.py's reading of them).
STAR_KWARGS = "**"


@dataclass(frozen=True)
class Signature:
    """What a function's parameters accept: enough to tell whether a call could bind to it, the test
    a resolution by method name applies to its candidates (a receiver whose class is unknown)."""

    params: tuple[str, ...] = ()  # the names positional arguments fill, in order (`self` left out)
    required: int = 0  # how many of them have no default
    star_args: bool = True
    keyword_only: tuple[str, ...] = ()
    star_kwargs: bool = True

    def accepts(self, positional: int, keywords: tuple[str, ...]) -> bool:
        """Can a call with this many positional arguments (-1: unknown, it passes `*args`) and these
        keywords bind here? Keyword-only parameters are taken to have defaults."""
        if not self.star_kwargs and any(k not in self.params and k not in self.keyword_only for k in keywords):
            return False
        if positional < 0:
            return True
        if positional > len(self.params) and not self.star_args:
            return False
        return all(name in keywords for name in self.params[positional : self.required])


@dataclass(eq=False, repr=False)
class ClassInfo:
    node: cst.ClassDef
    name: str
    bases: list[cst.BaseExpression]
    methods: dict[str, FunctionInfo] = field(default_factory=dict)
    attributes: dict[str, list[Binding]] = field(default_factory=dict)  # `self.x = ...` in any method
    buffers: set[str] = field(
        default_factory=set
    )  # `self.register_buffer("x", ...)`: tensors that move with the module


@dataclass(eq=False, repr=False)
class Site:
    """A node a rule asked to see, with where it sits."""

    node: cst.CSTNode
    frame: Frame
    scope: Scope


@dataclass(eq=False, repr=False)
class ModuleIndex:
    module: cst.Module
    imports: ImportTable
    module_scope: Scope
    module_frame: Frame
    functions: list[FunctionInfo] = field(default_factory=list)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    loops: list[LoopInfo] = field(default_factory=list)
    loops_by_node: dict[int, LoopInfo] = field(default_factory=dict)  # id(For or While node) -> its loop
    sites: dict[type, list[Site]] = field(default_factory=dict)
    calls: list[CallSite] = field(default_factory=list)
    cuda_strings: bool = False  # a "cuda..." or "nccl" literal
    cuda_method_calls: bool = False  # `x.cuda()`
    gpu_only_options: bool = False  # `non_blocking=True` or `pin_memory=True`: useful only with a GPU
    cuda_attributes: list[cst.Attribute] = field(default_factory=list)  # `<something>.cuda`, resolved later
    constructor_calls: list[cst.Call] = field(default_factory=list)  # calls of capitalised names
    stored_subscripts: set[int] = field(default_factory=set)  # ids of `x[i]` written to, not read
    moves_to_device: bool = False  # a `.to(...)` call or a `device=` argument: a device is used
    # id(value) -> (name, scope) for `name = value` and `self.name = value`: what a call's result is called
    bound_names: dict[int, tuple[str, Scope]] = field(default_factory=dict)
    # id(name) -> (order, block, innermost loop of its function) for every name read or written:
    # where it stands among the bindings
    uses: dict[int, tuple[int, int, LoopInfo | None]] = field(default_factory=dict)
    # id(else) -> the `if` and `elif`s before an `else:` whose tests all read one option (options.py):
    # the arm runs for the values none of them takes
    else_chains: dict[int, list[cst.If]] = field(default_factory=dict)
    # container name -> (value, scope) of each `name[key] = value` (tensors.py reads the elements)
    element_writes: dict[str, list[tuple[cst.BaseExpression, Scope]]] = field(default_factory=dict)
    # id(statement block) -> id of the block it is nested in (the module's for the outermost)
    block_parents: dict[int, int] = field(default_factory=dict)
    # id(value) -> (container name, scope, key or None) for a value kept in a dict under a key:
    # `loaders = {"train": DataLoader(...)}`, `self.loaders["train"] = DataLoader(...)` (stepmodel
    # follows `loaders["train"]` and `loaders[phase]` to it)
    held_in: dict[int, tuple[str, Scope, str | bytes | None]] = field(default_factory=dict)
    # id(name read inside a comprehension) -> the bindings of its own `for` targets: in
    # `x = [x.to(device) for x in inputs]` the inner `x` is the comprehension's, never the outer `x`
    comprehension_reads: dict[int, list[Binding]] = field(default_factory=dict)
    # id(the body of `if isinstance(v, torch.Tensor):` or `if type(v) not in [list, tuple]:`) -> "v": a
    # binding of `v` there (`v = v.item()`, `v = [v]`) decides what `v` is after the `if`, whichever
    # way the test goes, as the path that skips it already holds no tensor (tensors.py)
    tensor_checks: dict[int, str] = field(default_factory=dict)
    # id(an arm's block) -> the blocks of every arm of its `if`/`elif`/`else` chain, for chains that end
    # in `else:` (one arm always runs): a name every arm binds is replaced after the chain (tensors.py)
    exhaustive_arms: dict[int, tuple[int, ...]] = field(default_factory=dict)


class _Indexer:
    def __init__(
        self, index: ModuleIndex, site_types: tuple[type, ...], periodic_names: frozenset[str] = frozenset()
    ) -> None:
        self.periodic_names = periodic_names
        self.index = index
        self._setters: dict[str, frozenset[str]] | None = None  # _global_setters, once asked
        self.site_types = frozenset(site_types)
        self.frame = index.module_frame
        self.scope = index.module_scope
        self.loop: LoopInfo | None = None
        self.function: FunctionInfo | None = None
        self.block = id(index.module)
        # Each entry remembers what on_visit_attribute changed, so on_leave_attribute can undo it.
        self._undo: list[tuple[Frame, LoopInfo | None, FunctionInfo | None, Scope, int] | None] = []
        self._immediate_lambdas: set[int] = set()
        self._chains: dict[int, list[cst.If]] = {}  # id(elif or else) -> the `if`s before it in its chain
        self._comprehensions: dict[int, cst.BaseComp] = {}  # id(its `for` clause) -> the comprehension

    # --- structure -----------------------------------------------------------------------------

    def _push(
        self,
        frame: Frame,
        loop: LoopInfo | EllipsisType | None = ...,
        function: FunctionInfo | EllipsisType | None = ...,
        scope: Scope | EllipsisType = ...,
        block: int | EllipsisType = ...,
    ) -> None:
        self._undo.append((self.frame, self.loop, self.function, self.scope, self.block))
        self.frame = frame
        if block is not ...:
            self.block = block
        if loop is not ...:
            self.loop = loop
        if function is not ...:
            self.function = function
        if scope is not ...:
            self.scope = scope

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            self.index.block_parents[id(node)] = self.block
            self._push(self.frame, block=id(node))
            return
        if isinstance(node, (cst.For, cst.While)):
            if attribute == "body" or (attribute == "test" and isinstance(node, cst.While)):
                loop = self._loop_for(node)
                self._push(loop.frame, loop=loop)
                return
            if attribute == "orelse":
                self._push(Frame(FrameKind.RARE, self.frame, node))
                return
        elif isinstance(node, cst.If) and attribute == "body":
            arms = _arms(node)
            if arms is not None:
                for arm in arms:
                    self.index.exhaustive_arms.setdefault(arm, arms)  # (the chain's first `if` is met first)
            checked = _tensor_check(node.test)
            if checked is not None:
                self.index.tensor_checks[id(node.body)] = checked
            if (
                is_periodic_test(
                    node.test, cast("cst.For | cst.While | None", self.loop and self.loop.node), self.periodic_names
                )
                or self._periodic_flag(node.test)
            ) and not _dispatches_on_index(node, self._chains.get(id(node), [])):
                self._push(Frame(FrameKind.PERIODIC, self.frame, node))
                return
            if (
                is_rare_branch(node.body, in_loop=self.loop is not None)
                or is_other_device_test(node.test)
                or is_debug_test(node.test, self.function.node if self.function is not None else None)
                or fills_a_cache(node, self._global_setters, self.scope.params)
            ):
                self._push(Frame(FrameKind.RARE, self.frame, node))
                return
            if option_test(node.test, self.function.node if self.function is not None else None) is not None or (
                constant_flag(node.test, self.scope) is not None
            ):
                self._push(Frame(FrameKind.OPTION, self.frame, node))  # an arm an option selects (options.py)
                return
        elif isinstance(node, cst.If) and attribute == "orelse" and node.orelse is not None:
            self._chains[id(node.orelse)] = [*self._chains.get(id(node), ()), node]
        elif isinstance(node, cst.Else) and attribute == "body" and self._option_chain(self._chains.get(id(node), [])):
            self.index.else_chains[id(node)] = self._chains[id(node)]
            self._push(Frame(FrameKind.OPTION, self.frame, node))  # `else:` after `if mode == 'a': ... elif ...`
            return
        elif isinstance(node, (cst.ExceptHandler, cst.ExceptStarHandler)) and attribute == "body":
            self._push(Frame(FrameKind.RARE, self.frame, node))
            return
        elif isinstance(node, cst.FunctionDef) and attribute == "body":
            info = self._function_for(node)
            self._push(info.frame, loop=None, function=info, scope=info.scope)
            return
        elif isinstance(node, cst.With) and attribute == "body":
            self._push(Frame(FrameKind.WITH, self.frame, node))
            return
        elif isinstance(node, cst.Lambda) and attribute == "body" and not self._called_at_once(node):
            self._push(Frame(FrameKind.DEFERRED, self.frame, node))
            return
        elif isinstance(node, cst.ClassDef) and attribute == "body":
            self._push(Frame(FrameKind.CLASS, self.frame, node, class_info=self.index.classes[node.name.value]))
            return
        self._undo.append(None)

    def _periodic_flag(self, test: cst.BaseExpression) -> bool:
        """`if log_losses:` where the function set `log_losses = i > 0 and n_iter % print_freq == 0`:
        a flag bound (so far, and only) to a periodic test is one, alone or in a conjunction
        (`if ddp and log_train:`, build-nanogpt's)."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            return self._periodic_flag(test.left) or self._periodic_flag(test.right)
        if not isinstance(test, cst.Name):
            return False
        bindings = self.scope.assignments.get(test.value, [])
        return bool(bindings) and all(
            b.kind == "value"
            and is_periodic_test(
                b.value, cast("cst.For | cst.While | None", self.loop and self.loop.node), self.periodic_names
            )
            for b in bindings
        )

    def _option_chain(self, chain: list[cst.If]) -> bool:
        """Do all the tests of an `if`/`elif` chain read the same option?"""
        function = self.function.node if self.function is not None else None
        tests = [option_test(branch.test, function) for branch in chain]
        return bool(tests) and all(
            test is not None and test.param == cast("OptionTest", tests[0]).param for test in tests
        )

    def _called_at_once(self, node: cst.Lambda) -> bool:
        """`sorted(xs, key=lambda t: t.item())` runs the lambda right away; `hook = lambda: ...` does not."""
        return id(node) in self._immediate_lambdas

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        saved = self._undo.pop()
        if saved is not None:
            self.frame, self.loop, self.function, self.scope, self.block = saved

    def _loop_for(self, node: cst.For | cst.While) -> LoopInfo:
        # The `while` test and body share one LoopInfo: both run on every iteration.
        existing = self.index.loops_by_node.get(id(node))
        if existing is not None:
            return existing
        frame = Frame(FrameKind.LOOP, self.frame, node)
        loop = LoopInfo(node, frame, self.function, self.loop, self.scope)
        frame.loop = loop
        if self.loop is not None:
            self.loop.children.append(loop)
        if self.function is not None:
            self.function.loops.append(loop)
        self.index.loops.append(loop)
        self.index.loops_by_node[id(node)] = loop
        return loop

    def _function_for(self, node: cst.FunctionDef) -> FunctionInfo:
        class_info = self.frame.class_info if self.frame.kind is FrameKind.CLASS else None
        # A method's enclosing scope is the class's enclosing scope: class bodies are not closures.
        scope = Scope(parent=self.scope, function=node, owner_class=class_info or self.scope.owner_class)
        params = node.params
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            scope.params.add(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                scope.params.add(star.name.value)
        frame = Frame(FrameKind.FUNCTION, self.frame, node)
        info = FunctionInfo(node, node.name.value, frame, scope, class_info)
        frame.function = info
        if class_info is not None:
            class_info.methods.setdefault(info.name, info)
        self.index.functions.append(info)
        return info

    # --- facts ---------------------------------------------------------------------------------

    def on_visit(self, node: cst.CSTNode) -> None:
        node_type = type(node)
        if node_type in self.site_types:
            self.index.sites.setdefault(node_type, []).append(Site(node, self.frame, self.scope))
        visit = self._visitors.get(node_type)
        if visit is not None:
            visit(self, node)

    def _visit_call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value in _CALLS_LAMBDA_AT_ONCE:
            self._immediate_lambdas.update(id(arg.value) for arg in node.args if isinstance(arg.value, cst.Lambda))
        site = CallSite(node, self.frame, self.scope)
        self.index.calls.append(site)
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            self.index.cuda_method_calls = True
        elif isinstance(func, cst.Attribute) and func.attr.value == "register_buffer" and node.args:
            owner = self.scope.owner_class
            name = node.args[0].value
            if owner is not None and isinstance(name, cst.SimpleString):
                owner.buffers.add(name.value.strip("'\""))
        if any(
            arg.keyword is not None
            and arg.keyword.value in ("non_blocking", "pin_memory")
            and isinstance(arg.value, cst.Name)
            and arg.value.value == "True"
            for arg in node.args
        ):
            self.index.gpu_only_options = True
        if (isinstance(func, cst.Attribute) and func.attr.value == "to") or any(
            arg.keyword is not None and arg.keyword.value in ("device", "device_ids") for arg in node.args
        ):
            self.index.moves_to_device = True
        if (terminal_name(func) or "")[:1].isupper():
            self.index.constructor_calls.append(node)
        training = is_training_call(node, self.index.imports)
        loop = self.loop if self.loop is not None and self.loop.function is self.function else None
        if loop is not None:
            loop.all_calls.append(site)
            loop.direct_calls.append(site)
            if training:
                loop.trains_directly = True
            outer = loop.parent_loop
            while outer is not None and outer.function is self.function:
                outer.all_calls.append(site)
                outer = outer.parent_loop
        if self.function is not None:
            self.function.all_calls.append(site)
            if loop is None:
                self.function.direct_calls.append(site)
                if training:
                    self.function.trains_directly = True

    def _visit_return(self, node: cst.Return) -> None:
        if self.function is not None and node.value is not None:
            self.function.returns.append(node.value)

    def _visit_yield(self, node: cst.Yield) -> None:
        if self.function is not None:
            self.function.is_generator = True

    def _visit_string(self, node: cst.SimpleString) -> None:
        if "cuda" in node.value or "nccl" in node.value:
            try:
                text = node.evaluated_value
            except Exception:  # a malformed escape: libcst parsed it, Python would not
                return
            if isinstance(text, str) and (text.startswith("cuda") or text == "nccl"):
                self.index.cuda_strings = True

    def _visit_fstring(self, node: cst.FormattedString) -> None:
        if node.parts and isinstance(node.parts[0], cst.FormattedStringText):
            if node.parts[0].value.startswith("cuda"):
                self.index.cuda_strings = True

    def _visit_attribute(self, node: cst.Attribute) -> None:
        # `torch.cuda` and `torch.cuda.<api>`; which API it is decides whether it proves CUDA use.
        inner = node.value
        if node.attr.value in ("cuda", "accelerator") or (
            isinstance(inner, cst.Attribute) and inner.attr.value in ("cuda", "accelerator")
        ):
            self.index.cuda_attributes.append(
                node
            )  # (`torch.accelerator.current_accelerator()` picks CUDA where there is one)

    def _visit_import(self, node: cst.Import | cst.ImportFrom) -> None:
        self.index.imports.add(node)

    def _visit_class(self, node: cst.ClassDef) -> None:
        name = node.name.value
        self.index.classes.setdefault(name, ClassInfo(node, name, [arg.value for arg in node.bases]))

    def _visit_assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind_target(target.target, node.value)

    def _visit_ann_assign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind_target(node.target, node.value)

    def _bind_self_attribute(self, target: cst.BaseExpression, binding: Binding) -> bool:
        """Record `self.x = value` on the class, so `self.x` can be looked up from any method."""
        if not (
            isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
        ):
            return False
        owner = self.scope.owner_class
        if owner is not None:
            owner.attributes.setdefault(target.attr.value, []).append(binding)
        return True

    def _visit_aug_assign(self, node: cst.AugAssign) -> None:
        self._bind_self_attribute(
            node.target, Binding("augment", node.value, self.scope, loop=self._here(), block=self.block)
        )
        if isinstance(node.target, cst.Subscript):
            self.index.stored_subscripts.add(id(node.target))
        if isinstance(node.target, cst.Name):
            self.scope.bind(
                node.target.value, Binding("augment", node.value, self.scope, loop=self._here(), block=self.block)
            )

    def _visit_named_expr(self, node: cst.NamedExpr) -> None:
        self._bind_target(node.target, node.value)

    def _visit_for(self, node: cst.For) -> None:
        self._bind_loop_target(node.target, node.iter, self._loop_for(node))

    def _visit_comp_for(self, node: cst.CompFor) -> None:
        before = {name: len(self.scope.assignments.get(name, ())) for name in target_names(node.target)}
        self._bind_loop_target(node.target, node.iter, self._here())
        # (binding appends: what the target bound is what follows the bindings there were before)
        own = {name: self.scope.assignments.get(name, [])[count:] for name, count in before.items()}
        comprehension = self._comprehensions.get(id(node))
        if comprehension is None:
            return
        for read in iter_subtree(comprehension):
            if isinstance(read, cst.Name) and own.get(read.value) and id(read) not in self.index.comprehension_reads:
                self.index.comprehension_reads[id(read)] = own[read.value]

    def _visit_comprehension(self, node: cst.BaseComp) -> None:
        """Remember which comprehension each of its `for` clauses belongs to (visited before them)."""
        clause: cst.CompFor | None = node.for_in
        while clause is not None:
            self._comprehensions[id(clause)] = node
            clause = clause.inner_for_in

    def _visit_with_item(self, node: cst.WithItem) -> None:
        if node.asname is not None and isinstance(node.asname.name, cst.Name):
            self.scope.bind(
                node.asname.name.value, Binding("with", node.item, self.scope, loop=self._here(), block=self.block)
            )

    def _global_setters(self) -> dict[str, frozenset[str]]:
        """Function name -> the globals it declares (`def set_id_grid(depth): global pixel_coords`)."""
        if self._setters is None:
            self._setters = {}
            for found in iter_subtree(self.index.module):
                if isinstance(found, cst.FunctionDef):
                    declared = frozenset(
                        n.name.value for g in iter_subtree(found.body) if isinstance(g, cst.Global) for n in g.names
                    )
                    if declared:
                        self._setters[found.name.value] = declared
        return self._setters

    def _here(self) -> LoopInfo | None:
        return self.loop if self.loop is not None and self.loop.function is self.function else None

    def _bind_target(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Subscript):
            self.index.stored_subscripts.add(id(target))
            if isinstance(target.value, cst.Name):
                # `meta[key] = val.cuda()`: what the container's elements may hold from here on
                self.index.element_writes.setdefault(target.value.value, []).append((value, self.scope))
            container = stored_name(target.value)
            if container is not None and len(target.slice) == 1:
                self.index.held_in.setdefault(id(value), (container, self.scope, string_key(target)))
        elif self._bind_self_attribute(
            target, Binding("value", value, self.scope, loop=self._here(), block=self.block)
        ):
            self.index.bound_names.setdefault(id(value), ("self." + target.attr.value, self.scope))  # type: ignore[attr-defined]
            self._hold_entries("self." + target.attr.value, value)  # type: ignore[attr-defined]
        elif isinstance(target, cst.Name):
            self.scope.bind(target.value, Binding("value", value, self.scope, loop=self._here(), block=self.block))
            self.index.bound_names.setdefault(id(value), (target.value, self.scope))
            self._hold_entries(target.value, value)
            if (
                isinstance(value, cst.Call)
                and isinstance(value.func, cst.Name)
                and value.func.value == "iter"
                and len(value.args) == 1
                and value.args[0].keyword is None
            ):
                # `batch_iterator = iter(DataLoader(...))`: the loader is what `next(batch_iterator)` draws from
                self.index.bound_names.setdefault(id(value.args[0].value), (target.value, self.scope))
        elif isinstance(target, (cst.Tuple, cst.List)):
            values = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            for position, element in enumerate(target.elements):
                if values is not None and len(values) == len(target.elements):
                    self._bind_target(element.value, values[position].value)
                elif isinstance(element.value, cst.Name):
                    binding = Binding("element", value, self.scope, position, loop=self._here(), block=self.block)
                    self.scope.bind(element.value.value, binding)

    def _hold_entries(self, container: str, value: cst.BaseExpression) -> None:
        """`loaders = {"train": DataLoader(...), "val": ...}`: each entry's value is held under its key."""
        if isinstance(value, cst.Dict):
            for element in value.elements:
                if isinstance(element, cst.DictElement):
                    key = element.key.evaluated_value if isinstance(element.key, cst.SimpleString) else None
                    self.index.held_in.setdefault(id(element.value), (container, self.scope, key))

    def _bind_loop_target(
        self, target: cst.BaseExpression, iterable: cst.BaseExpression, loop: LoopInfo | None
    ) -> None:
        # Every name in the target, however nested (`for i, (x, y) in enumerate(loader)`), is
        # bound from the iterable; tensors.py unwraps enumerate/zip to say which element is which.
        if isinstance(target, cst.Name):
            self.scope.bind(target.value, Binding("loop", iterable, self.scope, loop=loop, block=self.block))
        elif isinstance(target, (cst.Tuple, cst.List)):
            for position, element in enumerate(target.elements):
                inner = element.value
                if isinstance(inner, cst.Name):
                    self.scope.bind(
                        inner.value, Binding("loop", iterable, self.scope, position, loop=loop, block=self.block)
                    )
                elif isinstance(inner, (cst.Tuple, cst.List)):
                    self._bind_loop_target(inner, _element_of(iterable, position), loop)

    def _visit_name(self, node: cst.Name) -> None:
        self.index.uses[id(node)] = (next(_BINDING_ORDER), self.block, self._here())

    _visitors: ClassVar[dict[type[cst.CSTNode], Callable[..., None]]] = {
        cst.Name: _visit_name,
        cst.Call: _visit_call,
        cst.Return: _visit_return,
        cst.Yield: _visit_yield,
        cst.SimpleString: _visit_string,
        cst.FormattedString: _visit_fstring,
        cst.Attribute: _visit_attribute,
        cst.Import: _visit_import,
        cst.ImportFrom: _visit_import,
        cst.ClassDef: _visit_class,
        cst.Assign: _visit_assign,
        cst.AnnAssign: _visit_ann_assign,
        cst.AugAssign: _visit_aug_assign,
        cst.NamedExpr: _visit_named_expr,
        cst.For: _visit_for,
        cst.CompFor: _visit_comp_for,
        cst.ListComp: _visit_comprehension,
        cst.SetComp: _visit_comprehension,
        cst.DictComp: _visit_comprehension,
        cst.GeneratorExp: _visit_comprehension,
        cst.WithItem: _visit_with_item,
    }


def _element_of(iterable: cst.BaseExpression, position: int) -> cst.BaseExpression:
    """For `for i, (x, y) in enumerate(loader)`: element 1 of `enumerate(loader)` is drawn from `loader`."""
    if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name):
        args = [arg.value for arg in iterable.args if arg.keyword is None and not arg.star]
        if iterable.func.value == "enumerate" and args and position == 1:
            return args[0]
        if iterable.func.value == "zip" and position < len(args):
            return args[position]
    return iterable


def build_index(
    module: cst.Module, site_types: tuple[type, ...], periodic_names: frozenset[str] = frozenset()
) -> ModuleIndex:
    """`periodic_names`: the user's own names that make an `if` a periodic guard (configuration)."""
    imports = ImportTable()
    module_scope = Scope(parent=None)
    index = ModuleIndex(module, imports, module_scope, Frame(FrameKind.MODULE, None, module))
    indexer = _Indexer(index, site_types, periodic_names)
    walk(module, indexer.on_visit, indexer.on_visit_attribute, indexer.on_leave_attribute, _STRUCTURAL)
    for name, bindings in module_scope.assignments.items():
        # `autocast = torch.cuda.amp.autocast` (RAFT): bound once, at module level, to a torch API.
        if len(bindings) == 1 and bindings[0].kind == "value" and isinstance(bindings[0].value, cst.Attribute):
            qualified = imports.qualify(bindings[0].value)
            # (A class of the same name is the fallback of an `except ImportError:`, for old versions.)
            if qualified is not None and qualified.startswith("torch."):
                imports.add_alias(name, qualified)
    return index


_CALLS_LAMBDA_AT_ONCE = frozenset({"map", "filter", "sorted", "min", "max", "any", "all", "list", "sum"})

# Nodes whose fields open a new frame (a loop body, an `if` body, a handler, a function body).
_STRUCTURAL = frozenset(
    {
        cst.IndentedBlock,
        cst.SimpleStatementSuite,
        cst.With,
        cst.For,
        cst.While,
        cst.If,
        cst.Else,
        cst.ExceptHandler,
        cst.ExceptStarHandler,
        cst.FunctionDef,
        cst.ClassDef,
        cst.Lambda,
    }
)


__all__ = [
    "Binding",
    "CallSite",
    "ClassInfo",
    "Frame",
    "FrameKind",
    "FunctionInfo",
    "LoopInfo",
    "ModuleIndex",
    "Scope",
    "Site",
    "build_index",
    "dotted_name",
    "terminal_name",
]


def argument_at(call: cst.Call, name: str, position: int) -> cst.BaseExpression | None:
    """What `call` passes for the parameter `name`, the `position`-th positional one (-1: keyword only)."""
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return arg.value
        elif index == position:
            return arg.value
    return None


def named_param(function: cst.FunctionDef, name: str) -> cst.Param | None:
    """The parameter `name` of `function` (positional, ordinary or keyword-only), if it has one."""
    params = function.params
    return next(
        (p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == name), None
    )


def _dispatches_on_index(node: cst.If, chain: list[cst.If]) -> bool:
    """`if idx == 0: ... elif idx == 1: ...`: a chain that picks what to do with each element by its
    position, every pass of the loop, not a guard that lets the first step alone through."""
    tested = _equals_integer(node.test)
    if tested is None:
        return False
    after = node.orelse if isinstance(node.orelse, cst.If) else None
    return (after is not None and _equals_integer(after.test) == tested) or (
        bool(chain) and _equals_integer(chain[-1].test) == tested
    )


def _equals_integer(test: cst.BaseExpression) -> str | None:
    """`idx == 0`: the name compared with a number written in the code."""
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.left, cst.Name)
        and isinstance(test.comparisons[0].comparator, cst.Integer)
    ):
        return test.left.value
    return None


def argument_for(function: FunctionInfo, name: str, call: cst.Call) -> cst.BaseExpression | None:
    """The expression `call` passes for `function`'s parameter `name`, if it can be told."""
    positional = function.positional_params
    return argument_at(call, name, positional.index(name) if name in positional else -1)
