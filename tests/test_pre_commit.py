"""The pre-commit hook, with the real `pre-commit` tool: a throw-away git repository installs the
hook from this checkout (at its HEAD commit, as a user's `rev:` would pin a release), a commit of a
training script with a per-step sync is refused with the finding shown, and a clean one passes.

pre-commit builds the hook's own environment (pip installs this checkout and its dependencies);
PRE_COMMIT_HOME points into the test's temporary folder, so nothing outside it is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow  # `pytest -m "not slow"` leaves these out

BAD = textwrap.dedent("""\
    import torch
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        loss.backward()
        optimizer.step()
        print(loss.item())
""")
GOOD = BAD.replace("    print(loss.item())\n", "    optimizer.zero_grad(set_to_none=True)\n")
assert GOOD != BAD


def _git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def _pre_commit() -> list[str]:
    executable = shutil.which(
        "pre-commit", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    )
    if executable is None:
        pytest.fail("the `pre-commit` command is not installed: run `pip install -e '.[test]'` first")
    return [executable]


@pytest.fixture(scope="module")
def hooked_repository(tmp_path_factory) -> tuple[Path, dict]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    head = _git("rev-parse", "HEAD", cwd=REPO, check=False)
    if head.returncode != 0:
        pytest.skip("this checkout is not a git repository: pre-commit installs hooks from a commit")
    committed = _git("cat-file", "-e", "HEAD:.pre-commit-hooks.yaml", cwd=REPO, check=False)
    if committed.returncode != 0:
        pytest.skip(".pre-commit-hooks.yaml is not committed yet: pre-commit installs hooks from HEAD")
    folder = tmp_path_factory.mktemp("hooked")
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(folder / "pre-commit-home"),
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    }
    repository = folder / "project"
    repository.mkdir()
    _git("init", "-q", "-b", "main", cwd=repository)
    # The snippet the README gives, with this checkout for the repository and its HEAD for the rev.
    (repository / ".pre-commit-config.yaml").write_text(
        textwrap.dedent(f"""\
        repos:
          - repo: {REPO}
            rev: {head.stdout.strip()}
            hooks:
              - id: loopaudit
    """)
    )
    install = subprocess.run([*_pre_commit(), "install"], cwd=repository, capture_output=True, text=True, env=env)
    assert install.returncode == 0, install.stderr
    # Build the hook's environment once, before the commits (pip installs loopaudit into it).
    built = subprocess.run(
        [*_pre_commit(), "install-hooks"], cwd=repository, capture_output=True, text=True, env=env, timeout=900
    )
    assert built.returncode == 0, built.stdout + built.stderr
    _git("add", ".pre-commit-config.yaml", cwd=repository)
    return repository, env


def _commit(repository: Path, env: dict, name: str, text: str) -> subprocess.CompletedProcess:
    (repository / name).write_text(text)
    subprocess.run(["git", "add", name], cwd=repository, check=True, env=env)
    return subprocess.run(
        ["git", "commit", "-m", f"add {name}"], cwd=repository, capture_output=True, text=True, env=env, timeout=600
    )


def test_a_commit_with_a_per_step_sync_is_refused(hooked_repository):
    repository, env = hooked_repository
    result = _commit(repository, env, "train.py", BAD)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "loopaudit" in output and "Failed" in output
    assert "train.py:8:11: LA101" in output
    assert _git("rev-list", "--all", cwd=repository, check=False).stdout.strip() == ""  # nothing committed


def test_a_clean_commit_passes(hooked_repository):
    repository, env = hooked_repository
    _git("rm", "-q", "--cached", "--ignore-unmatch", "train.py", cwd=repository)  # the refused file
    (repository / "train.py").unlink(missing_ok=True)
    _git("add", ".pre-commit-config.yaml", cwd=repository)
    result = _commit(repository, env, "clean.py", GOOD)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "loopaudit" in output and "Passed" in output
