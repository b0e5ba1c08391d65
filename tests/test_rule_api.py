"""Rules reach the engine through one declared API, the `loopaudit.rule_api` package: the rule
contract, the context a check may ask, the analysis model's public names, the fix builders and, for
the measured rules, what a run or a trace says. Besides it, a rule imports only other files under
`rules/`. Nothing under `rules/` reads a private member of what the context hands it, and rule-level
caches go through `ctx.memoized`."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

import loopaudit.rule_api
import loopaudit.rule_api.registry

RULES = Path(__file__).resolve().parent.parent / "rules"
RULE_API = "loopaudit.rule_api"
RULE_FILES = sorted(RULES.rglob("*.py"))


def _imports(module: cst.Module) -> list[str]:
    found = []
    for node in _nodes(module):
        if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
            found.append(cst.Module([]).code_for_node(node.module))
        elif isinstance(node, cst.Import):
            found.extend(cst.Module([]).code_for_node(alias.name) for alias in node.names)
    return found


def _nodes(root: cst.CSTNode):
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children)


def _root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, (cst.Attribute, cst.Call, cst.Subscript)):
        node = node.value if not isinstance(node, cst.Call) else node.func
    return node.value if isinstance(node, cst.Name) else None


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(RULES)))
def test_rules_import_only_the_rule_api(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    internal = [name for name in _imports(module) if name.startswith("loopaudit")]
    outside = [name for name in internal if name != RULE_API and not name.startswith("loopaudit.rules.")]
    assert not outside, f"{path.name} imports engine internals: {outside}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(RULES)))
def test_rules_read_no_private_member_of_the_context(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    private = [
        cst.Module([]).code_for_node(node)
        for node in _nodes(module)
        if isinstance(node, cst.Attribute)
        and node.attr.value.startswith("_")
        and not node.attr.value.startswith("__")
        and _root_name(node.value) == "ctx"
    ]
    assert not private, f"{path.name} reads private members: {private}"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: str(p.relative_to(RULES)))
def test_rules_keep_no_cache_in_a_default_argument(path):
    module = cst.parse_module(path.read_text(encoding="utf-8"))
    mutable = [
        node.name.value
        for node in _nodes(module)
        if isinstance(node, cst.FunctionDef)
        and any(isinstance(p.default, (cst.Dict, cst.List, cst.Set)) for p in node.params.params)
    ]
    assert not mutable, f"{path.name}: a mutable default keeps state between analyses in {mutable}"


def test_rules_use_only_names_the_rule_api_declares():
    used = set()
    for path in RULE_FILES:
        for node in _nodes(cst.parse_module(path.read_text(encoding="utf-8"))):
            if isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative:
                if cst.Module([]).code_for_node(node.module) == RULE_API:
                    used.update(alias.name.value for alias in node.names)
    assert used, "no rule imports the rule API: the test reads the wrong folder"
    assert used <= set(loopaudit.rule_api.__all__), used - set(loopaudit.rule_api.__all__)
    missing = [name for name in loopaudit.rule_api.__all__ if not hasattr(loopaudit.rule_api, name)]
    assert not missing


def _rule_classes():
    return [rule for rule in loopaudit.rule_api.registry.all_rules()]


@pytest.mark.parametrize("rule", _rule_classes(), ids=lambda rule: rule.code)
def test_a_rule_file_and_class_are_named_after_the_rule(rule):
    """`item-in-step` lives in `item_in_step.py` as `class ItemInStep` (a name that would shadow a
    builtin, like `SyntaxError`, takes a `Rule` suffix), so a rule is found from its code's name."""
    stem = rule.__module__.rpartition(".")[2]
    assert stem == rule.name.replace("-", "_"), f"{rule.code}: rename {stem}.py to {rule.name.replace('-', '_')}.py"
    pascal = "".join(part.capitalize() for part in rule.name.split("-"))
    assert rule.__name__.lower() in (pascal.lower(), pascal.lower() + "rule"), f"{rule.code}: name the class {pascal}"
