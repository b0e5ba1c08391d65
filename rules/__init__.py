"""The rule catalogue. Each file holds one rule; the registry finds them all."""
