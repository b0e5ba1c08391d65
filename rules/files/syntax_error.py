from loopaudit.rule_api import FileRule


class SyntaxErrorRule(FileRule):
    code = "LA001"
    name = "syntax-error"
    summary = "The file is not valid Python, so nothing in it could be checked."
    message = "syntax error, the file cannot be parsed"
    suggestion = "Fix the syntax error; the rest of the scan goes on without this file."
    what_it_flags = "A file that the parser rejects. The finding points at the place where parsing stopped."
    why_it_costs = (
        "Nothing in the file can be audited, so its per-step problems stay hidden. A training script that "
        "does not parse will not run either."
    )
    example = "for batch in loader\n    loss = model(batch)\n"
    use_instead = "for batch in loader:\n    loss = model(batch)\n"
    fix_safety = "No automatic fix."
