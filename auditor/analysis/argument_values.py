"""Reading the settings a script passes, such as a DataLoader's `num_workers`, statically.

A setting is a literal (`4`, `True`), a name bound only to one, a command-line option with a declared
default (`args.workers` after `add_argument("--workers", default=4)`), or a parameter whose callers
pass one of those: in this module, or (through the project facts) in another.

`at` is where the expression is read: anything with `scope`, `index` and `steps`, such as a rule's
context.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from loopaudit.analysis.module_index import argument_for, named_param
from loopaudit.analysis.names import dotted_name, terminal_name

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Protocol

    from loopaudit.analysis.module_index import FunctionInfo, ModuleIndex, Scope
    from loopaudit.analysis.stepmodel import StepModel

    class _Place(Protocol):
        """Where an expression is read: `At`, or a rule's context."""

        @property
        def scope(self) -> Scope: ...
        @property
        def index(self) -> ModuleIndex: ...
        @property
        def steps(self) -> StepModel: ...


_ARITHMETIC: dict[type[cst.BaseBinaryOp], Callable[[int, int], float]] = {
    cst.Multiply: lambda a, b: a * b,
    cst.Divide: lambda a, b: a / b,
    cst.FloorDivide: lambda a, b: a // b,
    cst.Add: lambda a, b: a + b,
    cst.Subtract: lambda a, b: a - b,
}
UNKNOWN = object()  # a value that is passed but cannot be read statically (`**kwargs`, `cfg.workers`)


def _without_int(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`int(opt.workers)` -> `opt.workers`: the cast changes nothing these rules read."""
    if isinstance(expr, cst.Call) and terminal_name(expr.func) == "int" and len(expr.args) == 1:
        return expr.args[0].value
    return expr


def constant(expr: cst.BaseExpression, at: _Place, depth: int = 0) -> object:
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
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    ):
        return -int(expr.expression.evaluated_value)
    return UNKNOWN


def command_line_default(expr: cst.BaseExpression, at: _Place, depth: int = 0) -> object:
    """`args.workers` -> 4 when the module declares `parser.add_argument("-j", "--workers", default=4)`
    (once, with a literal default): what the script runs with unless told otherwise. Else UNKNOWN."""
    expr = _without_int(expr)
    if isinstance(expr, cst.Name):
        return _passed_command_line_default(expr.value, at, depth)
    if isinstance(expr, cst.BinaryOperation) and (operate := _ARITHMETIC.get(type(expr.operator))) is not None:
        # `int(num_workers / 2)` for the test loader: the same arithmetic on the defaults
        left, right = setting_value(expr.left, at, depth), setting_value(expr.right, at, depth)
        if (
            type(left) is int
            and type(right) is int
            and not (right == 0 and isinstance(expr.operator, (cst.Divide, cst.FloorDivide)))
        ):
            return int(operate(left, right))
        return UNKNOWN
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        key = expr.slice[0].slice.value  # `cfg["num_workers"]`, `cfg["training"]["n_workers"]`
        if isinstance(key, cst.SimpleString) and _keyed_path(expr.value):
            name = key.evaluated_value
            if not isinstance(name, str):
                return UNKNOWN
            return _argparse_defaults(at).get(name, _config_file_value(name, at))
        return UNKNOWN
    if not isinstance(expr, cst.Attribute) or dotted_name(expr.value) is None:
        return UNKNOWN
    # `args.workers`, `self.args.num_workers`, `hparams.num_workers`, `config.DATA.NUM_WORKERS`: read
    # by the option's or the key's name; a configuration object's also from the YAML files
    # (`cfg.num_workers` with Hydra)
    defaults = _argparse_defaults(at)
    if expr.attr.value in defaults or not _CONFIGURATION_ROOT.match(dotted_name(expr.value) or ""):
        return defaults.get(expr.attr.value, UNKNOWN)
    return _config_file_value(expr.attr.value, at)


# A configuration object read by attribute: `cfg.x`, `self.config.x`, `conf.data.x`, `hparams.x`.
_CONFIGURATION_ROOT = re.compile(r"^(self\.)?(cfg|config|conf|configs|hparams|hp)(\.|$)", re.I)


def _keyed_path(expr: cst.BaseExpression) -> bool:
    """`cfg` or `cfg["training"]`: a name, or string keys on one, that a setting is looked up in."""
    while isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        if not isinstance(expr.slice[0].slice.value, cst.SimpleString):
            return False
        expr = expr.value
    return dotted_name(expr) is not None


def _config_file_value(name: str, at: _Place) -> object:
    """The value the repository's YAML configuration files agree on for key `name`, else UNKNOWN."""
    facts = at.steps.facts
    values = dict(facts.config_file_values) if facts is not None else {}
    return values.get(name, UNKNOWN)


def _passed_command_line_default(name: str, at: _Place, depth: int) -> object:
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
        values.add(
            setting_value(argument, At(site.scope, at.index, at.steps), depth + 1) if argument is not None else UNKNOWN
        )
    return values.pop() if len(values) == 1 else UNKNOWN


def _default_of(function: FunctionInfo, name: str) -> cst.BaseExpression | None:
    param = named_param(function.node, name)
    return param.default if param is not None else None


def _argparse_defaults(at: _Place) -> dict[str, object]:
    """The declared defaults of the command-line options, by destination: this module's own, then
    those the project facts carry from the other modules (the parser in run.py, read in a data
    factory that gets `args` handed down)."""
    # Once per analysis, so kept on the analysis's step model, not on the index, which a later round
    # reuses: a default may be read from what other modules pass (the facts change between rounds).
    cached = at.steps.argparse_defaults
    if cached is not None:
        return cached
    defaults = declared_defaults(at)
    facts = at.steps.facts
    for dest, value in facts.command_line_defaults if facts is not None else ():
        defaults.setdefault(dest, value)
    at.steps.argparse_defaults = defaults
    return defaults


def declared_defaults(at: _Place) -> dict[str, object]:
    """This module's declared settings: the defaults of its `add_argument(..., default=...)` options
    by destination, and the keys of its module-level configuration objects (`hparams =
    HParams(num_workers=16)`, `CFG = {"workers": 4}`, yacs' `_C.DATA.NUM_WORKERS = 8`). A key maps to
    UNKNOWN when its value is no literal, or when it is declared twice with different ones."""
    defaults: dict[str, object] = {}

    def declare(key: str | bytes, value: object) -> None:
        if not isinstance(key, str):
            return  # `dest=b"x"`, `CFG[b"k"]`: no setting a script reads (argparse refuses a bytes dest)
        defaults[key] = UNKNOWN if key in defaults and defaults[key] != value else value

    def declare_default(key: str | bytes, default: cst.BaseExpression | None) -> None:
        if isinstance(default, cst.SimpleString) and isinstance(default.evaluated_value, str):
            declare(key, default.evaluated_value)  # `default="cuda"`: a device the script runs on
        elif default is not None and counts_cpus(default, at):
            declare(key, CPU_COUNT)  # `default=mp.cpu_count() - 1`
        else:
            declare(key, constant(default, at, depth=2) if default is not None else UNKNOWN)

    for key, value in _configuration_keys(at):
        declare(key, value)
    for site in at.index.calls:
        call = site.call
        flag = _absl_flag(call)
        if flag is not None:
            declare_default(*flag)  # `flags.DEFINE_integer('num_workers', 4, '...')`, read as `FLAGS.num_workers`
            continue
        if not isinstance(call.func, cst.Attribute) or call.func.attr.value != "add_argument":
            continue
        options = [
            a.value.evaluated_value for a in call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)
        ]
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        dest_expr = keywords.get("dest")
        dest: str | bytes | None  # (`dest=b"x"` reads as bytes)
        if isinstance(dest_expr, cst.SimpleString):
            dest = dest_expr.evaluated_value
        else:
            long_options = [o for o in options if isinstance(o, str) and o.startswith("--")]
            dest = long_options[0][2:].replace("-", "_") if long_options else None
        if not dest:
            continue
        declare_default(dest, keywords.get("default"))
    return defaults


def _absl_flag(call: cst.Call) -> tuple[str, cst.BaseExpression | None] | None:
    """(name, default) of an absl flag declaration: `flags.DEFINE_integer('num_workers', 4, 'help')`,
    `DEFINE_bool(name='parallel', default=False, help=...)`."""
    if not (terminal_name(call.func) or "").startswith("DEFINE_"):
        return None
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
    name = keywords.get("name", positional[0] if positional else None)
    default = keywords.get("default", positional[1] if len(positional) > 1 else None)
    if not isinstance(name, cst.SimpleString) or not isinstance(name.evaluated_value, str):
        return None
    return name.evaluated_value, default


# What builds a configuration object: HParams, EasyDict, edict, dict, SimpleNamespace, AttrDict, CfgNode.
_CONFIGURATION_MAKER = re.compile(r"(?i)param|conf|cfg|dict|namespace|args|option|opts|setting|^hp")


def _configuration_keys(at: _Place) -> Iterator[tuple[str, object]]:
    """(key, value) of the module-level configuration objects: keyword arguments of a call bound to a
    name (`HParams(...)`, `EasyDict(...)`, `dict(...)`), string keys of a dict literal, and
    attribute paths set to a literal (`_C.DATA.PIN_MEMORY = True`)."""
    settings_module = _is_settings_module(at.index.module)
    for statement in at.index.module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if not isinstance(small, cst.Assign) or len(small.targets) != 1:
                continue
            target, value = small.targets[0].target, small.value
            if isinstance(target, cst.Name) and settings_module:
                yield target.value, constant(value, at, depth=2)  # `workers = 4` in config.py
            elif isinstance(target, cst.Attribute):
                yield target.attr.value, constant(value, at, depth=2)
            elif isinstance(value, cst.Call) and _CONFIGURATION_MAKER.search(terminal_name(value.func) or ""):
                for arg in value.args:
                    if arg.keyword is not None:
                        yield arg.keyword.value, constant(arg.value, at, depth=2)
            elif isinstance(value, cst.Dict):
                for element in value.elements:
                    if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                        key = element.key.evaluated_value
                        if isinstance(key, str) and key.isidentifier():
                            yield key, constant(element.value, at, depth=2)


def _is_settings_module(module: cst.Module) -> bool:
    """A module of settings only (WS-DAN's config.py: `workers = 4`, `epochs = 160`, read elsewhere as
    `config.workers`): assignments and imports at the top level, no function, class or loop."""
    assignments = 0
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            return False
        assignments += sum(1 for small in statement.body if isinstance(small, cst.Assign))
    return assignments >= 3


def setting_value(expr: cst.BaseExpression, at: _Place, depth: int = 0) -> object:
    """The value `expr` has when the script runs with its defaults: a literal, or a command-line
    option's declared default; else UNKNOWN."""
    value = constant(expr, at)
    return command_line_default(expr, at, depth) if value is UNKNOWN else value


class At:
    """A place where an expression is read: its scope, in a module's index and per-step model."""

    def __init__(self, scope: Scope, index: ModuleIndex, steps: StepModel) -> None:
        self.scope, self.index, self.steps = scope, index, steps


def _passed_by_other_modules(name: str, function: FunctionInfo, at: _Place) -> set[object]:
    """What the callers in other modules pass for parameter `name` of `function`
    (`get_loaders(num_workers=opt.workers)` in train.py, default 8), as the project facts say."""
    facts = at.steps.facts
    if facts is None:
        return set()
    return {
        value for qualname, param, value in facts.argument_values if qualname == function.qualname and param == name
    }


_CPU_COUNTS = frozenset({"os.cpu_count", "multiprocessing.cpu_count", "psutil.cpu_count", "torch.get_num_threads"})


# The declared default of a setting that counts the machine's CPUs (`default=mp.cpu_count() - 1`).
CPU_COUNT = "one per CPU"


def counts_cpus(expr: cst.BaseExpression, at: _Place) -> bool:
    """`cpu_count()`, `os.cpu_count()`, `min(8, os.cpu_count())`, `mp.cpu_count() - 1`: as many as the
    machine has CPUs (or one fewer, or half), a positive number unknown until it runs."""
    expr = _without_int(expr)
    if (
        isinstance(expr, cst.BinaryOperation)
        and isinstance(expr.operator, (cst.Subtract, cst.FloorDivide, cst.Divide))
        and isinstance(expr.right, cst.Integer)
        and int(expr.right.evaluated_value) <= 2
    ):
        return counts_cpus(expr.left, at)
    if not isinstance(expr, cst.Call):
        return False
    qualified = at.index.imports.qualify(expr.func) or ""
    if qualified in _CPU_COUNTS or (qualified == "" and terminal_name(expr.func) == "cpu_count"):
        return True
    if terminal_name(expr.func) in ("min", "max") and isinstance(expr.func, cst.Name):
        counts = [arg.value for arg in expr.args if not arg.star]
        return any(counts_cpus(c, at) for c in counts) and all(
            counts_cpus(c, at) or (type(v := constant(c, at)) is int and v > 0) for c in counts
        )
    return False
