"""Files that once crashed, hung or misled the scan: each gives a finding for itself alone, and the
other files of the scan keep theirs (python_check.py, form_feeds.py, workers.py)."""

from __future__ import annotations

import ast
import faulthandler
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan import project_scan
from loopaudit.scan.engine import analyze_bytes
from loopaudit.scan.options import ScanOptions
from loopaudit.scan.project_scan import analyze_many

from .conftest import FIXTURES, loopaudit_command, run_cli

OPTIONS = ScanOptions(rules=all_rules())
TRAINING = "import torch\nmodel.cuda()\nfor x in loader:\n    print(x.cuda().item())\n"  # LA101 and LA202 at line 4

# What libcst's native parser once overflowed its stack on (a segmentation fault) or ground through
# for minutes, and CPython itself refuses: each is a syntax error, told in Python's words.
REFUSED_BY_PYTHON = {
    "brackets.py": b"import torch\nx = " + b"(" * 2000 + b"1" + b")" * 2000 + b"\n",
    "unary.py": b"import torch\nx = " + b"-" * 10_000 + b"1\n",
    "terms_20000.py": b"import torch\nx = " + b" + ".join([b"1"] * 20_000) + b"\n",
    "terms_8000.py": b"import torch\nx = " + b" + ".join([b"1"] * 8_000) + b"\n",
    # A grammar error after the deep line stops CPython first; the deep line is asked alone (the fuzz
    # test's mutant that libcst ground through for minutes).
    "subscripts_then_bad_indent.py": b"import torch\ndef f():\n    a = 1\nx = y" + b"[0]" * 20_000 + b"\n    b = 2\n",
}


def concise(result) -> list[tuple[str, int, str]]:
    rows = []
    for line in result.out.splitlines():
        if line.count(":") >= 3 and " LA" in line:
            name, row, _, rest = line.split(":", 3)
            rows.append((name, int(row), rest.split()[0]))
    return sorted(rows)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_files_python_refuses_are_syntax_errors_and_the_others_keep_their_findings(tmp_path, jobs):
    for name, data in REFUSED_BY_PYTHON.items():
        (tmp_path / name).write_bytes(data)
    for number in range(20):
        (tmp_path / f"train_{number:02}.py").write_text(TRAINING)
    started = time.monotonic()
    result = run_cli(
        "scan", *sorted(os.listdir(tmp_path)), "--output-format", "concise", "--no-cache", "-j", jobs, cwd=tmp_path
    )
    assert result.returncode == 1, result.err
    assert time.monotonic() - started < 120  # minutes before (20,000 terms never ended)
    found = concise(result)
    assert [(name, code) for name, _, code in found if name in REFUSED_BY_PYTHON] == [
        (name, "LA001") for name in sorted(REFUSED_BY_PYTHON)
    ]
    assert [row for name, row, _ in found if name.startswith("train_")] == [4, 4] * 20
    assert "nested parentheses" in result.out and "nests too deeply" in result.out


@pytest.mark.parametrize("name", sorted(REFUSED_BY_PYTHON))
def test_each_refused_file_named_alone_gets_its_syntax_error(tmp_path, name):
    (tmp_path / name).write_bytes(REFUSED_BY_PYTHON[name])
    result = run_cli("scan", name, "--output-format", "json", "--no-cache", cwd=tmp_path)
    assert result.returncode == 1, result.err
    assert [f["code"] for f in json.loads(result.out)] == ["LA001"]


def test_the_compilers_warnings_about_the_users_code_are_not_printed(tmp_path):
    # tacotron2's text/__init__.py: `if symbol is not '_' and ...` makes CPython warn at compile time.
    (tmp_path / "symbols.py").write_text("def keep(symbol):\n    return symbol is not '_'\n")
    result = run_cli("scan", "symbols.py", "--no-cache", cwd=tmp_path)
    assert result.returncode == 0, result.err
    assert "All checks passed" in result.out
    assert result.err == ""


def test_valid_python_at_the_edge_of_what_python_takes_is_analysed():
    """A 2,900-deep chain is within CPython's limits (about 3,000): it is parsed and analysed, not refused."""
    source = TRAINING + "y = f" + "[0]" * 900 + "\n"
    assert [(f.location.row, f.code) for f in analyze_bytes(source.encode(), "t.py", OPTIONS, explicit=True)] == [
        (4, "LA101"),
        (4, "LA202"),
    ]


def test_a_self_recursive_factory_leaves_the_files_findings_in_place(tmp_path):
    """`return build(n - 1)` once sent the step model into endless recursion, and the RecursionError
    was reported as "the file nests too deeply", hiding the file's real findings."""
    (tmp_path / "train.py").write_text(
        "import torch\n\n\ndef build(n):\n    return build(n - 1)\n\n\n"
        "model = build(3).cuda()\nloader = torch.utils.data.DataLoader(range(10))\n"
        "for x in loader:\n    x = x.cuda()\n    loss = model(x)\n    print(loss.item())\n    torch.cuda.empty_cache()\n"
    )
    (tmp_path / "other.py").write_text("x = 1\n")
    result = run_cli("scan", ".", "--output-format", "concise", "--no-cache", cwd=tmp_path)
    assert [(row, code) for _, row, code in concise(result)] == [
        (9, "LA201"),
        (11, "LA202"),
        (13, "LA101"),
        (14, "LA401"),
    ]


def test_a_form_feed_before_code_reads_as_python_reads_it():
    """An Emacs page break (^L) at the start of an indented line: CPython resets its column count
    there, libcst rejected the line ("no matching outer block for dedent") or dropped the form
    feed. Every fixture, with form feeds added at the starts of lines that ast still accepts,
    gives its findings at the same lines, each with the file's own source line."""
    rng = random.Random(7)
    for fixture in sorted(FIXTURES.glob("*.py")):
        original = fixture.read_text()
        expected = [
            (f.location.row, f.code) for f in analyze_bytes(original.encode(), fixture.name, OPTIONS, explicit=True)
        ]
        lines = original.splitlines(keepends=True)
        indented = [i for i, line in enumerate(lines) if line.startswith("    ")]
        for i in rng.sample(indented, min(4, len(indented))):
            lines[i] = "\f" + lines[i]
        fed = "".join(lines)
        ast.parse(fed)
        findings = analyze_bytes(fed.encode(), fixture.name, OPTIONS, explicit=True)
        assert [(f.location.row, f.code) for f in findings] == expected, fixture.name
        file_lines = fed.split("\n")
        for finding in findings:
            assert finding.source_line == file_lines[finding.location.row - 1]
            assert finding.fix is None or "\f" not in file_lines[finding.location.row - 1]


def test_a_form_feed_moves_the_reported_column_with_it():
    source = "import torch\nmodel.cuda()\nfor x in loader:\n  \f    print(x.cuda().item())\n"
    findings = analyze_bytes(source.encode(), "t.py", OPTIONS, explicit=True)
    line = source.split("\n")[3]
    assert {(f.code, f.location.column) for f in findings} == {
        ("LA101", line.index("x.cuda().item()") + 1),
        ("LA202", line.index("x.cuda()") + 1),
    }


def _items(folder: Path) -> list:
    return [(str(p), p.name, True, OPTIONS) for p in sorted(folder.glob("*.py"))]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_worker_that_crashes_costs_its_file_alone(tmp_path, monkeypatch, jobs):
    """Whatever kills a worker (a stack overflow in native code, the out-of-memory killer), its file
    is reported as not analysed, and a new worker takes the next file."""
    for number in range(6):
        (tmp_path / f"train_{number}.py").write_text(TRAINING)
    real = project_scan.analyze_file

    def crashing(path, *args, **kwargs):
        if path.endswith("train_2.py"):
            faulthandler.disable()  # pytest's, inherited by the fork: no stack dump in the test's output
            os.kill(os.getpid(), signal.SIGSEGV)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(project_scan, "analyze_file", crashing)  # the workers are forked with it
    result = analyze_many(_items(tmp_path), jobs, isolated=True)
    assert not result.problems
    crashed = [f for f in result.findings if f.filename == "train_2.py"]
    assert [(f.code, f.message) for f in crashed] == [
        ("LA003", "loopaudit could not analyse the file: the process analysing it crashed (SIGSEGV)")
    ]
    others = sorted((f.filename, f.code) for f in result.findings if f.filename != "train_2.py")
    assert others == sorted((f"train_{n}.py", code) for n in (0, 1, 3, 4, 5) for code in ("LA101", "LA202"))


def test_a_file_past_its_cpu_budget_is_stopped_and_the_rest_analysed(tmp_path):
    """CPU time, not wall-clock time: a machine busy with other work does not push a file over it."""
    (tmp_path / "train.py").write_text(TRAINING)
    (tmp_path / "generated.py").write_text("import torch\ny = f" + "[0]" * 2900 + "\n")  # ~10 s of parsing
    result = analyze_many(_items(tmp_path), 1, isolated=True, cpu_seconds=1)
    assert [(f.filename, f.code) for f in result.findings] == [
        ("generated.py", "LA003"),
        ("train.py", "LA101"),
        ("train.py", "LA202"),
    ]
    assert "ran past the budget of 1 s of CPU time" in result.findings[0].message


def _children(pid: int) -> set[int]:
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(child) for child in (task / "children").read_text().split()}
    return children


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM])
def test_workers_end_with_the_scan_however_it_is_stopped(tmp_path, stop):
    names = [f"generated_{number}.py" for number in range(3)]
    for name in names:
        (tmp_path / name).write_text("import torch\ny = f" + "[0]" * 2900 + "\n")  # ~10 s each to parse
    scan = subprocess.Popen(
        [*loopaudit_command(), "scan", *names, "--no-cache"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    workers: set[int] = set()
    while not workers and time.monotonic() < deadline:
        workers = _children(scan.pid)
        time.sleep(0.05)
    assert workers, "the scan started no worker"
    scan.send_signal(stop)
    scan.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in workers if _alive(pid)]


def test_a_file_name_holding_the_line_marks_delimiters_gets_its_line_numbers(tmp_path):
    """Lines in "how the step reaches this line" are marked ⟦path|kind|n⟧ until a finding shows
    them (origins.py): a name with `|`, `⟧` or an escape of its own once leaked raw marks."""
    caller = "tr|ai⟧n%7C.py"
    (tmp_path / caller).write_text(
        "import torch\nfrom engine import step\nmodel.cuda()\nfor x in loader:\n    step(x)\n"
    )
    (tmp_path / "engine.py").write_text("import torch\n\n\ndef step(x):\n    print(x.cuda().item())\n")
    result = run_cli("scan", ".", "--output-format", "json", "--no-cache", cwd=tmp_path)
    contexts = {f["context"] for f in json.loads(result.out)}
    assert contexts == {f"step loop `for x in loader` ({caller}:4) → `step()` ({caller}:5)"}


def test_the_measured_reports_source_lines_break_where_python_breaks_them(tmp_path):
    """A form feed or a vertical tab inside a string is no line end to Python: the lines after it
    must not shift (str.splitlines() ends lines there too)."""
    from loopaudit.profiling.in_loopaudit.audit import SourceLines

    script = tmp_path / "train.py"
    script.write_bytes(b"a = '\\x0c\x0c\x0b\x1c'\r\nb = 2\rc = 3\n")
    lines = SourceLines()
    assert [lines.line(str(script), row) for row in (2, 3)] == ["b = 2", "c = 3"]
