"""The documentation stays true: generated rule docs, the README's rule table, its sample output,
and the test command that CI runs."""

from __future__ import annotations

import re

import pytest

from loopaudit.rule_api.docs import rules_document, rules_table

from .conftest import REPO, run_cli

README = (REPO / "README.md").read_text()


def test_docs_rules_md_is_generated_from_the_rules():
    assert (REPO / "docs" / "rules.md").read_text() == rules_document(), (
        "docs/rules.md is stale: run `python -m loopaudit.rule_api.docs > docs/rules.md`"
    )


def test_readme_rule_table_lists_every_rule():
    table = README.split("<!-- rules-table")[1].split("<!-- end rules-table -->")[0]
    table = table.split("-->", 1)[1].strip()
    assert table == rules_table()


@pytest.mark.parametrize(
    "command", ["loopaudit scan fixtures/mnist_cuda.py", "loopaudit scan --select LA101 fixtures/mnist_cuda.py"]
)
def test_readme_sample_output_is_what_the_command_prints(command):
    sample = README.split(f"$ {command}\n")[1].split("```")[0].rstrip("\n")
    result = run_cli(*command.split()[1:], cwd=REPO)
    assert result.out.startswith(sample + "\n")


def test_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    commands = re.findall(r"```\n(pip install[^\n]*)\n```", README)
    assert len(commands) == 2, commands
    install_and_scan, run_tests = commands
    assert run_tests == ci
    assert install_and_scan.startswith("pip install . && loopaudit scan --exit-zero fixtures/")
    # The first command exits 0 on a fresh machine: it shows the findings without failing.
    scanned = run_cli(*install_and_scan.split(" && ")[1].split()[1:], cwd=REPO)
    assert scanned.returncode == 0 and "LA202" in scanned.out, scanned.out + scanned.err


def test_the_version_the_changelog_and_the_pre_commit_snippet_agree():
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert run_cli("--version").out.strip() == f"loopaudit {version}"
    changelog = (REPO / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)(.*)$", changelog, re.M)
    assert newest.group(1) == version
    revs = re.findall(r"^\s*rev: (\S+)", README, re.M)
    assert revs, "the README's pre-commit snippet names a rev"
    for rev in revs:
        # a tag only once the changelog says that version is released; else a commit
        released = f"v{version}" == rev and "unreleased" not in newest.group(2)
        assert released or re.fullmatch(r"[0-9a-f]{40}", rev), rev
