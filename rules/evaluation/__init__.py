"""LA5xx: evaluation and API hygiene."""
