"""Rule documentation as Markdown, generated from the rule classes themselves.

`loopaudit rule CODE` prints one rule's section; docs/rules.md is all of them, regenerated with
`python -m loopaudit.rule_api.docs > docs/rules.md` (a test fails when the file falls behind the code).
"""

from __future__ import annotations

from loopaudit.rule_api.registry import all_rules
from loopaudit.rule_api.rule import Rule, RuntimeRule


def rule_markdown(rule: type[Rule]) -> str:
    return "\n".join(
        [
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
            *_measurement(rule),
        ]
    )


def _measurement(rule: type[Rule]) -> list[str]:
    """How `loopaudit run` relates to the rule: which LA6xx finding confirms a static one, and
    where a runtime rule can be seen."""
    if issubclass(rule, RuntimeRule):
        where = (
            "a CUDA machine (`loopaudit run --profile`) or a CUDA trace (`loopaudit analyze`)"
            if rule.requires_cuda
            else ("any machine, CPU included (`loopaudit run`), and in a trace (`loopaudit analyze`)")
        )
        return ["### Measured", f"By `loopaudit run`, not by `scan`; seen on {where}.", ""]
    if not rule.confirmed_by:
        return []
    codes = ", ".join(f"[{code}](#{code.lower()}-{_name(code)})" for code in rule.confirmed_by)
    cpu = (
        ""
        if rule.confirmable_on_cpu
        else " on a CUDA machine (without one, the call does not synchronize and cannot be seen)"
    )
    return [
        "### Confirmed at run time",
        f"`loopaudit run` confirms the finding when it reports {codes} at the same line{cpu}.",
        "",
    ]


def _name(code: str) -> str:
    return next(rule.name for rule in all_rules() if rule.code == code)


def rules_table() -> str:
    rows = ["| Code | Name | What it flags |", "| --- | --- | --- |"]
    rows += [f"| [{r.code}](docs/rules.md#{r.code.lower()}-{r.name}) | `{r.name}` | {r.summary} |" for r in all_rules()]
    return "\n".join(rows)


def rules_document() -> str:
    parts = [
        "# Rules",
        "",
        "Generated from the rule classes in `rules/` by `python -m loopaudit.rule_api.docs > docs/rules.md`;",
        "`loopaudit rule CODE` prints the same text. Every LA1xx rule reports only code that runs once",
        "per training or evaluation step (see [the per-step model](per-step-model.md)) in a module that",
        "targets CUDA. LA6xx rules are measured, not read: `loopaudit run` reports them from a running",
        "script, `loopaudit analyze` from a profiler trace (see [the dynamic mode](dynamic-mode.md)).",
        "",
    ]
    parts += [rule_markdown(rule) for rule in all_rules()]
    return "\n".join(parts)


if __name__ == "__main__":
    print(rules_document(), end="")
