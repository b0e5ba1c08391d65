"""Shared by LA301 and LA302: Python loops over the elements of a batch (a tensor's rows or items).

Not a rule (it declares none). It answers, for a `for` loop:
- does it iterate a tensor's size (`range(x.size(0))`, `range(len(labels))`, `n = x.shape[0]` ...
  `range(n)`) or a tensor itself (`for sample in batch`)?
- is it a recurrence (`h = cell(x[t], h)`: each iteration needs the previous one, so there is no
  batched form) or a ragged loop (`x[i, :lengths[i]]`: rows of different lengths)?
"""

from __future__ import annotations

import re

import libcst as cst

from loopaudit.rule_api import Kind, Scope, iter_subtree, target_names, terminal_name

TENSORS = (Kind.TENSOR, Kind.HOST_TENSOR)
_CONTAINER_NAME = re.compile(r"(?i)(^|_)(tuple|list|dict|items|pairs)s?($|_)")
_DEFERRED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


def body_nodes(loop: cst.For | cst.While):
    """Every node of the loop's body, not entering functions, classes or lambdas defined there."""
    return iter_subtree(loop.body, skip_inside=_DEFERRED)


def names_in(node: cst.CSTNode) -> set[str]:
    return {n.value for n in iter_subtree(node) if isinstance(n, cst.Name)}


def slice_names(subscript: cst.Subscript) -> set[str]:
    """The names a subscript's index mentions: `i` in `x[i]`, `x[i, j]`, `x[:, i]`, `x[i:i + 1]`."""
    found: set[str] = set()
    for element in subscript.slice:
        found |= names_in(element.slice)
    return found


def is_container_name(name: str) -> bool:
    return bool(_CONTAINER_NAME.search(name))


def _int_value(expr: cst.BaseExpression) -> int | None:
    if isinstance(expr, cst.Integer):
        return int(expr.value, 0)
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    ):
        return -int(expr.expression.value, 0)
    return None


def _dim_of_size(expr: cst.BaseExpression) -> tuple[cst.BaseExpression, int | None] | None:
    """`x.size(0)`, `x.size()[0]`, `x.shape[0]` -> (x, 0); `len(x)` -> (x, 0); `x.numel()` -> (x, None)."""
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Name) and func.value == "len" and len(expr.args) == 1:
            return expr.args[0].value, 0
        if isinstance(func, cst.Attribute) and func.attr.value == "size" and len(expr.args) == 1:
            return func.value, _int_value(expr.args[0].value)
        if isinstance(func, cst.Attribute) and func.attr.value in ("numel", "nelement") and not expr.args:
            return func.value, None
        return None
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        dim = _int_value(expr.slice[0].slice.value)
        shape = _shape_of(expr.value)
        if dim is not None and shape is not None:
            return shape, dim
    return None


def _shape_of(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`x.shape` / `x.size()` -> x."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "shape":
        return expr.value
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "size"
        and not expr.args
    ):
        return expr.func.value
    return None


def tensor_size(
    expr: cst.BaseExpression, ctx, scope: Scope, depth: int = 0
) -> tuple[cst.BaseExpression, int | None] | None:
    """When `expr` is the size of a tensor along one dimension (or its element count), that tensor and
    the dimension (None: every element). A name counts when each of its bindings is such a size:
    `batch_size = x.size(0)`, `B, T, C = x.shape`."""
    found = _dim_of_size(expr)
    if found is not None:
        tensor, _ = found
        if is_container_name(terminal_name(tensor) or ""):
            return None  # `len(output_list)`, `range(len(tuple_base))`: a Python container
        return found if _kind(tensor, ctx, scope) in TENSORS else None
    if isinstance(expr, cst.Name) and depth < 2:
        lookup = scope.lookup(expr.value)
        if lookup is None or not lookup[0]:
            return None
        results = []
        for binding in lookup[0]:
            if binding.kind == "value":
                result = tensor_size(binding.value, ctx, binding.scope, depth + 1)
            elif binding.kind == "element":
                shape = _shape_of(binding.value)
                result = (
                    (shape, binding.position)
                    if shape is not None and _kind(shape, ctx, binding.scope) in TENSORS
                    else None
                )
            else:
                result = None
            if result is None:
                return None
            results.append(result)
        return results[0]
    return None


def _kind(expr: cst.BaseExpression, ctx, scope: Scope) -> Kind:
    return tensor_kind(expr, ctx, scope)


def tensor_kind(expr: cst.BaseExpression, ctx, scope: Scope | None = None) -> Kind:
    """ctx.kind, also seeing through tuple assignments that the engine leaves unknown:
    `x, y = x.to(device), y.to(device)` makes `x` whatever `x.to(device)` is; and knowing that a
    tokenizer's output without `return_tensors=` is Python lists (`ids = tokenizer.encode(token)`)."""
    scope = ctx.scope if scope is None else scope
    if tokenizer_output(expr, scope):
        return Kind.NOT_TENSOR
    kind = ctx.tensors.kind(expr, scope)
    if kind is not Kind.UNKNOWN or not isinstance(expr, cst.Name):
        return kind
    found = scope.lookup(expr.value)
    if found is None or not found[0]:
        return kind
    kinds = []
    moves = False
    for binding in found[0]:
        value = binding.value
        if binding.kind == "value" and _moves_name(value, expr.value):
            moves = True  # `x = x.to(device)` after `for x in loader`
            continue
        if (
            binding.kind == "element"
            and isinstance(value, (cst.Tuple, cst.List))
            and binding.position < len(value.elements)
        ):
            element = value.elements[binding.position].value
            if _moves_name(element, expr.value):
                moves = True  # `x, y = x.to(device), y.to(device)`: where the other bindings say, then moved
                continue
            kinds.append(ctx.tensors.kind(element, binding.scope))
        elif binding.kind in ("value", "augment", "element", "loop"):
            kinds.append(ctx.tensors.binding_kind(binding))
        else:
            kinds.append(Kind.UNKNOWN)
    if Kind.TENSOR in kinds or (moves and Kind.HOST_TENSOR in kinds):
        return Kind.TENSOR
    if Kind.HOST_TENSOR in kinds and all(k in TENSORS for k in kinds):
        return Kind.HOST_TENSOR
    return kind


# What a tokenizer gives back as Python lists of token ids (or of tokens) unless told `return_tensors=`.
_TOKENIZER_METHODS = frozenset(
    {"encode", "convert_tokens_to_ids", "tokenize", "__call__", "encode_plus", "batch_encode_plus"}
)


def tokenizer_output(expr: cst.BaseExpression, scope: Scope, depth: int = 0) -> bool:
    """Is `expr` what a tokenizer returns without `return_tensors=`: `tokenizer.encode(text)`,
    `tokenizer(text).input_ids`, or a name bound only to such? Token ids in a Python list, not a batch."""
    inner = expr
    while isinstance(inner, (cst.Attribute, cst.Subscript)):
        inner = inner.value
    if isinstance(inner, cst.Call):
        expr = inner  # `tokenizer(text).input_ids`, `tokenizer(text)["input_ids"]`
    if isinstance(expr, cst.Call):
        func = expr.func
        if isinstance(func, cst.Attribute) and func.attr.value in _TOKENIZER_METHODS:
            receiver = func.value
        elif isinstance(func, (cst.Name, cst.Attribute)):
            receiver = func  # `tokenizer(text)`, `self.tokenizer(text)`
        else:
            return False
        return "tokenizer" in (terminal_name(receiver) or "").lower() and not any(
            arg.star or (arg.keyword is not None and arg.keyword.value == "return_tensors") for arg in expr.args
        )
    if isinstance(expr, cst.Name) and depth < 2:
        found = scope.lookup(expr.value)
        bindings = found[0] if found else []
        return bool(bindings) and all(
            b.kind == "value" and tokenizer_output(b.value, b.scope, depth + 1) for b in bindings
        )
    return False


def _moves_name(expr: cst.BaseExpression, name: str) -> bool:
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in ("to", "cuda")
        and isinstance(expr.func.value, cst.Name)
        and expr.func.value.value == name
    )


def range_bound(iterable: cst.BaseExpression) -> cst.BaseExpression | None:
    """The stop of `range(stop)` / `range(0, stop)` (a stride means chunks, not elements)."""
    if not (isinstance(iterable, cst.Call) and terminal_name(iterable.func) in ("range", "trange")):
        return None
    args = [arg.value for arg in iterable.args if arg.keyword is None]
    if len(args) != len(iterable.args):
        return None
    if len(args) == 1:
        return args[0]
    if len(args) == 2 and _int_value(args[0]) == 0:
        return args[1]
    return None


def unwrap_enumerate(iterable: cst.BaseExpression, targets: cst.BaseExpression):
    """`enumerate(x)` with target `(i, item)` -> (x, item's target)."""
    if (
        isinstance(iterable, cst.Call)
        and terminal_name(iterable.func) == "enumerate"
        and iterable.args
        and iterable.args[0].keyword is None
        and isinstance(targets, cst.Tuple)
        and len(targets.elements) == 2
    ):
        return iterable.args[0].value, targets.elements[1].value
    return iterable, targets


def is_recurrence(loop: cst.For | cst.While) -> bool:
    """Does an iteration read what the previous one assigned: `h = cell(x[t], h)`,
    `hx, cx = rnn(x[i], (hx, cx))`? Reductions (`total = total + y`, `loss += ...`) are not, nor a
    name the same iteration assigned first (`w = x[i].sum(); w = normalize(w)`)."""
    earlier: set[str] = set()  # assigned by this iteration before the statement at hand
    for node in body_nodes(loop):
        if not isinstance(node, cst.Assign):
            continue
        assigned = {name for target in node.targets for name in target_names(target.target)}
        carried = assigned & names_in(node.value) - earlier
        earlier |= assigned
        if not carried:
            continue
        value = node.value
        if isinstance(value, cst.BinaryOperation) and (
            (isinstance(value.right, cst.Name) and value.right.value in carried) or _leftmost(value) in carried
        ):
            continue  # total = total + x, loss = loss + a * b + c
        return True
    return False


def _leftmost(expr: cst.BaseExpression) -> str | None:
    while isinstance(expr, cst.BinaryOperation):
        expr = expr.left
    return expr.value if isinstance(expr, cst.Name) else None


def is_ragged(loop: cst.For | cst.While, variables: set[str]) -> bool:
    """Does the body slice rows to per-element lengths: `x[i, :lengths[i]]`, `seq[:len(tokens[i])]`?"""
    for node in body_nodes(loop):
        if not isinstance(node, cst.Slice):
            continue
        for bound in (node.lower, node.upper):
            if bound is None:
                continue
            for inner in iter_subtree(bound):
                if isinstance(inner, cst.Subscript) and names_in(inner) & variables:
                    return True
                if isinstance(inner, cst.Call) and terminal_name(inner.func) == "len":
                    return True
    return False


def body_assigned_from(loop: cst.For, variables: set[str]) -> set[str]:
    """The loop variables plus names the body assigns from them: `xi = x[i]`, `idx = ids[b].item()`."""
    found = set(variables)
    for _ in range(2):
        for node in body_nodes(loop):
            if isinstance(node, cst.Assign) and names_in(node.value) & found:
                for target in node.targets:
                    found.update(target_names(target.target))
    return found


def sized_range_loop(loop: cst.For, ctx, scope: Scope) -> tuple[cst.BaseExpression, int | None] | None:
    """For `for i in range(<size of a tensor>)`: the tensor and the dimension."""
    iterable, _ = unwrap_enumerate(loop.iter, loop.target)
    bound = range_bound(iterable)
    return tensor_size(bound, ctx, scope) if bound is not None else None


def step_like(loop_node: cst.For | cst.While, ctx) -> bool:
    """A step loop (it trains, or pulls batches), or an epoch loop around one: not a per-element loop."""
    info = ctx.index.loops_by_node.get(id(loop_node))
    if info is None:
        return True
    return ctx.steps.is_step_loop(info) or ctx.steps.has_inner_step_loop(info)
