"""Positions of reported nodes, found by printing only the statement around them (positions.py),
must be exactly libcst's PositionProvider's; a fix printed in place must give exactly the text that
printing the whole rewritten module gives."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from loopaudit.analysis.walk import iter_subtree
from loopaudit.scan.positions import Positions
from loopaudit.scan.report_to_finding import _rewrite

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures").glob("*.py"))

# Sources where printing a statement alone could go wrong: the same text twice, an `elif` whose
# body also follows an `if` elsewhere, tabs, CRLF, no newline at the end, continuation lines.
TRICKY = {
    "duplicated statements": "for x in loader:\n    loss = f(x)\n    loss.item()\nfor x in loader:\n    loss = f(x)\n    loss.item()\n",
    "elif like an if": "if a:\n    y.item()\nelif b:\n    z.item()\nif b:\n    z.item()\n",
    "no trailing newline": "import torch\nfor x in loader:\n    x.item()",
    "only duplicates, no trailing newline": "x.item()\nx.item()",
    "crlf": "import torch\r\nfor x in loader:\r\n    if x:\r\n        x.item()\r\n",
    "tabs": "class A:\n\tdef f(self):\n\t\tfor x in y:\n\t\t\tx.item()\n",
    "odd indentation": "class A:\n   def f(self):\n         for x in y:\n          x.item()\n",
    "comments and blank lines": "def f():\n    # leading comment\n\n        # odd indent\n    for x in y:  # trailing\n        x.cpu()\n\n\n# end\n",
    "decorators": "@torch.no_grad()\n@other(\n    arg=1,\n)\ndef f(x):\n    return x.item()\n",
    "semicolons and suites": "for x in y: a = x.item(); b = x.cpu()\nif a: print(a)\nelse: print(b)\n",
    "continuations": "x = f(a,\n      b)\ny = \\\n    g(x)\nz = [\n    1,\n    2,\n]\n",
    "try and with": "try:\n    with a as b, c:\n        b.item()\nexcept E as e:\n    pass\nelse:\n    q()\nfinally:\n    r()\n",
    "form feed": "def f():\n    return 1\n\x0c\ndef g():\n    return 2\n",
    "nested blocks": "def f():\n    for a in b:\n        while c:\n            if d:\n                with e:\n                    g.item()\n",
    "empty": "",
    "comment only": "# nothing\n",
}


def _sources():
    for path in FIXTURES:
        yield path.name, path.read_text()
    yield from TRICKY.items()


def _sample(name: str, nodes: list) -> list:
    """Every node of the small tricky sources; every tenth of a fixture (all of them would take
    minutes: each check places or prints again)."""
    return nodes if name in TRICKY else nodes[::10]


SOURCES = list(_sources())


@pytest.mark.parametrize("name,text", SOURCES, ids=[name for name, _ in SOURCES])
def test_every_node_has_libcst_positions(name, text):
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    shared = Positions(module, text)  # later nodes come from statements placed for earlier ones
    for node in iter_subtree(module):
        assert shared[node] == expected[node], (type(node).__name__, module.code_for_node(node))
    for node in _sample(name, list(iter_subtree(module))):
        alone = Positions(module, text)  # each node placed on its own
        assert alone[node] == expected[node], (type(node).__name__, module.code_for_node(node))


def test_a_unique_statement_is_placed_without_printing_the_module():
    text = "import torch\n\ndef train(loader):\n    for x in loader:\n        loss = x.sum()\n        loss.item()\n"
    module = cst.parse_module(text)
    item = next(
        node
        for node in iter_subtree(module)
        if isinstance(node, cst.Call) and module.code_for_node(node) == "loss.item()"
    )
    positions = Positions(module, text)
    placed = positions.place(item)
    assert placed is not None and module.code_for_node(placed.statement).strip() == "loss.item()"
    assert text[placed.offset :].startswith("        loss.item()\n")
    assert positions.line_of(item) == 6
    assert module.body[0] not in positions._known  # the rest of the module was never printed


def test_duplicated_text_is_placed_by_a_larger_statement_or_the_whole_module():
    text = TRICKY["duplicated statements"]
    module = cst.parse_module(text)
    items = [
        node
        for node in iter_subtree(module)
        if isinstance(node, cst.Call) and module.code_for_node(node) == "loss.item()"
    ]
    positions = Positions(module, text)
    assert positions.place(items[0]) is None  # no enclosing statement's text occurs once
    assert [positions.line_of(item) for item in items] == [3, 6]


def _rewrites(module: cst.Module):
    """(old, new) pairs: every call replaced by a name, every statement removed."""
    for node in iter_subtree(module):
        if isinstance(node, cst.Call):
            yield node, cst.Name("replaced")
        elif isinstance(node, (cst.BaseSmallStatement, cst.BaseStatement)):
            yield node, cst.RemovalSentinel.REMOVE


@pytest.mark.parametrize("name,text", SOURCES, ids=[name for name, _ in SOURCES])
def test_a_rewrite_printed_in_place_equals_the_whole_module_printed(name, text):
    module = cst.parse_module(text)
    for old, new in _sample(name, list(_rewrites(module))):
        try:
            expected = (
                module.deep_remove(old) if new is cst.RemovalSentinel.REMOVE else module.deep_replace(old, new)
            ).code
        except Exception:  # libcst refuses some removals (the only statement of a module suite)
            continue
        rewritten, same_before, same_after = _rewrite(old, new, module, text, Positions(module, text))
        assert rewritten == expected, module.code_for_node(old)
        assert text[:same_before] == expected[:same_before]
        assert text[same_after:] == expected[len(expected) - (len(text) - same_after) :]
