"""The folder tree is the architecture: auditor/ holds a few top-level modules and one folder per
role, the roles import each other in one direction, and no module imports itself back through
others. Every import counts: module level, inside functions, and under `if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from .conftest import REPO

SOURCES = {"auditor": "loopaudit", "rules": "loopaudit.rules"}
MAX_TOP_LEVEL_MODULES = 8


def _module_name(path: Path) -> str:
    for folder, package in SOURCES.items():
        root = REPO / folder
        if path.is_relative_to(root) and not (folder == "auditor" and path.is_relative_to(REPO / "rules")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise ValueError(path)


def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for folder in SOURCES
        for path in sorted((REPO / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """The loopaudit modules `name` imports, wherever the import statement sits."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(candidate for candidate in candidates if candidate in MODULES and candidate != name)
    return found


GRAPH = {name: _imported(name, path) for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return circles


def test_the_graph_is_read_from_the_sources():
    assert "loopaudit.scan.engine" in GRAPH and "loopaudit.analysis.stepmodel" in GRAPH["loopaudit.scan.engine"]


def test_no_module_imports_itself_back():
    assert _circles(GRAPH) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_auditor_keeps_few_modules_at_its_top():
    top = sorted(path.name for path in (REPO / "auditor").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def _packages_imported_by(prefix: str) -> dict[str, set[str]]:
    return {
        name: {imported for imported in GRAPH[name] if not imported.startswith(prefix)}
        for name in GRAPH
        if name == prefix or name.startswith(prefix + ".")
    }


# What each role may import from the rest of loopaudit, besides itself. The analysis model sits at the
# bottom (rules and the scan ask it; it asks nobody); what runs inside the user's script stays
# self-contained; the scan never imports a rule module or a command.
LAYERS = {
    "loopaudit.analysis": ("loopaudit.digests",),
    "loopaudit.profiling.in_script": ("loopaudit.atomic",),
    "loopaudit.findings": ("loopaudit", "loopaudit.atomic", "loopaudit.reporting.safe_text"),
    "loopaudit.rule_api": ("loopaudit.analysis", "loopaudit.profiling.in_loopaudit"),
    "loopaudit.scan": (
        "loopaudit",
        "loopaudit.atomic",
        "loopaudit.digests",
        "loopaudit.analysis",
        "loopaudit.findings",
        "loopaudit.rule_api",
    ),
    "loopaudit.rules": ("loopaudit.rule_api",),
    # A user's test suite imports it: the spy that runs in the script's process and the scan's reading
    # of suppression comments, nothing of the commands or the analysis.
    "loopaudit.testing": ("loopaudit.profiling.in_script", "loopaudit.scan.suppression"),
    # The editor's scan: the scan and what it stands on, nothing of the commands or the dynamic mode.
    "loopaudit.server": (
        "loopaudit",
        "loopaudit.analysis",
        "loopaudit.configuration",
        "loopaudit.findings",
        "loopaudit.rule_api",
        "loopaudit.scan",
    ),
}


@pytest.mark.parametrize("role", sorted(LAYERS))
def test_each_role_imports_only_the_layers_below_it(role):
    allowed = LAYERS[role]
    outside = {
        f"{name} -> {imported}"
        for name, imports in _packages_imported_by(role).items()
        for imported in imports
        if not any(imported == layer or imported.startswith(layer + ".") for layer in allowed)
    }
    assert not outside, sorted(outside)


def test_nothing_but_the_entry_point_imports_the_commands():
    importers = {
        name
        for name, imports in GRAPH.items()
        if not name.startswith("loopaudit.commands")
        and any(imported.startswith("loopaudit.commands") for imported in imports)
    }
    assert importers == {"loopaudit.__main__"}
