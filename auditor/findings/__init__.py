"""What a scan reports and how reports are compared over time: the finding itself (finding.py), its
line-independent fingerprint (fingerprint.py), baselines of accepted findings (baseline.py) and the
lines changed since a git revision (since.py)."""
