"""Commands: parse, call the orchestration, render. The top layer (cli.py dispatches here)."""
