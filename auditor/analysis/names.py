"""Resolve names to what they mean through the module's own imports.

`import torch as T`, `from torch.cuda import empty_cache` and `from torch.utils import data as tud`
all become entries of one table, so `T.cuda.synchronize`, `empty_cache` and `tud.DataLoader` resolve to
`torch.cuda.synchronize`, `torch.cuda.empty_cache` and `torch.utils.data.DataLoader`. This replaces
libcst's QualifiedNameProvider, which costs several parses' worth of time per file because it resolves
every node; we only ever resolve the few expressions a rule asks about.
"""

from __future__ import annotations

import libcst as cst


def dotted_name(node: cst.BaseExpression) -> str | None:
    """`a.b.c` as text, or None for anything that is not a plain dotted name."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def terminal_name(node: cst.BaseExpression) -> str | None:
    """The last identifier of a name or attribute chain: `self.model` -> `model`."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    return None


# Library modules by the names code conventionally imports them under.
_CONVENTIONAL_ALIASES = {"torch": "torch", "np": "numpy", "numpy": "numpy", "nn": "torch.nn"}


class ImportTable:
    """Maps local names bound by import statements to the qualified names they stand for."""

    def __init__(self) -> None:
        self._aliases: dict[str, str] = {}
        # Modules imported with `from layers import *` (relative ones keep their dots): a name no
        # import binds may come from one of them.
        self.star_modules: list[str] = []

    def add(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted_name(alias.name)
                if full is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self._aliases[alias.asname.name.value] = full
                else:
                    # `import torch.nn` binds `torch`, and `torch.nn.X` then resolves textually.
                    top = full.split(".")[0]
                    self._aliases.setdefault(top, top)
            return
        # A relative import names this project's code, never torch: it keeps its leading dots
        # (`from .engine import step` -> ".engine.step") for the project index to resolve.
        dots = "." * len(node.relative)
        module = dotted_name(node.module) if node.module is not None else ""
        if module is None:
            return
        if isinstance(node.names, cst.ImportStar):
            if module:
                self.star_modules.append(dots + module)
            return
        prefix = dots + module + "." if module else dots
        for alias in node.names:
            imported = dotted_name(alias.name)
            if imported is None:
                continue
            local = imported
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self._aliases[local] = prefix + imported

    def add_alias(self, local: str, qualified: str) -> None:
        """`autocast = torch.cuda.amp.autocast` at module level: the name stands for the torch API, as
        an import would make it."""
        self._aliases.setdefault(local, qualified)

    def qualify(self, node: cst.BaseExpression) -> str | None:
        """The qualified name of `node` if its first part was imported, else None."""
        text = dotted_name(node)
        if text is None:
            return None
        head, _, rest = text.partition(".")
        target = self._aliases.get(head)
        if target is None and self.star_modules:
            # `from utils import *` where utils imports torch: a module that uses `torch` without
            # importing it gets it from the star import, and the name means what it always means.
            target = _CONVENTIONAL_ALIASES.get(head)
        if target is None:
            return None
        return f"{target}.{rest}" if rest else target

    def imported_names(self) -> list[str]:
        return list(self._aliases.values())

    def imports_module(self, prefix: str) -> bool:
        return any(q == prefix or q.startswith(prefix + ".") for q in self._aliases.values())


def target_names(target: cst.BaseExpression) -> list[str]:
    """The names an assignment or `for` target binds: `x`, `i, (x, y)`."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in target_names(element.value)]
    return []


def string_key(subscript: cst.Subscript) -> str | bytes | None:
    """`"train"` in `loaders["train"]`: the one index of a subscript when it is a string literal."""
    if len(subscript.slice) != 1:
        return None
    index = subscript.slice[0].slice
    return (
        index.value.evaluated_value
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString)
        else None
    )


def stored_name(expr: cst.BaseExpression) -> str | None:
    """`loaders` or `self.loaders`: the name a value is kept under, as bound_names spells it."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name) and expr.value.value == "self":
        return "self." + expr.attr.value
    return None


def param_default(function: cst.FunctionDef | None, name: str) -> cst.BaseExpression | None:
    """The default `function` declares for its parameter `name` (None: no such parameter or no default)."""
    if function is None:
        return None
    params = function.params
    found = (p for p in (*params.posonly_params, *params.params, *params.kwonly_params) if p.name.value == name)
    return next((p.default for p in found), None)
