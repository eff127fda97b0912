"""One module per ``supervise`` subcommand (see supervisor/cli.py)."""
