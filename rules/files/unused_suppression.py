from loopaudit.rule_api import FileRule


class UnusedSuppression(FileRule):
    code = "LA004"
    name = "unused-suppression"
    always_selected = False  # about a comment, not about whether the file was checked
    summary = "A `# noqa: LA...` or `# loopaudit: ignore[LA...]` comment that suppresses nothing."
    message = "this suppression comment suppresses nothing"
    suggestion = "remove the code from the comment (or the comment, if it lists nothing else)"
    what_it_flags = (
        "A suppression comment that names a loopaudit rule (`# noqa: LA101`, `# loopaudit: ignore[LA202]`) on a "
        "line where that rule reported nothing, in a scan where the rule ran on the file. Only full codes are "
        "checked: a bare `# noqa` and a prefix (`# noqa: LA1`) may be meant for other tools or future findings, "
        "and a rule that did not run (a CUDA-only rule on a file that does not target CUDA, a rule left out by "
        "`--select`) cannot tell. As ruff's RUF100 does for its own codes."
    )
    why_it_costs = (
        "Nothing at run time. A stale suppression is a blind spot waiting: the line it sits on can gain a real "
        "per-step sync later, and the comment will hide it."
    )
    example = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    running += loss.detach()  # noqa: LA101  (the `.item()` it once silenced is gone)\n"
    )
    use_instead = (
        "for x, y in loader:\n"
        "    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))\n"
        "    running += loss.detach()\n"
    )
    fix_safety = "No automatic fix: whether the comment should go or move is the author's call."
