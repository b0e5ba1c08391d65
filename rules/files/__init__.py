"""LA0xx: problems with a file itself, reported by the engine."""
