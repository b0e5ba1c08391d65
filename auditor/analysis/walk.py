"""A read-only walk over a libcst tree that is several times cheaper than `CSTNode.visit`.

libcst's visitor protocol rebuilds every node it passes (`_visit_and_replace_children`), even for
a visitor that changes nothing; on large trees that costs about as much as the parse. We only read,
so we follow each node's dataclass fields directly, skipping the fields that hold whitespace,
parentheses and punctuation. Iterative, so deeply nested code cannot exhaust Python's stack.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from typing import Any

_PUNCTUATION_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "leading_lines",
        "lines_after_decorators",
        "header",
        "footer",
        "comma",
        "semicolon",
        "newline",
        "trailing_whitespace",
        "operator",
        "equal",
        "colon",
        "dot",
        "asynchronous",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "first_line",
        "empty_lines",
        "indent",
        "star",
        "whitespace",
        "prefix",
        "between",
        "arrow",
        "default_comma",
        "semicolons",
    }
)
_fields_cache: dict[type, tuple[str, ...]] = {}
# type -> is it a node type. `isinstance(value, cst.CSTNode)` goes through ABCMeta's Python-level
# __instancecheck__ (CSTNode is an ABC) on every field of every node: a dict lookup is cheaper.
_node_types: dict[type, bool] = {}


def _is_node_type(value_type: type) -> bool:
    known = _node_types.get(value_type)
    if known is None:
        known = _node_types[value_type] = issubclass(value_type, cst.CSTNode)
    return known


def child_fields(node_type: type) -> tuple[str, ...]:
    fields = _fields_cache.get(node_type)
    if fields is None:
        fields = tuple(
            f.name
            for f in dataclasses.fields(node_type)
            if f.name not in _PUNCTUATION_FIELDS and not f.name.startswith("whitespace")
        )
        _fields_cache[node_type] = fields
    return fields


def iter_subtree(root: cst.CSTNode, skip_inside: tuple[type, ...] = ()) -> Iterator[cst.CSTNode]:
    """Every node under `root` (itself included), parents before children, in source order.
    Nodes of the `skip_inside` types are yielded, but their children are not."""
    stack: list[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        yield node
        if skip_inside and isinstance(node, skip_inside):
            continue
        children: list[cst.CSTNode] = []
        for name in child_fields(type(node)):
            value = getattr(node, name)
            value_type = type(value)
            if value_type is tuple or value_type is list:
                children.extend(item for item in value if _is_node_type(type(item)))
            elif _is_node_type(value_type):
                children.append(value)
        stack.extend(reversed(children))


def parent_map(root: cst.CSTNode) -> dict[cst.CSTNode, cst.CSTNode]:
    """The parent of every node under `root` (the same nodes iter_subtree yields)."""
    parents: dict[cst.CSTNode, cst.CSTNode] = {}
    stack: list[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        for name in child_fields(type(node)):
            value = getattr(node, name)
            for child in value if type(value) is tuple or type(value) is list else (value,):
                if _is_node_type(type(child)):
                    parents[child] = node
                    stack.append(child)
    return parents


_ENTER, _LEAVE = object(), object()


def walk(
    root: cst.CSTNode,
    on_visit: Callable[[cst.CSTNode], None],
    on_enter_field: Callable[[cst.CSTNode, str], None],
    on_leave_field: Callable[[cst.CSTNode, str], None],
    fields_with_events: frozenset[type],
) -> None:
    """Visit every node; for nodes of the given types, also signal entering and leaving each field."""
    stack: list[Any] = [root]  # nodes, and for a field's events its name, its node and a marker
    while stack:
        item = stack.pop()
        if item is _ENTER:
            node, name = stack.pop(), stack.pop()
            on_enter_field(node, name)
            continue
        if item is _LEAVE:
            node, name = stack.pop(), stack.pop()
            on_leave_field(node, name)
            continue
        on_visit(item)
        node_type = type(item)
        events = node_type in fields_with_events
        pending: list[tuple[object, cst.CSTNode, str] | tuple[cst.CSTNode]] = []
        for name in child_fields(node_type):
            value = getattr(item, name)
            value_type = type(value)
            if value_type is tuple or value_type is list:
                values = tuple(v for v in value if _is_node_type(type(v)))
            elif _is_node_type(value_type):
                values = (value,)
            else:
                continue
            if events:
                pending.append((_ENTER, item, name))
                pending.extend((v,) for v in values)
                pending.append((_LEAVE, item, name))
            else:
                pending.extend((v,) for v in values)
        # Push in reverse so that fields, and nodes within a field, come off the stack in order.
        for entry in reversed(pending):
            if len(entry) == 1:
                stack.append(entry[0])
            else:
                marker, node, name = entry
                stack.append(name)
                stack.append(node)
                stack.append(marker)


def holds(root: cst.CSTNode, node: cst.CSTNode) -> bool:
    """Is `node` (this very node, not an equal one) `root` or inside it?"""
    return any(inner is node for inner in iter_subtree(root))


class Containment:
    """`holds` for many questions about the same subtrees (a binding's value, asked about each read
    of its name): each subtree is walked once. Keyed by identity: the trees must outlive it."""

    def __init__(self) -> None:
        self._ids: dict[int, frozenset[int]] = {}

    def holds(self, root: cst.CSTNode, node: cst.CSTNode) -> bool:
        ids = self._ids.get(id(root))
        if ids is None:
            ids = self._ids[id(root)] = frozenset(map(id, iter_subtree(root)))
        return id(node) in ids
