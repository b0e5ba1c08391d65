"""The static scan: read each file, rule it out by its text or parse it once, walk it once, apply the
rules, and settle a project's cross-module facts in rounds (engine.py). Around it: the text checks
before parsing (prefilter.py, python_check.py, form_feeds.py), positions of reported nodes
(positions.py, reach_lines.py), `# noqa` (suppression.py), one finding per problem (grouping.py),
fixes (fixing.py), the persistent cache (cache.py, plain_data.py) and worker processes (workers.py,
collector.py)."""
