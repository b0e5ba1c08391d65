"""Reading the settings a script passes, such as a DataLoader's `num_workers`, statically.

A setting is a literal (`4`, `True`), a name bound only to one, a command-line option with a declared
default (`args.workers` after `add_argument("--workers", default=4)`), or a parameter whose callers
pass one of those: in this module, or (through the project facts) in another.

`at` is where the expression is read: anything with `scope`, `index` and `steps`, such as a rule's
context.
"""

from __future__ import annotations

import libcst as cst

from .names import terminal_name
from .module_index import argument_for, named_param

_ARITHMETIC = {
    cst.Multiply: lambda a, b: a * b, cst.Divide: lambda a, b: a / b, cst.FloorDivide: lambda a, b: a // b,
    cst.Add: lambda a, b: a + b, cst.Subtract: lambda a, b: a - b,
}
UNKNOWN = object()  # a value that is passed but cannot be read statically (`**kwargs`, `cfg.workers`)


def _without_int(expr):
    """`int(opt.workers)` -> `opt.workers`: the cast changes nothing these rules read."""
    if isinstance(expr, cst.Call) and terminal_name(expr.func) == "int" and len(expr.args) == 1:
        return expr.args[0].value
    return expr


def constant(expr, at, depth: int = 0):
    """The value of a literal (`True`, `0`, `4`), or of a name bound only to the same literal; else UNKNOWN."""
    expr = _without_int(expr)
    if isinstance(expr, cst.Name):
        if expr.value in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[expr.value]
        if depth >= 2:
            return UNKNOWN
        found = at.scope.lookup(expr.value)
        if not found or not found[0] or expr.value in found[1].params:
            return UNKNOWN
        values = [constant(b.value, at, depth + 1) if b.kind == "value" else UNKNOWN for b in found[0]]
        if any(value is UNKNOWN for value in values) or len(set(values)) != 1:
            return UNKNOWN
        return values[0]
    if isinstance(expr, cst.Integer):
        return int(expr.evaluated_value)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus) and isinstance(expr.expression, cst.Integer):
        return -int(expr.expression.evaluated_value)
    return UNKNOWN


def command_line_default(expr, at, depth: int = 0):
    """`args.workers` -> 4 when the module declares `parser.add_argument("-j", "--workers", default=4)`
    (once, with a literal default): what the script runs with unless told otherwise. Else UNKNOWN."""
    expr = _without_int(expr)
    if isinstance(expr, cst.Name):
        return _passed_command_line_default(expr.value, at, depth)
    if isinstance(expr, cst.BinaryOperation) and (operate := _ARITHMETIC.get(type(expr.operator))) is not None:
        # `int(num_workers / 2)` for the test loader: the same arithmetic on the defaults
        left, right = setting_value(expr.left, at, depth), setting_value(expr.right, at, depth)
        if type(left) is int and type(right) is int and not (right == 0 and isinstance(expr.operator, (cst.Divide, cst.FloorDivide))):
            return int(operate(left, right))
        return UNKNOWN
    if not isinstance(expr, cst.Attribute) or not isinstance(expr.value, cst.Name):
        return UNKNOWN
    return _argparse_defaults(at).get(expr.attr.value, UNKNOWN)


def _passed_command_line_default(name: str, at, depth: int):
    """`def make_loader(path, n_cpu): DataLoader(..., num_workers=n_cpu)` called as
    `make_loader(path, args.n_cpu)` (YOLOv3): the setting every caller passes, here or in another
    module, followed through the callers' own parameters (`n_cpu=8` of the function that calls it)."""
    found = at.scope.lookup(name)
    if depth > 3 or not found or found[0] or name not in found[1].params or found[1].function is None:
        return UNKNOWN
    function = at.steps.function_info(found[1].function)
    if function is None:
        return UNKNOWN
    values = _passed_by_other_modules(name, function, at)
    for site in function.call_sites[:8]:
        argument = argument_for(function, name, site.call)
        if argument is None:
            argument = _default_of(function, name)  # not passed: the parameter's default applies
        values.add(setting_value(argument, At(site.scope, at.index, at.steps), depth + 1) if argument is not None else UNKNOWN)
    return values.pop() if len(values) == 1 else UNKNOWN


def _default_of(function, name: str) -> cst.BaseExpression | None:
    param = named_param(function.node, name)
    return param.default if param is not None else None


def _argparse_defaults(at) -> dict:
    # Once per analysis, so kept on the analysis's step model, not on the index, which a later round
    # reuses: a default may be read from what other modules pass (the facts change between rounds).
    cached = getattr(at.steps, "_la2_argparse_defaults", None)
    if cached is not None:
        return cached
    defaults: dict = {}
    for site in at.index.calls:
        call = site.call
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value != "add_argument":
            continue
        options = [a.value.evaluated_value for a in call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        dest_expr = keywords.get("dest")
        if isinstance(dest_expr, cst.SimpleString):
            dest = dest_expr.evaluated_value
        else:
            long_options = [o for o in options if isinstance(o, str) and o.startswith("--")]
            dest = long_options[0][2:].replace("-", "_") if long_options else None
        if not dest:
            continue
        default = keywords.get("default")
        value = constant(default, at, depth=2) if default is not None else UNKNOWN
        if dest in defaults and defaults[dest] != value:
            value = UNKNOWN  # declared twice with different defaults
        defaults[dest] = value
    at.steps._la2_argparse_defaults = defaults
    return defaults




def setting_value(expr: cst.BaseExpression, at, depth: int = 0):
    """The value `expr` has when the script runs with its defaults: a literal, or a command-line
    option's declared default; else UNKNOWN."""
    value = constant(expr, at)
    return command_line_default(expr, at, depth) if value is UNKNOWN else value


class At:
    """A place where an expression is read: its scope, in a module's index and per-step model."""

    def __init__(self, scope, index, steps) -> None:
        self.scope, self.index, self.steps = scope, index, steps


def _passed_by_other_modules(name: str, function, at) -> set:
    """What the callers in other modules pass for parameter `name` of `function`
    (`get_loaders(num_workers=opt.workers)` in train.py, default 8), as the project facts say."""
    facts = at.steps.facts
    if facts is None:
        return set()
    return {value for qualname, param, value in facts.argument_values if qualname == function.qualname and param == name}
