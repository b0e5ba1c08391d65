"""What runs inside the audited script's process (`python -m loopaudit.profiling.in_script.child`):
the probe that finds and times steps, the sync spy, the attribution of calls to the user's lines, and
the report they hand back as JSON. It imports torch and nothing of loopaudit's other side."""
