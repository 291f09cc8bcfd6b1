"""What the runner runs on each task, where and for how long, checked before any task."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from github_broker.agent.presets import Preset
from github_broker.agent.workspace import Workspaces

#: Long-poll (seconds) of each task request; also the longest wait for a graceful stop when idle.
DEFAULT_WAIT_S = 20.0
#: Seconds a command gets between SIGTERM and SIGKILL.
DEFAULT_KILL_GRACE_S = 10.0
#: Seconds the runner keeps asking an unreachable broker before it gives up.
DEFAULT_GIVE_UP_S = 300.0
#: First wait (seconds) before asking again while this agent is paused; doubles each time.
DEFAULT_PAUSED_RETRY_S = 5.0


class RunnerError(Exception):
    """The runner cannot do its job at all: no such command or working directory."""


@dataclass(frozen=True)
class RunnerConfig:
    """What to run on each task, where, and for how long."""

    #: A list is executed as is; a string goes through the shell (`sh -c`).
    command: Sequence[str] | str
    workdir: Path = Path(".")
    #: Seconds the command may run before it is stopped and the task released as failed.
    timeout_s: float | None = None
    roles: tuple[str, ...] = ()
    repositories: tuple[str, ...] = ()
    #: Take one task, report it and return.
    once: bool = False
    wait_s: float = DEFAULT_WAIT_S
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    #: Where the command's output goes (one file per task); None: the runner's own stdout.
    output_dir: Path | None = None
    #: Seconds of an unreachable broker after which the runner gives up (BrokerUnavailable).
    give_up_s: float = DEFAULT_GIVE_UP_S
    #: A known CLI to run (`command` then holds extra arguments for it).
    preset: Preset | None = None
    #: A git worktree per task, on its branch, as the command's working directory.
    workspaces: Workspaces | None = None
    #: First wait (seconds) before asking again while this agent is paused (then doubling,
    #: up to a minute).
    paused_retry_s: float = DEFAULT_PAUSED_RETRY_S

    def check(self) -> None:
        """Refuse at start-up what would make every task fail."""
        if not self.workdir.is_dir():
            raise RunnerError(f"working directory {self.workdir} does not exist")
        if self.preset is not None:
            missing = self.preset.missing()
            if missing:
                raise RunnerError(missing)
            return
        if isinstance(self.command, str):
            if not self.command.strip():
                raise RunnerError("the agent command is empty")
            return
        if not self.command:
            raise RunnerError("no agent command: give it after `--`, e.g. `-- claude -p`")
        exe = self.command[0]
        found = (self.workdir / exe).is_file() if "/" in exe else shutil.which(exe) is not None
        if not found:
            raise RunnerError(f"command {exe!r} not found (PATH, or relative to {self.workdir})")
