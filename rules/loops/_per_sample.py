"""What LA301 reports, shared with LA302: a Python loop over the samples of a batch (`for i in
range(x.size(0))`, `for sample in batch`) that does tensor work on one sample per iteration.
LA302 leaves the element writes of such a loop to it: the loop is the one problem.

Not a rule: it declares no Rule subclass, so the registry finds nothing here.
"""

from __future__ import annotations

import libcst as cst

from loopaudit.rule_api import (
    FORWARD_CALLEE,
    Kind,
    iter_subtree,
    terminal_name,
    type_test,
)
from loopaudit.rules.loops._batch import (
    TENSORS,
    body_nodes,
    is_container_name,
    is_ragged,
    is_recurrence,
    names_in,
    range_bound,
    slice_names,
    step_like,
    target_names,
    tensor_kind,
    tensor_size,
    unwrap_enumerate,
)

# Tensor methods that compute (launch a kernel) or read a value back, called once per element.
# Moves and dtype casts alone (`t.to(device)` for each field of a batch tuple) are not per-sample work.
_COMPUTE_METHODS = frozenset(
    {
        "sum",
        "mean",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "prod",
        "std",
        "var",
        "norm",
        "abs",
        "exp",
        "log",
        "sqrt",
        "pow",
        "neg",
        "sigmoid",
        "softmax",
        "log_softmax",
        "relu",
        "tanh",
        "eq",
        "ne",
        "gt",
        "lt",
        "ge",
        "le",
        "isnan",
        "isinf",
        "isfinite",
        "any",
        "all",
        "masked_fill",
        "gather",
        "index_select",
        "clamp",
        "clip",
        "round",
        "floor",
        "ceil",
        "add",
        "sub",
        "mul",
        "div",
        "matmul",
        "mm",
        "bmm",
        "nonzero",
        "count_nonzero",
        "cumsum",
        "add_",
        "mul_",
        "div_",
        "sub_",
        "zero_",
        "fill_",
        "copy_",
        "masked_select",
        "unique",
        "square",
        "rsqrt",
        "reciprocal",
        "sign",
        "topk",
        "sort",
        "argsort",
        "dot",
        "item",
        "tolist",
        "index_add_",
        "scatter_",
        "scatter_add_",
    }
)
# Methods of strings that a tensor does not have: what they are called on is text.
_STRING_ONLY_METHODS = frozenset(
    {
        "startswith",
        "endswith",
        "lower",
        "upper",
        "strip",
        "lstrip",
        "rstrip",
        "replace",
        "encode",
        "format",
        "isdigit",
        "isalpha",
        "casefold",
        "title",
        "removeprefix",
        "removesuffix",
    }
)
_TEXT = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
_ARITHMETIC = (
    cst.Add,
    cst.Subtract,
    cst.Multiply,
    cst.Divide,
    cst.FloorDivide,
    cst.Modulo,
    cst.Power,
    cst.MatrixMultiply,
)


def per_sample_work(node: cst.For, ctx) -> cst.CSTNode | None:
    """The first tensor operation a loop over the batch's samples does on one sample, or None when
    the loop is no such loop (a step loop, a ragged or recurrent loop, a walk over a container of
    mixed objects or text)."""
    return ctx.memoized(f"per-sample:{id(node)}", lambda: _per_sample_work(node, ctx))


def _per_sample_work(node: cst.For, ctx) -> cst.CSTNode | None:
    if step_like(node, ctx):
        return None
    iterable, item_target = unwrap_enumerate(node.iter, node.target)
    bound = range_bound(iterable)
    if bound is not None:
        size = tensor_size(bound, ctx, ctx.scope)
        if size is None or size[1] not in (0, None):
            return None
        indices = set(target_names(node.target))
        if not indices or is_ragged(node, indices) or is_recurrence(node):
            return None
        finder = _Elements(ctx, indices=indices, elements=set())
    else:
        if not _iterates_tensors(iterable, ctx) or _tested_as_container(iterable, node, ctx):
            return None
        elements = set(target_names(item_target))
        if not elements or is_recurrence(node) or _used_as_mapping(node, elements):
            return None
        finder = _Elements(ctx, indices=set(), elements=elements)
    finder.propagate(node)
    if finder.checks_type(node) or finder.uses_as_text(node):
        return None
    return finder.work(node)


# Types a test can show a value to be instead of a tensor: walking it walks its items.
_CONTAINER_TYPES = frozenset({"list", "tuple", "dict", "set", "str", "Sequence", "Mapping", "Iterable"})


def _tested_as_container(iterable: cst.BaseExpression, loop: cst.For, ctx) -> bool:
    """Is the loop inside `if isinstance(name, (list, tuple)):` or `if type(name) is tuple:` for the
    name it walks? FlowNet2's multi-scale loss walks a tuple of outputs, one per scale; a text
    encoder under `isinstance(text, list)` walks strings."""
    if not isinstance(iterable, cst.Name):
        return False
    child, parent = loop, ctx.parent(loop)
    while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Module)):
        if isinstance(parent, cst.If) and child is parent.body and _container_test(parent.test, iterable.value):
            return True
        child, parent = parent, ctx.parent(parent)
    return False


def _container_test(test: cst.BaseExpression, name: str) -> bool:
    """`isinstance(name, list)`, `isinstance(name, (list, tuple))`, `type(name) is tuple`, `type(name) in (list, tuple)`."""
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _container_test(test.left, name) or _container_test(test.right, name)
    tested = type_test(test)
    return (
        tested is not None
        and tested.holds
        and tested.subject == name
        and bool(tested.types)
        and all(t.rsplit(".", 1)[-1] in _CONTAINER_TYPES for t in tested.types)
    )


def _iterates_tensors(iterable: cst.BaseExpression, ctx) -> bool:
    if isinstance(iterable, cst.Call) and terminal_name(iterable.func) == "zip":
        args = [arg.value for arg in iterable.args]
        return bool(args) and all(_is_tensor_value(arg, ctx) for arg in args)
    return _is_tensor_value(iterable, ctx)


def _is_tensor_value(expr: cst.BaseExpression, ctx) -> bool:
    if is_container_name(terminal_name(expr) or ""):
        return False
    if isinstance(expr, cst.Name) and (_passed_in(expr.value, ctx) or _module_output(expr.value, ctx)):
        # `def get_loss(model_output): for x in model_output:`, `D_fake = netD(x); for scale in
        # D_fake:` — a model's output may be a tuple or list of tensors (heads, scales, the
        # discriminators of a multi-scale GAN), and walking it is walking those, not samples.
        return False
    return tensor_kind(expr, ctx) in TENSORS


def _module_output(name: str, ctx) -> bool:
    """Is `name` bound only to what a model returns (`D_real = netD(x_t.cuda())`)?"""
    found = ctx.scope.lookup(name)
    bindings = found[0] if found else []
    return bool(bindings) and all(
        b.kind == "value"
        and isinstance(b.value, cst.Call)
        and FORWARD_CALLEE.search(terminal_name(b.value.func) or "") is not None
        and not (ctx.qualified_name(b.value.func) or "").startswith("torch.")
        for b in bindings
    )


def _passed_in(name: str, ctx) -> bool:
    """Is `name` a parameter the function never rebinds, other than a model's `forward` input?"""
    found = ctx.scope.lookup(name)
    if found is None or found[0] or name not in found[1].params or found[1].function is None:
        return False
    function = found[1].function
    return function.name.value != "forward"


def _used_as_mapping(loop: cst.For, elements: set[str]) -> bool:
    """`t["boxes"]`: the elements are dicts (a detection batch), not tensor rows."""
    for node in body_nodes(loop):
        if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and node.value.value in elements:
            if any(
                isinstance(getattr(e.slice, "value", None), (cst.SimpleString, cst.FormattedString)) for e in node.slice
            ):
                return True
    return False


class _Elements:
    """What in a loop body is one element of the batch: `x[i]` for an index `i` into a tensor, the
    loop's item in `for sample in batch`, and names assigned from those (`xi = x[i].cuda()`)."""

    def __init__(self, ctx, indices: set[str], elements: set[str]) -> None:
        self.ctx = ctx
        self.indices = indices
        self.elements = elements

    def is_element(self, expr: cst.CSTNode) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in self.elements
        if isinstance(expr, cst.Subscript):
            if self.is_element(expr.value):
                return True
            if self.indices and slice_names(expr) & self.indices:
                return tensor_kind(expr.value, self.ctx) in TENSORS
        return False

    def contains_element(self, expr: cst.CSTNode) -> bool:
        return any(self.is_element(n) for n in iter_subtree(expr) if isinstance(n, (cst.Name, cst.Subscript)))

    def propagate(self, loop: cst.For) -> None:
        for _ in range(2):
            for node in body_nodes(loop):
                if not isinstance(node, cst.Assign):
                    continue
                names = {n for t in node.targets for n in _names_of(t.target)}
                if self.indices and names_in(node.value) & self.indices:
                    self.indices |= names  # `idx = ids[b].item()`: still one element's index
                if self.contains_element(node.value) and self.ctx.kind(node.value) is not Kind.NOT_TENSOR:
                    self.elements |= names

    def checks_type(self, loop: cst.For) -> bool:
        """`x[i] is None`, `isinstance(item, dict)`: the elements are Python objects of mixed types
        (a tuple of outputs, a nested structure), not the rows of a tensor."""
        for node in body_nodes(loop):
            if isinstance(node, cst.Comparison) and any(
                isinstance(c.operator, (cst.Is, cst.IsNot)) for c in node.comparisons
            ):
                if self.contains_element(node.left):
                    return True
            elif isinstance(node, cst.Call) and terminal_name(node.func) == "isinstance" and node.args:
                if self.contains_element(node.args[0].value):
                    return True
        return False

    def uses_as_text(self, loop: cst.For) -> bool:
        """`"loss_for_" + fname`, `fname.endswith(".png")`: the elements are strings (file names,
        captions), not the rows of a tensor (adding a string to a tensor raises; `"%f" % x[i]` would
        format a tensor, so it proves nothing)."""
        for node in body_nodes(loop):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                sides = (node.left, node.right)
                if any(isinstance(side, _TEXT) for side in sides) and any(
                    self.is_element(side) for side in sides if not isinstance(side, _TEXT)
                ):
                    return True
            elif (
                isinstance(node, cst.Call)
                and isinstance(node.func, cst.Attribute)
                and node.func.attr.value in _STRING_ONLY_METHODS
                and self.is_element(node.func.value)
            ):
                return True
        return False

    def work(self, loop: cst.For) -> cst.CSTNode | None:
        """The first tensor operation the body does on one element, if any."""
        for node in body_nodes(loop):
            if isinstance(node, cst.Call):
                func = node.func
                if (
                    isinstance(func, cst.Attribute)
                    and func.attr.value in _COMPUTE_METHODS
                    and self.contains_element(func.value)
                ):
                    return node
                if any(self.contains_element(arg.value) for arg in node.args) and self._computes(node):
                    return node
            elif isinstance(node, cst.AugAssign) and self._operand(node.value):
                written = node.target
                if not (isinstance(written, cst.Subscript) and slice_names(written) & self.indices):
                    return node  # `total += x[i]`; a write `t[i] += v` is LA302's
            elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, _ARITHMETIC):
                if self._operand(node.left) or self._operand(node.right):
                    return node
            elif isinstance(node, cst.Comparison):
                if all(
                    isinstance(
                        c.operator,
                        (
                            cst.Equal,
                            cst.NotEqual,
                            cst.LessThan,
                            cst.LessThanEqual,
                            cst.GreaterThan,
                            cst.GreaterThanEqual,
                        ),
                    )
                    for c in node.comparisons
                ):
                    if self._operand(node.left) or any(self._operand(c.comparator) for c in node.comparisons):
                        return node
        return None

    def _operand(self, expr: cst.BaseExpression) -> bool:
        while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and not expr.args:
            expr = expr.func.value  # `x[i].float() * w`
        return self.is_element(expr)

    def _computes(self, call: cst.Call) -> bool:
        """A forward pass, a loss, or a torch function (not a constructor, a move, or a save)."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("to", "cuda", "cpu", "append", "extend"):
            return False
        return self.ctx.kind(call) in TENSORS


def _names_of(target: cst.BaseExpression) -> list[str]:
    return target_names(target)
