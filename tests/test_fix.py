"""`--fix`, `--unsafe-fixes` and `--diff`: fixed files parse, a second pass changes nothing, the
findings a fix claims are gone, and the bytes around the fixes (encoding, line endings, mode) stay
as they were."""

from __future__ import annotations

import json
import os
import shutil
import stat
import textwrap
from pathlib import Path

import libcst as cst
import pytest

from loopaudit.rule_api.registry import all_rules
from loopaudit.scan.engine import analyze_text
from loopaudit.scan.fixing import fix_file, write_if_unchanged
from loopaudit.scan.options import ScanOptions

from .conftest import FIXTURES, run_cli
from .test_rule_examples import SOURCE_RULES

FIXABLE_FIXTURES = [
    "mnist_cuda.py",
    "data_dataloader_without_pin_memory_bad.py",
    "memory_zero_grad_memset_bad.py",
    "memory_loss_accumulated_with_graph_bad.py",
    "data_blocking_batch_copy_bad.py",
]
AMP = textwrap.dedent("""\
    import torch as th
    scaler = th.cuda.amp.GradScaler(2.0**16)
    for x, y in loader:
        with th.cuda.amp.autocast(dtype=th.float16):
            loss = model(x.cuda(non_blocking=True)).sum()
        scaler.scale(loss).backward()
""")


def scan_json(folder: Path, *args: str) -> list[dict]:
    result = run_cli("scan", ".", "--output-format", "json", "--exit-zero", *args, cwd=folder)
    return json.loads(result.out)


@pytest.fixture
def project(tmp_path) -> Path:
    for name in FIXABLE_FIXTURES:
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "amp.py").write_text(AMP)
    return tmp_path


def test_fix_applies_safe_fixes_and_a_second_fix_changes_nothing(project):
    before = scan_json(project)
    claimed = [
        (f["filename"], f["code"], f["location"]["row"])
        for f in before
        if f["fix"] and f["fix"]["applicability"] == "safe"
    ]
    assert {code for _, code, _ in claimed} >= {"LA201", "LA202", "LA404", "LA502"}
    result = run_cli("scan", ".", "--fix", "--output-format", "concise", cwd=project)
    assert f"Fixed {len(claimed)} findings" in result.out
    assert "1 more fixable with --fix --unsafe-fixes" in result.out  # the accumulated loss
    for path in project.glob("*.py"):
        cst.parse_module(path.read_text())
    after = scan_json(project)
    assert not [f for f in after if f["fix"] and f["fix"]["applicability"] == "safe"]
    assert len(after) == len(before) - len(claimed)
    again = run_cli("scan", ".", "--fix", "--diff", cwd=project)
    assert again.returncode == 0 and again.out == ""
    assert "non_blocking=True" in (project / "mnist_cuda.py").read_text()
    assert 'th.amp.GradScaler("cuda", 2.0**16)' in (project / "amp.py").read_text()
    assert 'th.amp.autocast("cuda", dtype=th.float16)' in (project / "amp.py").read_text()


def test_unsafe_fixes_only_when_asked(project):
    run_cli("scan", ".", "--fix", cwd=project)
    assert "running_loss += loss\n" in (project / "memory_loss_accumulated_with_graph_bad.py").read_text()
    result = run_cli("scan", ".", "--fix", "--unsafe-fixes", "--output-format", "concise", cwd=project)
    assert "Fixed 1 finding" in result.out
    assert "running_loss += loss.detach()\n" in (project / "memory_loss_accumulated_with_graph_bad.py").read_text()
    assert not [f for f in scan_json(project) if f["code"] == "LA403"]


def test_diff_prints_and_writes_nothing(project):
    originals = {path.name: path.read_bytes() for path in project.glob("*.py")}
    result = run_cli("scan", ".", "--diff", cwd=project)
    assert result.returncode == 1
    assert (
        "--- a/mnist_cuda.py" in result.out
        and "+        data, target = data.to(device, non_blocking=True)" in result.out
    )
    assert "Would fix" in result.err
    assert {path.name: path.read_bytes() for path in project.glob("*.py")} == originals


def test_json_describes_each_fix(project):
    (finding,) = [f for f in scan_json(project) if f["filename"] == "amp.py" and f["location"]["row"] == 2]
    assert finding["fix"]["applicability"] == "safe"
    (edit,) = finding["fix"]["edits"]
    assert edit["location"]["row"] == edit["end_location"]["row"] == 2
    line = AMP.splitlines()[1]
    start, end = edit["location"]["column"] - 1, edit["end_location"]["column"] - 1
    assert line[:start] + edit["content"] + line[end:] == 'scaler = th.amp.GradScaler("cuda", 2.0**16)'


def test_encoding_line_endings_and_mode_are_kept(tmp_path):
    source = "# -*- coding: latin-1 -*-\nimport torch\n# caf\xe9\nfor x in loader:\n    y = model(x.cuda())\n    y.backward()\n    optimizer.step()\n"
    script = tmp_path / "train.py"
    script.write_bytes(source.replace("\n", "\r\n").encode("latin-1"))
    script.chmod(0o755)
    result = run_cli("scan", "train.py", "--fix", cwd=tmp_path)
    assert "Fixed 1 finding" in result.out, result.out + result.err
    data = script.read_bytes()
    assert data == source.replace("x.cuda()", "x.cuda(non_blocking=True)").replace("\n", "\r\n").encode("latin-1")
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".train.py.")]  # no temporary left


PIN_AND_COPY = (
    "import torch\nfrom torch.utils.data import DataLoader\nmodel = Net().cuda()\n"
    "loader = DataLoader(ds, batch_size=8)\nfor x in loader:\n    loss = model(x.cuda())\n    loss.backward()\n"
)


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("ending", ["newline", "none"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no-bom", "bom"])
def test_every_byte_outside_the_edits_stays(tmp_path, newline, ending, bom):
    """Classic-Mac `\r` files once lost their last byte (libcst does not print it back)."""
    source = PIN_AND_COPY if ending == "newline" else PIN_AND_COPY.rstrip("\n")
    script = tmp_path / "train.py"
    script.write_bytes(bom + source.replace("\n", newline).encode())
    result = run_cli("scan", "train.py", "--fix", "--no-cache", cwd=tmp_path)
    assert "Fixed 2 findings" in result.out, result.out + result.err
    fixed = source.replace("batch_size=8)", "batch_size=8, pin_memory=True)").replace(
        "x.cuda()", "x.cuda(non_blocking=True)"
    )
    assert script.read_bytes() == bom + fixed.replace("\n", newline).encode()


def test_a_fix_through_a_symbolic_link_fixes_its_target_and_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "train.py"
    target.write_text(PIN_AND_COPY)
    (tmp_path / "train.py").symlink_to(target)
    result = run_cli("scan", "train.py", "--fix", "--no-cache", cwd=tmp_path)
    assert "Fixed 2 findings" in result.out, result.out + result.err
    assert (tmp_path / "train.py").is_symlink() and os.readlink(tmp_path / "train.py") == str(target)
    assert "pin_memory=True" in target.read_text() and "non_blocking=True" in target.read_text()
    assert sorted(p.name for p in (tmp_path / "real").iterdir()) == ["train.py"]  # no temporary left beside it


def test_a_file_changed_on_disk_is_not_overwritten(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("edited by someone else\n")
    problem = write_if_unchanged(str(script), b"what loopaudit read\n", b"what loopaudit would write\n")
    assert problem and "changed on disk" in problem
    assert script.read_text() == "edited by someone else\n"


@pytest.mark.parametrize("rule", [r for r in SOURCE_RULES if r.invalid], ids=lambda r: r.code)
def test_every_fix_of_every_invalid_example_parses_and_removes_its_finding(tmp_path, rule):
    options = ScanOptions(rules=tuple(r for r in all_rules() if r in SOURCE_RULES))
    for number, example in enumerate(rule.invalid):
        findings = [f for f in analyze_text(example, "example.py", options) if f.code == rule.code]
        fixable = [f for f in findings if f.fix is not None]
        if not fixable:
            continue
        path = tmp_path / f"example{number}.py"
        path.write_text(example)
        result = fix_file(str(path), "example.py", options, unsafe=True, write=True)
        assert result.problem is None
        fixed_text = path.read_text()
        cst.parse_module(fixed_text)
        left = [f for f in analyze_text(fixed_text, "example.py", options) if f.code == rule.code]
        assert len(left) == len(findings) - len(fixable), fixed_text
        assert fix_file(str(path), "example.py", options, unsafe=True, write=False).diff == ""


def test_removing_empty_cache_keeps_the_comments_around_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""\
        import torch
        for x in loader:
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
            # give memory back
            torch.cuda.empty_cache()
            print("step")
            if low_memory:
                torch.cuda.empty_cache()
    """)
    )
    result = run_cli("scan", "train.py", "--fix", cwd=tmp_path)
    assert "2 more fixable with --fix --unsafe-fixes" in result.out
    run_cli("scan", "train.py", "--fix", "--unsafe-fixes", cwd=tmp_path)
    assert script.read_text() == textwrap.dedent("""\
        import torch
        for x in loader:
            model(x.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
            # give memory back
            print("step")
            if low_memory:
                pass
    """)


def test_an_added_keyword_follows_the_call_s_layout_and_keeps_its_comments(tmp_path):
    before = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(
            dataset,
            batch_size=32,  # per device
            shuffle=True,  # mix
        )
        l2 = DataLoader(dataset, batch_size=3,)
        l3 = DataLoader(dataset,
                        batch_size=3)
        for a, b, c in zip(loader, l2, l3):
            model(a.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
    """)
    after = (
        before.replace("    shuffle=True,  # mix\n)", "    shuffle=True,  # mix\n    pin_memory=True,\n)")
        .replace("batch_size=3,)", "batch_size=3, pin_memory=True,)")
        .replace("                batch_size=3)", "                batch_size=3, pin_memory=True)")
    )
    script = tmp_path / "train.py"
    script.write_text(before)
    run_cli("scan", "train.py", "--fix", cwd=tmp_path)
    assert script.read_text() == after


def test_a_keyword_added_before_a_closing_parenthesis_on_its_own_line_looks_hand_written(tmp_path):
    # No trailing comma and `)` on a line of its own: the new argument gets a line at the arguments'
    # indentation, the comment stays with its argument, and no line ends in a space.
    before = textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader
        loader = DataLoader(
            dataset,
            batch_size=32,
            collate_fn=lambda batch: torch.stack(
                batch
            )
        )
        other = DataLoader(
            dataset, batch_size=32  # the batch
        )
        for a, b in zip(loader, other):
            model(a.cuda(non_blocking=True)).sum().backward()
            optimizer.step()
    """)
    after = before.replace("        batch\n    )\n)", "        batch\n    ),\n    pin_memory=True\n)").replace(
        "    dataset, batch_size=32  # the batch\n)", "    dataset, batch_size=32,  # the batch\n    pin_memory=True\n)"
    )
    script = tmp_path / "train.py"
    script.write_text(before)
    run_cli("scan", "train.py", "--fix", cwd=tmp_path)
    fixed = script.read_text()
    assert fixed == after
    assert not any(line != line.rstrip() for line in fixed.splitlines())
    cst.parse_module(fixed)
