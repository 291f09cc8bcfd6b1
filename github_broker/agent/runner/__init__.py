"""The agent runner behind `github-broker agent`: take a task, run the agent command, report.

Rooms: `loop` (the task loop: asking, reporting, waiting), `task_run` (one run of the command
on a task), `config` (what to run), `process_group` (the command's processes), `heartbeat`
(the lease while it runs, and what the broker answers), `output` (the command's output and
its last line), `notes` (maintainers' notes for the agent), `task_files` (what the command
gets), `cli` (the `agent` subcommand and the runner's own signals).
"""

from github_broker.agent.runner.cli import stop_on_signals
from github_broker.agent.runner.config import RunnerConfig, RunnerError
from github_broker.agent.runner.loop import Runner
from github_broker.agent.runner.task_run import Ending

__all__ = ["Ending", "Runner", "RunnerConfig", "RunnerError", "stop_on_signals"]
