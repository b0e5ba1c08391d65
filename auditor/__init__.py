"""loopaudit: finds the code that keeps a GPU idle in PyTorch training loops."""

__version__ = "0.1.0"
