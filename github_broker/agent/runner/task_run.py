"""One run of the agent command on a task: its files and working directory, its process group,
the heartbeat beside it, and how it ended."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import IO

from github_broker.agent.client import BrokerClient, BrokerClientError, github_env
from github_broker.agent.runner.config import RunnerConfig, RunnerError
from github_broker.agent.runner.heartbeat import Heartbeat
from github_broker.agent.runner.notes import NotesFile
from github_broker.agent.runner.output import OutputTap
from github_broker.agent.runner.process_group import ProcessGroup
from github_broker.agent.runner.task_files import UsageFile, task_env, write_task_files
from github_broker.agent.workspace import WorkspaceError
from github_broker.models import AgentCredential, Task

logger = logging.getLogger(__name__)

#: Longest wait (seconds) for the command's end between two looks at stop, time limit and
#: lease; what the heartbeat hears wakes the wait at once.
WATCH_INTERVAL_S = 0.2


class Ending(StrEnum):
    """How one run of the command on a task ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LEASE_LOST = "lease_lost"
    STOPPED = "stopped"


class TimeLimit:
    """The command's time limit (None: none), not counting time it spent suspended."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self._used_s = 0.0
        self._since: float | None = time.monotonic()

    def hold(self) -> None:
        if self._since is not None:
            self._used_s += time.monotonic() - self._since
            self._since = None

    def go_on(self) -> None:
        if self._since is None:
            self._since = time.monotonic()

    def passed(self) -> bool:
        if self.limit_s is None:
            return False
        running = 0.0 if self._since is None else time.monotonic() - self._since
        return self._used_s + running > self.limit_s


class TaskRun:
    """Runs the command on `task` once; `run()` says how it ended."""

    def __init__(
        self, client: BrokerClient, config: RunnerConfig, task: Task, stop: threading.Event
    ) -> None:
        self.client, self.config, self.task, self.stop = client, config, task, stop
        self.name = f"{client.agent_id} {task.repository}#{task.issue_id}"
        #: Why the broker took the task back: the heartbeat's 409 reason, and its words.
        self.lost, self.lost_detail = "", ""

    def run(self) -> tuple[Ending, int | None]:
        """The ending and the command's exit code (None when it never started)."""
        task = self.task
        with tempfile.TemporaryDirectory(prefix="gb-task-") as tmp, self._workspace() as cwd:
            prompt_file, task_file = write_task_files(task, Path(tmp))
            usage, notes = UsageFile(Path(tmp) / "usage.json"), NotesFile(cwd, task)
            extra = task_env(
                task, self.client.agent_id, prompt_file, task_file, notes.path, usage.path
            )
            env = {**os.environ, **extra, **github_env(self._credential())}
            with self._output() as output, prompt_file.open("rb") as stdin:
                tap = OutputTap(output, output)
                heartbeat = Heartbeat(
                    self.client,
                    task,
                    note=tap.last_line,
                    usage=usage.read,
                    notes_file=notes,
                )
                try:
                    group = self._spawn(env, stdin, tap, self._command(prompt_file), cwd)
                    heartbeat.start()
                    return self._watch(group, heartbeat)
                finally:
                    heartbeat.stop()
                    tap.close()
                    notes.remove()

    # --- starting it ----------------------------------------------------------------------

    def _credential(self) -> AgentCredential | None:
        """The task's scoped GitHub token, when the broker hands them out: the command gets
        it as GH_TOKEN and GITHUB_TOKEN. Without it (the broker could not mint one) the command
        runs with the environment it would have had."""
        try:
            return self.client.credential(self.task)
        except BrokerClientError as e:
            logger.warning("%s: no GitHub token for this task: %s", self.name, e)
            return None

    def _command(self, prompt_file: Path) -> Sequence[str] | str:
        preset, command = self.config.preset, self.config.command
        if preset is None:
            return command
        return preset.command(
            self.task.prompt, prompt_file, [command] if isinstance(command, str) else command
        )

    def _stdin(self, prompt: IO[bytes]) -> IO[bytes] | int:
        preset = self.config.preset
        if preset is None or preset.reads_stdin(self.task.prompt):
            return prompt
        return subprocess.DEVNULL

    @contextlib.contextmanager
    def _workspace(self) -> Iterator[Path]:
        """The task's worktree when workspaces are on (removed afterwards), else the workdir."""
        task, workspaces = self.task, self.config.workspaces
        if workspaces is None:
            yield self.config.workdir
            return
        try:
            path = workspaces.add(task)
        except WorkspaceError as e:
            raise RunnerError(f"no workspace for {task.repository}#{task.issue_id}: {e}") from e
        try:
            yield path
        finally:
            try:
                workspaces.remove(task)
            except WorkspaceError as e:
                logger.warning("%s: could not remove the worktree %s: %s", self.name, path, e)

    @contextlib.contextmanager
    def _output(self) -> Iterator[IO[bytes] | None]:
        if self.config.output_dir is None:
            yield None
            return
        task = self.task
        name = f"{self.client.agent_id}-{task.repository.replace('/', '_')}-{task.issue_id}.log"
        with (self.config.output_dir / name).open("ab") as fh:
            yield fh

    def _spawn(
        self,
        env: dict[str, str],
        prompt: IO[bytes],
        tap: OutputTap,
        command: Sequence[str] | str,
        cwd: Path,
    ) -> ProcessGroup:
        out, err = tap.open()
        try:
            group = ProcessGroup.spawn(
                command,
                cwd=cwd,
                env=env,
                stdin=self._stdin(prompt),
                stdout=out,
                stderr=err,
                name=self.name,
            )
        except OSError as e:
            raise RunnerError(f"cannot start {command!r}: {e}") from e
        tap.start()
        return group

    # --- while it runs --------------------------------------------------------------------

    def _watch(self, group: ProcessGroup, heartbeat: Heartbeat) -> tuple[Ending, int | None]:
        limit = TimeLimit(self.config.timeout_s)
        try:
            while True:
                code = group.proc.poll()
                if code is not None:
                    if group.alive():
                        # Something the command started outlived it: end it before the task
                        # is reported, so nothing keeps working on an issue someone else may
                        # get.
                        group.terminate(self.config.kill_grace_s)
                    return (Ending.COMPLETED if code == 0 else Ending.FAILED), code
                ending = self._interruption(heartbeat, limit)
                if ending is not None:
                    return ending, group.terminate(self._grace_s(ending, heartbeat))
                self._follow_pause(group, heartbeat, limit)
                heartbeat.changed.wait(WATCH_INTERVAL_S)
                heartbeat.changed.clear()
        finally:
            if group.proc.poll() is None:  # a second signal interrupted the wait
                group.signal(signal.SIGKILL)
                group.proc.wait()

    def _interruption(self, heartbeat: Heartbeat, limit: TimeLimit) -> Ending | None:
        if self.stop.is_set():
            return Ending.STOPPED
        if heartbeat.lost_reason is not None:
            self.lost, self.lost_detail = heartbeat.lost_reason, heartbeat.lost_detail
            return Ending.LEASE_LOST
        if limit.passed():
            return Ending.TIMED_OUT
        return None

    def _grace_s(self, ending: Ending, heartbeat: Heartbeat) -> float:
        """SIGTERM to SIGKILL: --kill-grace, but a command whose lease is gone gets no more
        than what is left of the heartbeat interval, so it is gone within one interval."""
        if ending is Ending.LEASE_LOST:
            return min(self.config.kill_grace_s, heartbeat.grace_when_lost_s)
        return self.config.kill_grace_s

    def _follow_pause(self, group: ProcessGroup, heartbeat: Heartbeat, limit: TimeLimit) -> None:
        """A task set aside for a person (a budget reached) is suspended where it is, and
        continued when a maintainer retries it; the time limit does not run meanwhile."""
        paused = heartbeat.paused
        if paused is not None and not group.suspended:
            group.suspend()
            limit.hold()
            logger.warning(
                "%s waits for a person (%s: %s); command suspended (SIGSTOP) until a "
                "maintainer retries it",
                self.name,
                paused.code,
                paused.detail,
            )
        elif paused is None and group.suspended:
            group.resume()
            limit.go_on()
            logger.info("%s was retried by a maintainer; command continued (SIGCONT)", self.name)
