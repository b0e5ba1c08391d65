"""docs/ci.md's GitHub Actions workflow and GitLab CI job, run as far as this machine allows: every
`run:` / `script:` command that calls loopaudit is run as written (the `pip install` is the test
environment's own), in a throw-away git repository shaped like a pull request."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from .conftest import REPO
from .test_baseline_since import LEGACY, NEW_SYNC
from .test_output_formats import sarif_validator

DOC = (REPO / "docs" / "ci.md").read_text()


def yaml_blocks() -> list[dict]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", DOC, re.S)]


def github_commands() -> list[str]:
    (workflow,) = [block for block in yaml_blocks() if "jobs" in block]
    steps = workflow["jobs"]["loopaudit"]["steps"]
    return [step["run"] for step in steps if "run" in step and "loopaudit scan" in step["run"]]


def gitlab_commands() -> list[str]:
    (pipeline,) = [block for block in yaml_blocks() if "loopaudit" in block and "script" in block["loopaudit"]]
    return [line for line in pipeline["loopaudit"]["script"] if line.startswith("loopaudit scan")]


def git(*args: str, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.com", *args], cwd=cwd, check=True, capture_output=True
    )


@pytest.fixture
def pull_request(tmp_path) -> Path:
    """A repository with a legacy script (syncs at lines 7 and 8, one finding: the reads of one step)
    and its committed baseline on `main`, checked out on a branch that adds one more per-step sync
    (line 9, a third read of the step's finding); `origin/main` points at the base, as after a fetch."""
    (tmp_path / "train.py").write_text(LEGACY)
    git("init", "-q", "-b", "main", cwd=tmp_path)
    subprocess.run(
        [shell_path("loopaudit"), "scan", "--write-baseline", "loopaudit-baseline.json"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    git("add", ".", cwd=tmp_path)
    git("commit", "-q", "-m", "legacy code and its baseline", cwd=tmp_path)
    git("update-ref", "refs/remotes/origin/main", "HEAD", cwd=tmp_path)
    git("checkout", "-q", "-b", "feature", cwd=tmp_path)
    (tmp_path / "train.py").write_text(LEGACY + NEW_SYNC)
    git("commit", "-qam", "log the total", cwd=tmp_path)
    return tmp_path


def shell_path(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    command = command.replace("${{ github.base_ref }}", "main")
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def test_the_documents_hold_the_jobs_they_describe():
    assert len(github_commands()) == 3 and len(gitlab_commands()) == 3


def test_github_workflow_commands(pull_request):
    annotate, sarif, gate = github_commands()
    annotated = run(annotate, pull_request)
    assert annotated.returncode == 0, annotated.stderr
    assert annotated.stdout.splitlines() == [
        line for line in annotated.stdout.splitlines() if line.startswith("::warning")
    ]
    # The step's finding, for the line the branch added to it (and named in the message).
    assert len(annotated.stdout.splitlines()) == 1 and "line=7" in annotated.stdout and "lines 8, 9" in annotated.stdout
    assert run(sarif, pull_request).returncode == 0
    log = json.loads((pull_request / "loopaudit.sarif").read_text())
    sarif_validator().validate(log)  # URI formats checked too
    (result,) = log["runs"][0]["results"]
    assert [place["physicalLocation"]["region"]["startLine"] for place in result["relatedLocations"]] == [8, 9]
    failed = run(gate, pull_request)
    assert failed.returncode == 1 and "train.py:7:" in failed.stdout and "lines 8, 9" in failed.stdout
    git("checkout", "-q", "main", cwd=pull_request)
    assert run(gate, pull_request).returncode == 0


def test_gitlab_job_commands(pull_request):
    quality, junit, gate = gitlab_commands()
    assert run(quality, pull_request).returncode == 0
    report = json.loads((pull_request / "gl-code-quality-report.json").read_text())
    assert [issue["location"]["lines"]["begin"] for issue in report] == [7]
    assert "lines 8, 9" in report[0]["description"]
    assert run(junit, pull_request).returncode == 0
    (failure,) = ElementTree.parse(pull_request / "loopaudit-junit.xml").getroot().findall(".//failure")
    assert "lines 8, 9" in failure.get("message")
    assert run(gate, pull_request).returncode == 1
    since = run(gate.replace("--baseline loopaudit-baseline.json", '--since "origin/main"'), pull_request)
    assert since.returncode == 1 and "train.py:7:" in since.stdout and "lines 8, 9" in since.stdout


def install_lines() -> list[str]:
    (workflow,) = [block for block in yaml_blocks() if "jobs" in block]
    github = [step["run"] for step in workflow["jobs"]["loopaudit"]["steps"] if "pip install" in step.get("run", "")]
    (pipeline,) = [block for block in yaml_blocks() if "loopaudit" in block and "script" in block["loopaudit"]]
    gitlab = [line for line in pipeline["loopaudit"]["script"] if line.startswith("pip install")]
    return github + gitlab


def test_the_jobs_install_what_exists_a_pinned_commit_not_a_package_that_is_not_published():
    lines = install_lines()
    assert len(lines) == 2 and len(set(lines)) == 1
    requirement = re.fullmatch(r'pip install "(loopaudit @ git\+https://\S+@([0-9a-f]{40}))"', lines[0])
    assert requirement, lines[0]


@pytest.mark.slow
def test_the_documented_install_form_installs_from_a_git_commit(tmp_path):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
    documented = re.fullmatch(r'pip install "loopaudit @ (git\+https://\S+)@[0-9a-f]{40}"', install_lines()[0])
    assert documented
    # The same form, pointed at this repository's own HEAD instead of GitHub (no network here). The
    # host is named: pip before 24 refuses `git+file:///path` in a direct reference as "a path".
    requirement = f"loopaudit @ git+file://localhost{REPO}@{head.stdout.strip()}"
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    pip = tmp_path / "venv" / "bin" / "pip"
    installed = subprocess.run(
        [str(pip), "install", "--quiet", "--no-deps", requirement], capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    shown = subprocess.run([str(pip), "show", "loopaudit"], capture_output=True, text=True, check=True)
    assert "Name: loopaudit" in shown.stdout
