"""Rule documentation as Markdown, generated from the rule classes themselves.

`loopaudit rule CODE` prints one rule's section; docs/rules.md is all of them, regenerated with
`python -m loopaudit.docs > docs/rules.md` (a test fails when the file falls behind the code).
"""

from __future__ import annotations

from .registry import all_rules
from .rule import Rule


def rule_markdown(rule: type[Rule]) -> str:
    return "\n".join([
        f"## {rule.code} {rule.name}",
        "",
        rule.summary,
        "",
        "### What it flags",
        rule.what_it_flags,
        "",
        "### Why it costs",
        rule.why_it_costs,
        "",
        "### Example",
        "```python",
        rule.example.rstrip(),
        "```",
        "",
        "### Use instead",
        "```python",
        rule.use_instead.rstrip(),
        "```",
        "",
        "### Fix safety",
        rule.fix_safety,
        "",
    ])


def rules_table() -> str:
    rows = ["| Code | Name | What it flags |", "| --- | --- | --- |"]
    rows += [f"| [{r.code}](docs/rules.md#{r.code.lower()}-{r.name}) | `{r.name}` | {r.summary} |" for r in all_rules()]
    return "\n".join(rows)


def rules_document() -> str:
    parts = [
        "# Rules",
        "",
        "Generated from the rule classes in `rules/` by `python -m loopaudit.docs > docs/rules.md`;",
        "`loopaudit rule CODE` prints the same text. Every LA1xx rule reports only code that runs once",
        "per training or evaluation step (see [the per-step model](per-step-model.md)) in a module that",
        "targets CUDA.",
        "",
    ]
    parts += [rule_markdown(rule) for rule in all_rules()]
    return "\n".join(parts)


if __name__ == "__main__":
    print(rules_document(), end="")
