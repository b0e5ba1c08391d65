"""Branches that a parameter's value selects: `if skip_type == 'logSNR':`, `elif method == 'singlestep':`,
`if adaptive_step_size:`.

Samplers, solvers and model blocks choose their code path by an option their callers pass. Only the
arms some caller can select run per step; the others are alternatives the project never takes, and
what they do is no cost of this run. An arm counts as taken when a value the callers pass (here or,
through the project facts, in another module), or the parameter's default where a caller leaves it
out (an option inside `**kwargs` counts as left out), satisfies the test; or when any caller passes
something that cannot be read statically (`mode=args.mode`).

A test is read as an option only in the simple shapes that compare a parameter with literals:
`p == "a"`, `p != 1`, `p in ("a", "b")`, `p or q` of such tests, and a bare `p` / `not p` where the
parameter's default is a bool literal. An object's setting counts too,
compared the same way (`if self.schedule == 'linear':`): its values are what `__init__` stores
(`self.schedule = schedule`), so what the constructions pass. So does a flag the code sets itself
(`classify = False` ... `if classify:`): a name bound only to literals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import libcst as cst

from loopaudit.analysis.names import param_default

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Protocol

    # What constant_flag reads of a scope and its bindings: module_index's Scope and Binding, which
    # this module does not import (module_index imports it).
    class _Binding(Protocol):
        @property
        def kind(self) -> str: ...
        @property
        def value(self) -> cst.BaseExpression: ...

    class _Scope(Protocol):
        @property
        def params(self) -> set[str]: ...
        def lookup(self, name: str) -> tuple[Sequence[_Binding], _Scope] | None: ...


# A value passed that cannot be read statically (`skip_type=cfg.skip`): every arm may be taken.
UNREAD = object()


@dataclass(frozen=True)
class OptionTest:
    param: str  # the parameter, or "self.<attribute>" for an object's setting
    takes: Callable[[object], bool]  # does this value of the parameter take the branch?


def literal(expr: cst.BaseExpression | None) -> object:
    """The value of a literal (`'logSNR'`, `3`, `True`, `None`, `-1`), else UNREAD."""
    if isinstance(expr, cst.SimpleString):
        text = expr.evaluated_value
        # A bytes literal (`f(b"\n")`) selects no option, and a summary cannot carry it as JSON.
        return text if isinstance(text, str) else UNREAD
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.Float):
        return float(expr.evaluated_value)
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        value = literal(expr.expression)
        # (the cast: mypy does not narrow by `type(value) in (...)`)
        return -cast("int | float", value) if type(value) in (int, float) else UNREAD
    return UNREAD


def default_of(function: cst.FunctionDef | None, name: str) -> object:
    """The literal default of `function`'s parameter `name` (UNREAD: none, or not a literal)."""
    default = param_default(function, name)
    return literal(default) if default is not None else UNREAD


def option_test(test: cst.BaseExpression, function: cst.FunctionDef | None) -> OptionTest | None:
    """The option an `if` test reads, when it is one of the simple shapes above. (Whether the
    parameter is assigned anew before the test is for the caller to ask: the scope knows.)"""
    if function is None:
        return None
    params = {
        p.name.value for p in (*function.params.posonly_params, *function.params.params, *function.params.kwonly_params)
    }
    return _read(test, params, function)


def _read(test: cst.BaseExpression, params: set[str], function: cst.FunctionDef) -> OptionTest | None:
    if isinstance(test, cst.Name) and test.value in params and type(default_of(function, test.value)) is bool:
        return OptionTest(test.value, bool)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = _read(test.expression, params, function)
        # (the casts: mypy cannot infer the type of a lambda with defaults)
        return (
            OptionTest(inner.param, cast("Callable[[object], bool]", lambda value, takes=inner.takes: not takes(value)))
            if inner is not None
            else None
        )
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
        either, other = _read(test.left, params, function), _read(test.right, params, function)
        if either is None or other is None or either.param != other.param:
            return None
        return OptionTest(
            either.param,
            cast("Callable[[object], bool]", lambda value, a=either.takes, b=other.takes: a(value) or b(value)),
        )
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return None
    left, (target,) = test.left, test.comparisons
    right, operator = target.comparator, target.operator
    if _setting(right, params) is not None and isinstance(operator, (cst.Equal, cst.NotEqual)):
        left, right = right, left  # `'logSNR' == skip_type`
    name = _setting(left, params)
    if name is None:
        return None
    if isinstance(operator, (cst.Equal, cst.NotEqual)):
        wanted = literal(right)
        if wanted is UNREAD or wanted is None:
            return None
        equal = isinstance(operator, cst.Equal)
        return OptionTest(name, lambda value: (value == wanted) == equal)
    if isinstance(operator, (cst.In, cst.NotIn)) and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
        choices = [literal(element.value) for element in right.elements]
        if any(choice is UNREAD for choice in choices):
            return None
        inside = isinstance(operator, cst.In)
        return OptionTest(name, lambda value: (value in choices) == inside)
    return None


def _setting(expr: cst.BaseExpression, params: set[str]) -> str | None:
    """`skip_type` (a parameter) or "self.schedule" (an object's setting) for what a test compares."""
    if isinstance(expr, cst.Name) and expr.value in params:
        return expr.value
    if (
        isinstance(expr, cst.Attribute)
        and isinstance(expr.value, cst.Name)
        and expr.value.value == "self"
        and "self" in params
    ):
        return f"self.{expr.attr.value}"
    return None


def constant_flag(test: cst.BaseExpression, scope: _Scope) -> str | None:
    """The name an `if name:` / `if not name:` tests, when every binding of it seen so far is a literal
    (`classify = False`): a flag the code sets itself. (Not a parameter: option_test reads those.)"""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        test = test.expression
    if not isinstance(test, cst.Name) or test.value in ("True", "False", "None"):
        return None
    found = scope.lookup(test.value)
    if found is None or not found[0] or test.value in found[1].params:
        return None
    return test.value if all(b.kind == "value" and literal(b.value) is not UNREAD for b in found[0]) else None
