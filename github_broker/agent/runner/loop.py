"""The runner's loop: take a task, run the agent command on it, report how it ended."""

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

from github_broker.agent.client import (
    BrokerClient,
    BrokerClientError,
    BrokerUnavailable,
    LeaseLost,
    Previous,
    new_request_id,
)
from github_broker.agent.runner.config import RunnerConfig, RunnerError
from github_broker.agent.runner.heartbeat import Heartbeat
from github_broker.agent.runner.process_group import ProcessGroup
from github_broker.agent.runner.task_files import task_env, write_task_files
from github_broker.agent.workspace import WorkspaceError
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: First and longest pause (seconds) between task requests while the broker is unreachable.
UNREACHABLE_PAUSE_S, MAX_UNREACHABLE_PAUSE_S = 2.0, 60.0
#: First and longest pause (seconds) after failed tasks in a row, so a broken command does not
#: burn through the whole queue.
FAILURE_PAUSE_S, MAX_FAILURE_PAUSE_S = 2.0, 120.0
#: How often (seconds) the wait for the command re-checks stop, time limit and lease.
WATCH_INTERVAL_S = 0.2


class Ending(StrEnum):
    """How one run of the command on a task ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LEASE_LOST = "lease_lost"
    STOPPED = "stopped"


#: What the broker is told for each ending; None: nothing, the lease is gone already.
REPORT: dict[Ending, Previous | None] = {
    Ending.COMPLETED: "completed",
    Ending.FAILED: "failed",
    Ending.TIMED_OUT: "failed",
    Ending.STOPPED: "abandoned",
    Ending.LEASE_LOST: None,
}


class Runner:
    """Takes tasks one at a time until `stop` is set (or after one task with `once`)."""

    def __init__(
        self, client: BrokerClient, config: RunnerConfig, stop: threading.Event | None = None
    ) -> None:
        self.client = client
        self.config = config
        self.stop = stop or threading.Event()
        #: An outcome the broker has not heard yet; the next task request settles it.
        self._unsettled: Previous | None = None
        self._failures = 0
        #: Why the broker took the last task back (the heartbeat's 409 reason).
        self._lost_reason = ""

    @property
    def agent(self) -> str:
        return self.client.agent_id

    def run(self) -> int:
        """0 when stopped, or (with `once`) when the task completed or none came; else 1."""
        while not self.stop.is_set():
            task = self.next_task()
            if task is None:
                if self.config.once and not self.stop.is_set():
                    logger.info("%s: no task within %.0fs", self.agent, self.config.wait_s)
                    return 0
                continue
            ending = self.work(task)
            if self.config.once:
                return 0 if ending is Ending.COMPLETED else 1
            self._pause_after(ending)
        return 0

    def next_task(self) -> Task | None:
        """One long-poll for a task; while the broker is unreachable, pause and ask again
        (the same request id: a repeat that got through returns its hand-out), for at most
        `give_up_s` seconds."""
        pause = UNREACHABLE_PAUSE_S
        request_id = new_request_id()
        unreachable_since: float | None = None
        while not self.stop.is_set():
            try:
                # Anything the broker thinks we still hold is a task whose answer never reached
                # us (or a crashed earlier run): abandoned puts it back in the pool.
                task = self.client.request_task(
                    list(self.config.roles) or None,
                    list(self.config.repositories) or None,
                    wait_seconds=self.config.wait_s,
                    previous=self._unsettled or "abandoned",
                    request_id=request_id,
                )
            except BrokerUnavailable as e:
                now = time.monotonic()
                unreachable_since = unreachable_since if unreachable_since is not None else now
                waited = now - unreachable_since
                if waited + pause > self.config.give_up_s:
                    raise BrokerUnavailable(
                        f"broker {self.client.base_url} unreachable for {waited:.0f}s; giving "
                        f"up (limit {self.config.give_up_s:.0f}s, --give-up-after): {e}",
                        status=e.status,
                        reason=e.reason,
                    ) from e
                logger.warning(
                    "%s: broker unreachable, asking again in %.0fs: %s", self.agent, pause, e
                )
                self.stop.wait(pause)
                pause = min(pause * 2, MAX_UNREACHABLE_PAUSE_S)
                continue
            self._unsettled = None
            return task
        return None

    def work(self, task: Task) -> Ending:
        """Run the command on one task, heartbeating meanwhile, then report how it ended."""
        logger.info(
            "%s claimed %s#%d (%s, role %s, branch %s): %s",
            self.agent,
            task.repository,
            task.issue_id,
            task.task_type.value,
            task.required_role,
            task.branch_name,
            task.title,
        )
        started = time.monotonic()
        if self.stop.is_set():  # the task arrived while we were asked to stop
            ending, code = Ending.STOPPED, None
        else:
            try:
                ending, code = self._run_command(task)
            except RunnerError:
                self._settle(task, "abandoned")
                raise
        self._log_ending(task, ending, code, time.monotonic() - started)
        outcome = REPORT[ending]
        if outcome is not None:
            self._settle(task, outcome)
        return ending

    # --- the command --------------------------------------------------------------------

    def _run_command(self, task: Task) -> tuple[Ending, int | None]:
        with tempfile.TemporaryDirectory(prefix="gb-task-") as tmp, self._workspace(task) as cwd:
            prompt_file, task_file = write_task_files(task, Path(tmp))
            env = {**os.environ, **task_env(task, self.agent, prompt_file, task_file)}
            heartbeat = Heartbeat(self.client, task)
            with self._output(task) as output, prompt_file.open("rb") as stdin:
                group = self._spawn(
                    task,
                    env,
                    self._stdin(task, stdin),
                    output,
                    self._command(task, prompt_file),
                    cwd,
                )
                heartbeat.start()
                try:
                    return self._watch(group, heartbeat)
                finally:
                    heartbeat.stop()
                    if group.proc.poll() is None:  # a second signal interrupted the wait
                        group.signal(signal.SIGKILL)
                        group.proc.wait()

    def _command(self, task: Task, prompt_file: Path) -> Sequence[str] | str:
        preset, command = self.config.preset, self.config.command
        if preset is None:
            return command
        return preset.command(
            task.prompt, prompt_file, [command] if isinstance(command, str) else command
        )

    def _stdin(self, task: Task, prompt: IO[bytes]) -> IO[bytes] | int:
        preset = self.config.preset
        if preset is None or preset.reads_stdin(task.prompt):
            return prompt
        return subprocess.DEVNULL

    @contextlib.contextmanager
    def _workspace(self, task: Task) -> Iterator[Path]:
        """The task's worktree when workspaces are on (removed afterwards), else the workdir."""
        if self.config.workspaces is None:
            yield self.config.workdir
            return
        try:
            path = self.config.workspaces.add(task)
        except WorkspaceError as e:
            raise RunnerError(f"no workspace for {task.repository}#{task.issue_id}: {e}") from e
        try:
            yield path
        finally:
            try:
                self.config.workspaces.remove(task)
            except WorkspaceError as e:
                logger.warning("%s: could not remove the worktree %s: %s", self.agent, path, e)

    def _spawn(
        self,
        task: Task,
        env: dict[str, str],
        stdin: IO[bytes] | int,
        output: IO[bytes] | None,
        command: Sequence[str] | str,
        cwd: Path,
    ) -> ProcessGroup:
        try:
            return ProcessGroup.spawn(
                command,
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                name=f"{self.agent} {task.repository}#{task.issue_id}",
            )
        except OSError as e:
            raise RunnerError(f"cannot start {command!r}: {e}") from e

    def _watch(self, group: ProcessGroup, heartbeat: Heartbeat) -> tuple[Ending, int | None]:
        timeout_s = self.config.timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                code = group.proc.wait(timeout=WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                if group.alive():
                    # Something the command started outlived it: end it before the task is
                    # reported, so nothing keeps working on an issue someone else may get.
                    group.terminate(self.config.kill_grace_s)
                return (Ending.COMPLETED if code == 0 else Ending.FAILED), code
            ending = self._interruption(heartbeat, deadline)
            if ending is not None:
                return ending, group.terminate(self.config.kill_grace_s)

    def _interruption(self, heartbeat: Heartbeat, deadline: float | None) -> Ending | None:
        if self.stop.is_set():
            return Ending.STOPPED
        if heartbeat.lost_reason is not None:
            self._lost_reason = heartbeat.lost_reason
            return Ending.LEASE_LOST
        if deadline is not None and time.monotonic() > deadline:
            return Ending.TIMED_OUT
        return None

    @contextlib.contextmanager
    def _output(self, task: Task) -> Iterator[IO[bytes] | None]:
        if self.config.output_dir is None:
            yield None
            return
        name = f"{self.agent}-{task.repository.replace('/', '_')}-{task.issue_id}.log"
        with (self.config.output_dir / name).open("ab") as fh:
            yield fh

    # --- reporting ----------------------------------------------------------------------

    def _settle(self, task: Task, outcome: Previous) -> None:
        where = (self.agent, task.repository, task.issue_id)
        try:
            if outcome == "completed":
                self.client.complete(task)
            else:
                self.client.release(task, "failed" if outcome == "failed" else "abandoned")
        except LeaseLost as e:
            logger.warning(
                "%s could not report %s#%d as %s: the lease ended (%s)", *where, outcome, e.reason
            )
        except BrokerUnavailable as e:
            self._unsettled = outcome
            logger.warning(
                "%s could not report %s#%d as %s (%s); the next task request will",
                *where,
                outcome,
                e,
            )
        except BrokerClientError as e:
            logger.error("%s could not report %s#%d as %s: %s", *where, outcome, e)

    def _log_ending(self, task: Task, ending: Ending, code: int | None, elapsed_s: float) -> None:
        where = (self.agent, task.repository, task.issue_id)
        if ending is Ending.COMPLETED:
            logger.info("%s completed %s#%d (exit 0 after %.1fs)", *where, elapsed_s)
        elif ending is Ending.FAILED:
            logger.info(
                "%s failed %s#%d (exit %s after %.1fs); releasing it as failed",
                *where,
                code,
                elapsed_s,
            )
        elif ending is Ending.TIMED_OUT:
            logger.warning(
                "%s timed out on %s#%d after %.1fs; command stopped, releasing it as failed",
                *where,
                elapsed_s,
            )
        elif ending is Ending.LEASE_LOST:
            logger.warning("%s lost %s#%d (%s); command stopped", *where, self._lost_reason)
        else:
            logger.info("%s stopping: releasing %s#%d as abandoned", *where)

    def _pause_after(self, ending: Ending) -> None:
        if ending is Ending.COMPLETED:
            self._failures = 0
            return
        if ending not in (Ending.FAILED, Ending.TIMED_OUT):
            return
        self._failures += 1
        pause = min(MAX_FAILURE_PAUSE_S, FAILURE_PAUSE_S * 2 ** (self._failures - 1))
        logger.info(
            "%s: %d failed task(s) in a row, pausing %.0fs", self.agent, self._failures, pause
        )
        self.stop.wait(pause)
