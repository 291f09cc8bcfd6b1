"""The `github-broker` command: `main.py` (the parser and the broker's own commands; each room
adds its own: the agent runner, MCP, the sandbox, labels), `steer.py` (the steering verbs) and
`target.py` (which broker they read or steer). No module of the package imports this one."""

from github_broker.cli.main import main

__all__ = ["main"]
