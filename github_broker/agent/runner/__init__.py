"""The agent runner behind `github-broker agent`: take a task, run the agent command, report.

Rooms: `loop` (the task loop), `config` (what to run), `process_group` (the command's
processes), `heartbeat` (the lease while it runs), `task_files` (what the command gets),
`cli` (the `agent` subcommand and the runner's own signals).
"""

from github_broker.agent.runner.cli import stop_on_signals
from github_broker.agent.runner.config import RunnerConfig, RunnerError
from github_broker.agent.runner.loop import Ending, Runner

__all__ = ["Ending", "Runner", "RunnerConfig", "RunnerError", "stop_on_signals"]
