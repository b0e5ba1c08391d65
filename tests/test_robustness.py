"""No input makes the scan print a traceback: truncated files, odd syntax, deep nesting, odd bytes."""

from __future__ import annotations

import random

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.engine import analyze_bytes
from loopaudit.scan.options import ScanOptions

from .conftest import FIXTURES, run_cli

OPTIONS = ScanOptions(rules=all_rules())

ODD_SOURCES = {
    "empty": b"",
    "only a comment": b"# nothing here\n",
    "no trailing newline": b"import torch\nfor x in loader: x.cuda().item()",
    "crlf": b"import torch\r\nmodel.cuda()\r\nfor x in loader:\r\n    x.cuda().item()\r\n",
    "tabs": b"import torch\nmodel.cuda()\nfor x in loader:\n\tloss = model(x)\n\tloss.backward()\n\tprint(loss.item())\n",
    "form feed": b"import torch\n\x0c\nmodel.cuda()\n",
    "bom": b"\xef\xbb\xbfimport torch\nmodel.cuda()\nfor x in loader:\n    x.item()\n",
    "unicode names": "import torch\nmodel.cuda()\nfor données in loader:\n    perte = model(données)\n    perte.backward()\n    print(perte.item())\n".encode(),
    "deep nesting": b"import torch\nx = " + b"(" * 200 + b"1" + b")" * 200 + b"\n",
    "deep attribute chain": b"import torch\nx = torch" + b".a" * 3000 + b"\n",
    "long line": b"import torch\nx = [" + b"1, " * 50000 + b"]\n",
    "match statement": b"import torch\nmatch x:\n    case {'a': 1}:\n        pass\n",
    "walrus and async": b"import torch\nasync def f():\n    async for b in loader:\n        if (n := b.cuda().item()):\n            await g()\n",
    "star exprs": b"import torch\nfor *a, b in loader:\n    print(*a, **b)\n",
    "decorators and classes": b"import torch\n@torch.no_grad()\nclass A(B, metaclass=M):\n    def training_step(self, *a, **k):\n        return self(*a).sum().item()\n",
    "lone surrogate escape": b"import torch\nx = '\\ud800'\n",
    "nul in source": b"import torch\x00\n",
    "invalid utf8": b"import torch\nx = '\xc3\x28'\n",
    "bad coding declaration": b"# -*- coding: no-such-codec -*-\nimport torch\n",
}


@pytest.mark.parametrize("name", ODD_SOURCES)
def test_odd_sources_never_raise(name):
    findings = analyze_bytes(ODD_SOURCES[name], "odd.py", OPTIONS, explicit=True)
    assert all(f.code.startswith("LA") for f in findings)


def test_a_name_rebound_in_many_branches_is_followed_once_per_binding():
    """diffusers' blocks rebind `hidden_states` in dozens of `if` branches. Following where a batch
    comes from walked every path through those bindings (30 branches, five names deep: 30^5 paths)
    and never finished; each binding is now expanded once. The finding at the end still comes out."""
    lines = ["import torch", "model = Net().cuda()", "for x, y in loader:", "    h = x"]
    for i in range(30):
        lines += [f"    if flags[{i}]:", "        h = h.float()"]
    lines += ["    loss = model(h.cuda()).sum()", "    loss.backward()", "    optimizer.step()"]
    findings = analyze_bytes("\n".join(lines).encode() + b"\n", "chain.py", OPTIONS, explicit=True)
    assert [(f.code, f.location.row) for f in findings] == [("LA202", len(lines) - 2)]


def test_every_truncation_of_every_fixture_is_handled():
    random.seed(1234)
    fixtures = sorted(FIXTURES.glob("*.py"))
    assert fixtures, "the fixtures are missing"
    for fixture in fixtures:
        data = fixture.read_bytes()
        for cut in sorted(random.sample(range(len(data)), min(25, len(data)))):
            for mutated in (data[:cut], data[:cut] + b"(\n" + data[cut:], data.replace(b"    ", b"  ", 1 + cut % 5)):
                analyze_bytes(mutated, fixture.name, OPTIONS, explicit=True)


def test_odd_files_through_the_command(tmp_path):
    for name, content in ODD_SOURCES.items():
        (tmp_path / (name.replace(" ", "_") + ".py")).write_bytes(content)
    result = run_cli("scan", ".", "--output-format", "concise", cwd=tmp_path)
    assert result.returncode in (0, 1)
    assert "internal error" not in result.err
