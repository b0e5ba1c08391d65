"""The `loopaudit` command: its subcommands (cli.py: scan, rules, rule; dynamic.py: run, analyze),
what they share (shared.py: exit codes, output formats, usage errors) and the scan's progress bar."""
