"""What a scan runs with: the files it reads (discovery.py), the project around files named on the
command line (project_context.py), `[tool.loopaudit]` / loopaudit.toml (config_file.py), and the
settings for each file, the command line on top of its configuration (settings.py)."""
