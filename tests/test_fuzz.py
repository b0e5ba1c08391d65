"""Fuzzing: every fixture, mutated the ways real files go wrong and hostile ones are made, through the
command's own isolated analysis. No input may crash, hang or raise (an internal error, a worker that
died or ran out of time), and no input that Python's parser accepts may be called a syntax error.

The mutations are drawn from a fixed seed, so a failure names an input that fails again; set
LOOPAUDIT_FUZZ_ROUNDS to draw more rounds of them locally (each round draws new ones).
"""

from __future__ import annotations

import ast
import os
import random

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.project_scan import analyze_many

from .conftest import FIXTURES

OPTIONS = ScanOptions(rules=all_rules())
ROUNDS = int(os.environ.get("LOOPAUDIT_FUZZ_ROUNDS", "1"))


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


def _at_line_start(data: bytes, rng: random.Random, text: bytes) -> bytes:
    lines = _lines(data)
    where = rng.randrange(len(lines))
    lines[where] = text + lines[where]
    return b"".join(lines)


def _deep(rng: random.Random) -> bytes:
    # Depths below, near and far past CPython's limits (200 brackets, some 3,000 levels otherwise).
    depth = rng.choice([50, 199, 201, 600, 5_000, 20_000])
    kind = rng.choice(["brackets", "unary", "terms", "subscripts"])
    if kind == "brackets":
        return b"x = " + b"(" * depth + b"1" + b")" * depth + b"\n"
    if kind == "unary":
        return b"x = " + b"-" * depth + b"1\n"
    if kind == "terms":
        return b"x = " + b" + ".join([b"1"] * depth) + b"\n"
    return b"x = y" + b"[0]" * depth + b"\n"


MUTATIONS = {
    "truncated": lambda data, rng: data[: rng.randrange(len(data) + 1)],
    "span deleted": lambda data, rng: (lambda start: data[:start] + data[start + rng.randrange(1, 200) :])(
        rng.randrange(len(data) + 1)
    ),
    "bytes inserted": lambda data, rng: (
        lambda at: (
            data[:at] + bytes(rng.choice(b"()[]{}:,'\"\\\t\n#@=.") for _ in range(rng.randrange(1, 6))) + data[at:]
        )
    )(rng.randrange(len(data) + 1)),
    "invalid utf-8": lambda data, rng: (
        lambda at: data[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"]) + data[at:]
    )(rng.randrange(len(data) + 1)),
    "bom": lambda data, rng: b"\xef\xbb\xbf" + data,
    "crlf": lambda data, rng: data.replace(b"\n", b"\r\n"),
    "cr": lambda data, rng: data.replace(b"\n", b"\r"),
    "form feed": lambda data, rng: _at_line_start(data, rng, b"\f"),
    "form feeds everywhere": lambda data, rng: b"".join(
        b"\f" + line if line.startswith(b" ") else line for line in _lines(data)
    ),
    "deep nesting": lambda data, rng: (
        _at_line_start(data, rng, _deep(rng)) if rng.random() < 0.5 else data + _deep(rng)
    ),
    "long line": lambda data, rng: data + b"x = [" + b"1, " * 5_000 + b"]\n",
    "tabs": lambda data, rng: data.replace(b"    ", b"\t"),
}
# Deep and long inputs cost seconds each to parse where Python accepts them: a few fixtures get them.
COSTLY = {"deep nesting", "long line"}
COSTLY_FIXTURES = 8


def mutants(round_number: int) -> list[tuple[str, bytes]]:
    """(name, bytes) for every fixture and mutation, drawn from this round's seed."""
    rng = random.Random(20261126 + round_number)
    fixtures = sorted(FIXTURES.glob("*.py"))
    costly = set(rng.sample(fixtures, COSTLY_FIXTURES))
    found = []
    for fixture in fixtures:
        data = fixture.read_bytes()
        for mutation, mutate in MUTATIONS.items():
            if mutation not in COSTLY or fixture in costly:
                found.append((f"{fixture.stem}--{mutation.replace(' ', '-')}.py", mutate(data, rng)))
    return found


def python_parses(data: bytes) -> bool:
    try:
        ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def test_no_mutated_fixture_crashes_hangs_or_is_falsely_called_a_syntax_error(tmp_path):
    for round_number in range(ROUNDS):
        folder = tmp_path / f"round-{round_number}"
        folder.mkdir()
        inputs = dict(mutants(round_number))
        for name, data in inputs.items():
            (folder / name).write_bytes(data)
        items = [(str(folder / name), name, True, OPTIONS) for name in sorted(inputs)]
        result = analyze_many(items, 2, isolated=True, cpu_seconds=60)
        assert result.problems == []
        failed = [f"{f.filename}: {f.message}" for f in result.findings if f.code == "LA003"]
        assert failed == []
        false_syntax_errors = [
            f"{f.filename}: {f.message}"
            for f in result.findings
            if f.code == "LA001" and python_parses(inputs[f.filename])
        ]
        assert false_syntax_errors == []
        # The mutations reach the parser's edges: some inputs are refused, most analysed.
        refused = {f.filename for f in result.findings if f.code in ("LA001", "LA002")}
        assert 0 < len(refused) < len(inputs)
