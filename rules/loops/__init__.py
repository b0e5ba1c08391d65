"""LA3xx: Python loops over the elements of a batch, on the per-step path (any device)."""
