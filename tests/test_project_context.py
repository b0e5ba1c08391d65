"""Files named on the command line are analysed inside the project they lie in (project_context.py):
the pre-commit hook names only the changed files, and a per-step `.item()` in a helper module is
per-step because another module's loop calls it."""

from __future__ import annotations

import json

from .conftest import run_cli
from .test_project import write_project

PROJECT = {
    "pyproject.toml": "[project]\nname = 'demo'\n",
    "train.py": """
        import torch
        from helpers import log_step
        model = torch.nn.Linear(3, 3).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            loss = model(x.cuda()).sum()
            loss.backward()
            opt.step()
            log_step(loss)
    """,
    "helpers.py": """
        def log_step(loss):
            print(loss.item())
    """,
}


def reported(result) -> list[tuple[str, int, str]]:
    return sorted((f["filename"], f["location"]["row"], f["code"]) for f in json.loads(result.out))


def test_a_helper_named_alone_is_analysed_inside_its_project(tmp_path):
    write_project(tmp_path, PROJECT)
    result = run_cli("scan", "helpers.py", "--output-format", "json", cwd=tmp_path)
    assert result.returncode == 1, result.err
    # train.py's blocking copy (LA202) is context: only the named file is reported on
    assert reported(result) == [("helpers.py", 2, "LA101")]


def test_no_project_analyses_the_named_file_on_its_own(tmp_path):
    write_project(tmp_path, PROJECT)
    result = run_cli("scan", "helpers.py", "--no-project", "--output-format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.err
    assert reported(result) == []


def test_files_in_no_project_keep_the_single_file_behaviour(tmp_path):
    files = {name: text for name, text in PROJECT.items() if name != "pyproject.toml"}
    write_project(tmp_path, files)
    result = run_cli("scan", "helpers.py", "--output-format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.err


def test_excluded_context_is_left_out(tmp_path):
    write_project(tmp_path, {**PROJECT, "pyproject.toml": "[tool.loopaudit]\nextend-exclude = ['train.py']\n"})
    result = run_cli("scan", "helpers.py", "--output-format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.err


def test_naming_every_file_reports_on_every_file(tmp_path):
    write_project(tmp_path, PROJECT)
    result = run_cli("scan", "helpers.py", "train.py", "--output-format", "json", cwd=tmp_path)
    assert reported(result) == [("helpers.py", 2, "LA101"), ("train.py", 6, "LA202")]
