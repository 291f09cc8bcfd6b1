"""The `github-broker` command: `main.py` (the parser and the broker's own commands; each room
adds its own: the agent runner, MCP, the sandbox, labels) and `steer.py` (the steering verbs).
No module of the package imports this one."""

from github_broker.cli.main import main

__all__ = ["main"]
