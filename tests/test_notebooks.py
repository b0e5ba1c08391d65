"""Jupyter notebooks, scanned and fixed as a user runs loopaudit on them: findings at their cell and
line in every output format, `# noqa` in a cell, IPython lines left alone, fixes written into the
cells they change with every other byte kept, and a file that is not a notebook said as LA002."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree

import nbformat

from .conftest import run_cli
from .test_output_formats import sarif_validator

SETUP = "%matplotlib inline\nimport torch\nfrom torch.utils.data import DataLoader\ndevice = 'cuda'"
MODEL = (
    "model = torch.nn.Linear(4, 4).to(device)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)"
)
STEP = (
    "for x in loader:\n"
    "    loss = model(x.to(device)).sum()\n"
    "    loss.backward()\n"
    "    optimizer.step()\n"
    "    print(loss.item())"
)


def write_notebook(folder: Path, name: str = "train.ipynb", step: str = STEP) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Training on the GPU"),
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(MODEL),
        nbformat.v4.new_code_cell(step, outputs=[nbformat.v4.new_output("stream", text="4.25\n")], execution_count=7),
        nbformat.v4.new_code_cell("!nvidia-smi"),
    ]
    path = folder / name
    nbformat.write(notebook, str(path))
    return path


def test_a_per_step_sync_is_found_at_its_cell_and_line(tmp_path):
    write_notebook(tmp_path)
    result = run_cli("scan", "train.ipynb", "--output-format", "concise", cwd=tmp_path)
    assert result.returncode == 1, result.err
    assert result.out.splitlines()[:2] == [
        "train.ipynb:cell 4:2:18: LA202 [*] `x.to(device)` is a blocking host-to-device copy of the batch: the CPU "
        "waits for the GPU's queue to drain, once per step",
        "train.ipynb:cell 4:5:11: LA101 `loss.item()` copies a GPU value to the host: the CPU stalls until the "
        "GPU drains, once per step",
    ]
    full = run_cli("scan", "train.ipynb", "--no-color", cwd=tmp_path).out
    assert "train.ipynb:cell 4:5:11: LA101" in full and "5 |     print(loss.item())" in full
    assert "per step: step loop `for x in loader` (cell 4, line 1)" in full


def test_every_output_format_says_the_cell(tmp_path):
    write_notebook(tmp_path)

    def formatted(name: str) -> str:
        return run_cli("scan", "train.ipynb", "--output-format", name, cwd=tmp_path).out

    (first, *_) = json.loads(formatted("json"))
    assert (first["cell"], first["location"], first["code"]) == (4, {"row": 2, "column": 18}, "LA202")
    github = formatted("github").splitlines()[0]
    assert github.startswith("::warning title=loopaudit LA202,file=train.ipynb::cell 4, line 2: LA202")
    sarif = json.loads(formatted("sarif"))
    assert list(sarif_validator().iter_errors(sarif)) == []
    result = sarif["runs"][0]["results"][0]
    assert result["message"]["text"].startswith("cell 4, line 2: ")
    assert "region" not in result["locations"][0]["physicalLocation"]  # the JSON file's lines are not the cell's
    gitlab = json.loads(formatted("gitlab"))[0]
    assert gitlab["description"].startswith("cell 4, line 2: LA202") and gitlab["location"]["lines"]["begin"] == 1
    case = ElementTree.fromstring(formatted("junit")).find(".//testcase")
    assert case is not None and case.get("name") == "LA202 at train.ipynb:cell 4:2:18" and case.get("line") is None


def test_a_folder_s_notebooks_are_scanned_and_checkpoints_are_not(tmp_path):
    write_notebook(tmp_path)
    (tmp_path / ".ipynb_checkpoints").mkdir()
    write_notebook(tmp_path / ".ipynb_checkpoints", "train-checkpoint.ipynb")
    result = run_cli("scan", ".", "--output-format", "concise", cwd=tmp_path)
    assert result.returncode == 1
    assert "Found 2 findings in 1 file (1 scanned)." in result.out
    assert "checkpoint" not in result.out


def test_noqa_in_a_cell(tmp_path):
    write_notebook(tmp_path, step=STEP.replace("print(loss.item())", "print(loss.item())  # noqa: LA101"))
    result = run_cli("scan", "train.ipynb", "--output-format", "json", cwd=tmp_path)
    assert [finding["code"] for finding in json.loads(result.out)] == ["LA202"]


def test_fix_rewrites_only_the_cells_it_changes_and_keeps_outputs_and_magics(tmp_path):
    path = write_notebook(tmp_path)
    before = path.read_text()
    diff = run_cli("scan", "train.ipynb", "--diff", cwd=tmp_path)
    assert "--- a/train.ipynb:cell 4\n+++ b/train.ipynb:cell 4\n" in diff.out
    assert "+    loss = model(x.to(device, non_blocking=True)).sum()\n" in diff.out
    assert path.read_text() == before  # --diff writes nothing
    fixed = run_cli("scan", "train.ipynb", "--fix", "--output-format", "concise", cwd=tmp_path)
    assert "Fixed 1 finding (1 remaining)." in fixed.out
    assert "train.ipynb:cell 4:5:11: LA101" in fixed.out
    after = path.read_text()
    notebook = nbformat.reads(after, as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[3].outputs == [nbformat.v4.new_output("stream", text="4.25\n")]
    assert notebook.cells[1].source == SETUP and notebook.cells[4].source == "!nvidia-smi"
    # Only the fixed line differs in the file: same indentation, key order and line ends.
    changed = [(old, new) for old, new in zip(before.splitlines(), after.splitlines()) if old != new]
    assert changed == [
        (
            '    "    loss = model(x.to(device)).sum()\\n",',
            '    "    loss = model(x.to(device, non_blocking=True)).sum()\\n",',
        )
    ]
    assert len(before.splitlines()) == len(after.splitlines())


def test_a_fix_in_a_cell_with_ipython_lines_keeps_them(tmp_path):
    step = "%time\nfor x in loader:\n    !echo step\n    loss = model(x.to(device)).sum()\n    loss.backward()\n    optimizer.step()"
    path = write_notebook(tmp_path, step=step)
    run_cli("scan", "train.ipynb", "--fix", cwd=tmp_path)
    assert nbformat.read(str(path), as_version=4).cells[3].source == step.replace(
        "x.to(device)", "x.to(device, non_blocking=True)"
    )


def test_a_notebook_whose_layout_cannot_be_kept_is_not_rewritten(tmp_path):
    path = write_notebook(tmp_path)
    compact = json.dumps(json.loads(path.read_text()), separators=(",", ":"))  # not how it was read back
    path.write_text(compact)
    result = run_cli("scan", "train.ipynb", "--fix", "--output-format", "concise", cwd=tmp_path)
    assert path.read_text() == compact
    assert "layout cannot be written back unchanged" in result.out + result.err


def test_a_file_that_is_not_a_notebook_is_la002_never_a_traceback(tmp_path):
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "old.ipynb").write_text('{"nbformat": 4, "cells": [{"cell_type": "code"}]}')
    (tmp_path / "binary.ipynb").write_bytes(b"\xff\xfe\x00")
    result = run_cli("scan", ".", "--output-format", "concise", cwd=tmp_path)
    assert result.returncode == 1, result.err
    lines = sorted(result.out.splitlines()[:3])
    assert [line.split(": ")[0] for line in lines] == ["binary.ipynb:1:1", "broken.ipynb:1:1", "old.ipynb:1:1"]
    assert all(" LA002 " in line for line in lines)
    assert "not a notebook: not JSON" in result.out and "not a valid notebook (nbformat:" in result.out
