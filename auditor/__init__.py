"""loopaudit: finds the code that keeps a GPU idle in PyTorch training loops."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`loopaudit.sync_budget`, loaded on first use: `import loopaudit` stays free of torch."""
    if name == "sync_budget":
        from loopaudit.testing.sync_budget import sync_budget

        return sync_budget
    raise AttributeError(f"module 'loopaudit' has no attribute {name!r}")
