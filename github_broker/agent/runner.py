"""The agent runner behind `github-broker agent`: take a task, run the agent command, report."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import IO

from github_broker.agent.client import (
    BrokerClient,
    BrokerClientError,
    BrokerUnavailable,
    LeaseLost,
    Previous,
    new_request_id,
)
from github_broker.agent.presets import PRESETS, Preset
from github_broker.agent.workspace import DEFAULT_CLONE_URL, WorkspaceError, Workspaces
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: Long-poll (seconds) of each task request; also the longest wait for a graceful stop when idle.
DEFAULT_WAIT_S = 20.0
#: Seconds a command gets between SIGTERM and SIGKILL.
DEFAULT_KILL_GRACE_S = 10.0
#: First and longest pause (seconds) between task requests while the broker is unreachable.
UNREACHABLE_PAUSE_S, MAX_UNREACHABLE_PAUSE_S = 2.0, 60.0
#: Seconds the runner keeps asking an unreachable broker before it gives up.
DEFAULT_GIVE_UP_S = 300.0
#: How often (seconds) the end of a command's process group is checked.
GROUP_POLL_S = 0.05
#: First and longest pause (seconds) after failed tasks in a row, so a broken command does not
#: burn through the whole queue.
FAILURE_PAUSE_S, MAX_FAILURE_PAUSE_S = 2.0, 120.0
#: How often (seconds) the wait for the command re-checks stop, time limit and lease.
WATCH_INTERVAL_S = 0.2
#: GB_TASK_JSON is left out above this size (bytes): Linux refuses an environment string over
#: 128 KiB, and GB_TASK_FILE always has the same JSON.
MAX_ENV_JSON_BYTES = 64 * 1024
#: Environment variables the `agent` options default to.
TOKEN_ENV, URL_ENV, AGENT_ENV = (
    "GITHUB_BROKER_AGENT_TOKEN",
    "GITHUB_BROKER_URL",
    "GITHUB_BROKER_AGENT_ID",
)


class RunnerError(Exception):
    """The runner cannot do its job at all: no such command or working directory."""


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


def public_json(task: Task) -> str:
    """The task as the command sees it: everything but the lease token, which stays with us."""
    return task.model_dump_json(exclude={"lease": {"token"}})


def write_task_files(task: Task, directory: Path) -> tuple[Path, Path]:
    """Write the prompt and the task JSON into `directory`; returns both paths."""
    prompt = directory / "prompt.md"
    prompt.write_text(task.prompt, encoding="utf-8")
    task_file = directory / "task.json"
    task_file.write_text(public_json(task), encoding="utf-8")
    return prompt, task_file


def task_env(task: Task, agent_id: str, prompt_file: Path, task_file: Path) -> dict[str, str]:
    """The GB_* variables a command gets for `task`."""
    env = {
        "GB_AGENT_ID": agent_id,
        "GB_REPOSITORY": task.repository,
        "GB_ISSUE_ID": str(task.issue_id),
        "GB_ISSUE_URL": task.issue_url,
        "GB_TITLE": task.title,
        "GB_BRANCH": task.branch_name,
        "GB_BASE_BRANCH": task.base_branch,
        "GB_TASK_TYPE": task.task_type.value,
        "GB_ROLE": task.required_role,
        "GB_PR_URL": task.pr_url or "",
        "GB_PROMPT_FILE": str(prompt_file),
        "GB_TASK_FILE": str(task_file),
    }
    text = public_json(task)
    if len(text.encode()) <= MAX_ENV_JSON_BYTES:
        env["GB_TASK_JSON"] = text
    return env


class Heartbeat:
    """Renews a task's lease from a background thread until stopped or the lease is lost."""

    def __init__(self, client: BrokerClient, task: Task) -> None:
        self.client = client
        self.task = task
        self.interval_s = max(1, task.lease.heartbeat_interval_s)
        #: The broker's 409 reason once the lease is gone (revoked, expired, ...).
        self.lost_reason: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{task.issue_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.client.timeout_s)

    def _run(self) -> None:
        agent, task = self.client.agent_id, self.task
        while not self._done.wait(self.interval_s):
            try:
                expires = self.client.heartbeat(task)
            except LeaseLost as e:
                if not self._done.is_set():
                    self.lost_reason = e.reason
                return
            except BrokerClientError as e:
                # The lease lasts three intervals: one missed beat does not cost it.
                logger.warning(
                    "%s heartbeat on %s#%d failed, next in %ds: %s",
                    agent,
                    task.repository,
                    task.issue_id,
                    self.interval_s,
                    e,
                )
            else:
                logger.debug(
                    "%s heartbeat on %s#%d: lease until %s",
                    agent,
                    task.repository,
                    task.issue_id,
                    expires,
                )


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
                proc = self._spawn(
                    env, self._stdin(task, stdin), output, self._command(task, prompt_file), cwd
                )
                heartbeat.start()
                try:
                    return self._watch(proc, heartbeat)
                finally:
                    heartbeat.stop()
                    if proc.poll() is None:  # a second signal interrupted the wait
                        _signal_group(proc, signal.SIGKILL)
                        proc.wait()

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
        env: dict[str, str],
        stdin: IO[bytes] | int,
        output: IO[bytes] | None,
        command: Sequence[str] | str,
        cwd: Path,
    ) -> subprocess.Popen[bytes]:
        shell = isinstance(command, str)
        try:
            # A session of its own: a terminal's Ctrl-C reaches only the runner, which stops
            # the whole group (shell and grandchildren) and releases the lease itself.
            return subprocess.Popen(
                command if shell else list(command),
                shell=shell,
                cwd=cwd,
                env=env,
                stdin=stdin,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                start_new_session=True,
            )
        except OSError as e:
            raise RunnerError(f"cannot start {command!r}: {e}") from e

    def _watch(
        self, proc: subprocess.Popen[bytes], heartbeat: Heartbeat
    ) -> tuple[Ending, int | None]:
        timeout_s = self.config.timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                code = proc.wait(timeout=WATCH_INTERVAL_S)
            except subprocess.TimeoutExpired:
                pass
            else:
                if _group_alive(proc):
                    # Something the command started outlived it: end it before the task is
                    # reported, so nothing keeps working on an issue someone else may get.
                    self._terminate(proc)
                return (Ending.COMPLETED if code == 0 else Ending.FAILED), code
            ending = self._interruption(heartbeat, deadline)
            if ending is not None:
                return ending, self._terminate(proc)

    def _interruption(self, heartbeat: Heartbeat, deadline: float | None) -> Ending | None:
        if self.stop.is_set():
            return Ending.STOPPED
        if heartbeat.lost_reason is not None:
            self._lost_reason = heartbeat.lost_reason
            return Ending.LEASE_LOST
        if deadline is not None and time.monotonic() > deadline:
            return Ending.TIMED_OUT
        return None

    def _terminate(self, proc: subprocess.Popen[bytes]) -> int | None:
        """End the command's whole process group: SIGTERM, the grace period, SIGKILL. The
        group, not just its leader: a shell that dies at once on SIGTERM would otherwise leave
        a child that traps it working on after the task was released."""
        _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.config.kill_grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc):
                return proc.returncode
            time.sleep(GROUP_POLL_S)
        logger.warning(
            "%s: command %d (or a process it started) ignored SIGTERM for %.0fs; killing them",
            self.agent,
            proc.pid,
            self.config.kill_grace_s,
        )
        _signal_group(proc, signal.SIGKILL)
        return proc.wait()

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


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    """Whether a process of the command's group (its pid: a session of its own) still runs.
    Zombies don't count: an orphan's zombie waits for an init that may never reap it."""
    pgid = str(proc.pid)
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel, zombies included
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if pgrp == pgid and state != "Z":
            return True
    return False


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """SIGINT/SIGTERM set `stop`: the runner stops the command, releases the task and returns.

    Yields the list of signals received. A second signal quits at once (KeyboardInterrupt).
    """
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        received.append(signum)
        stop.set()
        logger.warning(
            "%s: stopping after the current step (send it again to quit at once)",
            signal.Signals(signum).name,
        )

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --- command line -------------------------------------------------------------------------

AGENT_EPILOG = """\
The command gets the prompt on its stdin and these environment variables:
  GB_AGENT_ID GB_REPOSITORY GB_ISSUE_ID GB_ISSUE_URL GB_TITLE GB_BRANCH GB_BASE_BRANCH
  GB_TASK_TYPE GB_ROLE GB_PR_URL GB_PROMPT_FILE GB_TASK_FILE GB_TASK_JSON
Exit 0 completes the task; any other exit releases it as failed. Several arguments after
`--` are run as they are; a single one goes through the shell.

examples:
  github-broker agent --agent-id claude-1 --preset claude --workspace ~/gb-work
  github-broker agent --agent-id claude-1 --workdir ~/src/app -- claude -p
  github-broker agent --agent-id bot-1 --role TESTER -- './work.sh "$GB_BRANCH" < "$GB_PROMPT_FILE"'
"""


def command_from_argv(argv: Sequence[str]) -> Sequence[str] | str:
    """The words after `--`: several run as argv, a single one through the shell."""
    words = list(argv[1:] if argv and argv[0] == "--" else argv)
    return words[0] if len(words) == 1 else words


def cmd_agent(args: argparse.Namespace) -> int:
    """Run an agent command on tasks from a broker until stopped."""
    preset = PRESETS[args.preset] if args.preset else None
    words = args.agent_command[1:] if args.agent_command[:1] == ["--"] else args.agent_command
    workspaces = None
    if args.workspace:
        workspaces = Workspaces(args.workspace.expanduser(), args.clone_url)
    config = RunnerConfig(
        command=list(words) if preset else command_from_argv(args.agent_command),
        preset=preset,
        workspaces=workspaces,
        workdir=args.workdir,
        timeout_s=args.timeout,
        roles=tuple(args.role or ()),
        repositories=tuple(args.repository or ()),
        once=args.once,
        wait_s=args.wait,
        kill_grace_s=args.kill_grace,
        give_up_s=args.give_up_after,
    )
    try:
        config.check()
    except RunnerError as e:
        print(f"github-broker agent: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    with (
        BrokerClient(args.broker_url, args.agent_id, token=args.token) as client,
        stop_on_signals(stop) as received,
    ):
        logger.info(
            "%s asking %s for tasks (roles %s)",
            args.agent_id,
            args.broker_url,
            ", ".join(config.roles) or "any",
        )
        try:
            code = Runner(client, config, stop).run()
        except (RunnerError, BrokerClientError) as e:
            print(f"github-broker agent: {type(e).__name__}: {e}", file=sys.stderr)
            return 2 if isinstance(e, RunnerError) else 1
    # The shell convention for "stopped by signal N".
    return 128 + received[0] if received else code


def add_agent_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `agent` on a parser's subcommands."""
    p = subparsers.add_parser(
        "agent",
        help="run an agent command on tasks from a broker",
        description="Ask a broker for tasks and run an agent command on each, heartbeating "
        "while it runs and reporting how it ended.",
        epilog=AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--broker-url",
        default=os.environ.get(URL_ENV, "http://127.0.0.1:8080"),
        help=f"broker base URL (env {URL_ENV}; default %(default)s)",
    )
    agent_id = os.environ.get(AGENT_ENV)
    p.add_argument(
        "--agent-id",
        default=agent_id,
        required=agent_id is None,
        help=f"this agent's id, also a GitHub label (env {AGENT_ENV})",
    )
    p.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"agent bearer token (env {TOKEN_ENV})"
    )
    p.add_argument("--role", action="append", help="a role this agent accepts (repeatable)")
    p.add_argument("--repository", action="append", help="only this owner/name (repeatable)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the command after this long and release the task as failed",
    )
    p.add_argument("--workdir", type=Path, default=Path("."), help="where the command runs")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="run this coding CLI with the task's prompt; words after `--` are added to it",
    )
    p.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="run each task in a git worktree on its branch under DIR (one clone per repository)",
    )
    p.add_argument(
        "--clone-url",
        default=DEFAULT_CLONE_URL,
        help="clone URL template with {repository}, {owner}, {name} (default %(default)s)",
    )
    p.add_argument("--once", action="store_true", help="take one task, report it and exit")
    p.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="long-poll of each task request, 0-60 (default %(default)s)",
    )
    p.add_argument(
        "--kill-grace",
        type=float,
        default=DEFAULT_KILL_GRACE_S,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL (default %(default)s)",
    )
    p.add_argument(
        "--give-up-after",
        type=float,
        default=DEFAULT_GIVE_UP_S,
        metavar="SECONDS",
        help="stop when the broker stays unreachable this long (default %(default)s)",
    )
    p.add_argument(
        "agent_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the agent command and its arguments",
    )
    p.set_defaults(func=cmd_agent)
    return p


def main(argv: list[str] | None = None) -> int:
    """`python -m github_broker.agent.runner agent ...`: the same command without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m github_broker.agent.runner")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    add_agent_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
