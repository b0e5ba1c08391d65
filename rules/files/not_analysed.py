from loopaudit.rule_api import FileRule


class NotAnalysed(FileRule):
    code = "LA003"
    name = "not-analysed"
    summary = "The file is valid Python, but loopaudit could not analyse it (too complex, too slow, or it crashed the parser)."
    message = "loopaudit could not analyse the file"
    suggestion = (
        "The rest of the scan goes on without this file. Exclude it if it is generated code; if it is your "
        "training code, please report it."
    )
    what_it_flags = (
        "A file that Python accepts but that loopaudit's analysis gave up on, saying why: libcst's parser "
        "cannot read it, its analysis ran past the per-file CPU time budget (a machine-generated expression "
        "of thousands of terms can take minutes), it nests too deeply for the analysis, or the process "
        "analysing it crashed. Each costs that file alone: the others are analysed as usual."
    )
    why_it_costs = (
        "Nothing in the file was audited, so its per-step problems stay hidden. Saying so is better than a "
        "silent all-clear, a hang, or a crash that loses every other file's findings."
    )
    example = "x = (" + " ".join(['"a"'] * 3) + " ...)  # 5,000 implicitly joined strings: libcst gives up\n"
    use_instead = 'x = "".join(parts)  # or exclude the generated file from the scan\n'
    fix_safety = "No automatic fix."
