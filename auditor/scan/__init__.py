"""The static scan. One file (engine.py): rule it out by its text or parse it once, walk it once,
apply the rules, and turn their reports into findings (report_to_finding.py). Many files as one
project (project_scan.py): rounds of cross-module facts, worker processes (workers.py, collector.py)
and the persistent cache (cache.py, plain_data.py). Around them: the text checks before parsing
(prefilter.py, python_check.py, form_feeds.py), positions of reported nodes (positions.py,
reach_lines.py), `# noqa` (suppression.py), one finding per problem (grouping.py), fixes (fixing.py)
and what a file's scan runs with (options.py)."""
