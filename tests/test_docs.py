"""The documentation stays true: generated rule docs, the README's rule table, its sample output,
and the test command that CI runs."""

from __future__ import annotations

import re

from loopaudit.docs import rules_document, rules_table

from .conftest import REPO, run_cli

README = (REPO / "README.md").read_text()


def test_docs_rules_md_is_generated_from_the_rules():
    assert (REPO / "docs" / "rules.md").read_text() == rules_document(), (
        "docs/rules.md is stale: run `python -m loopaudit.docs > docs/rules.md`"
    )


def test_readme_rule_table_lists_every_rule():
    table = README.split("<!-- rules-table")[1].split("<!-- end rules-table -->")[0]
    table = table.split("-->", 1)[1].strip()
    assert table == rules_table()


def test_readme_sample_output_is_what_the_command_prints():
    sample = README.split("$ loopaudit scan fixtures/mnist_cuda.py\n")[1].split("```")[0].rstrip("\n")
    result = run_cli("scan", "fixtures/mnist_cuda.py", cwd=REPO)
    assert result.out.startswith(sample + "\n")


def test_readme_test_command_is_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    commands = re.findall(r"```\n(pip install[^\n]*)\n```", README)
    assert len(commands) == 2, commands
    install_and_scan, run_tests = commands
    assert run_tests == ci
    assert install_and_scan.startswith("pip install . && loopaudit scan fixtures/")
