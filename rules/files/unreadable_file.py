from loopaudit.rule_api import FileRule


class UnreadableFile(FileRule):
    code = "LA002"
    name = "unreadable-file"
    summary = "The file cannot be read as UTF-8 Python source (binary, wrong encoding, no permission)."
    message = "the file cannot be read as Python source"
    suggestion = "Save the file as UTF-8, or exclude it from the scan."
    what_it_flags = (
        "A file the scan was asked to check that cannot be read: a permission error, NUL bytes (a binary "
        "file with a .py name), or bytes that are not UTF-8."
    )
    why_it_costs = "Nothing in the file can be audited. Python 3 reads source as UTF-8 unless told otherwise."
    example = "# a file saved as Latin-1: caf\\xe9\n"
    use_instead = "# the same file saved as UTF-8: café\n"
    fix_safety = "No automatic fix."
