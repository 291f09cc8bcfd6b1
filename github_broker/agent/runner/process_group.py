"""The agent command's process group: started in a session of its own, signalled and ended
as a whole, so nothing it started outlives the task."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

#: How often (seconds) the end of a command's process group is checked.
GROUP_POLL_S = 0.05
#: Seconds the rest of a group is waited for after SIGKILL (the kernel delivers it to each).
KILLED_WAIT_S = 2.0


class ProcessGroup:
    """One command and every process it starts (its pid is the group's id)."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str = "") -> None:
        self.proc = proc
        #: Who runs it, for log lines (agent id and task).
        self.name = name or f"command {proc.pid}"
        #: Stopped with SIGSTOP (suspend) and not continued since.
        self.suspended = False

    @classmethod
    def spawn(
        cls,
        command: Sequence[str] | str,
        *,
        cwd: Path,
        env: dict[str, str],
        stdin: IO[bytes] | int,
        stdout: IO[bytes] | int | None,
        stderr: IO[bytes] | int | None,
        name: str = "",
    ) -> ProcessGroup:
        """Start `command` (a string through the shell); OSError if it cannot start."""
        shell = isinstance(command, str)
        # A session of its own: a terminal's Ctrl-C reaches only the runner, which stops the
        # whole group (shell and grandchildren) and releases the lease itself.
        proc = subprocess.Popen(
            command if shell else list(command),
            shell=shell,
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        return cls(proc, name)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def suspend(self) -> None:
        """Stop every process of the group where it is (SIGSTOP); `resume` continues them."""
        self.signal(signal.SIGSTOP)
        self.suspended = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.suspended = False

    def alive(self) -> bool:
        """Whether a process of the group still runs. Zombies don't count: an orphan's zombie
        waits for an init that may never reap it."""
        return group_alive(self.proc.pid)

    def terminate(self, grace_s: float) -> int | None:
        """End the whole group: SIGTERM, `grace_s` seconds, SIGKILL; returns the leader's exit
        code. The group, not just its leader: a shell that dies at once on SIGTERM would
        otherwise leave a child that traps it working on after the task was released."""
        self.signal(signal.SIGTERM)
        if self.suspended:  # a stopped process acts on SIGTERM only once continued
            self.resume()
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not self.alive():
                return self.proc.returncode
            time.sleep(GROUP_POLL_S)
        logger.warning(
            "%s: command %d (or a process it started) ignored SIGTERM for %.1fs; killing them",
            self.name,
            self.proc.pid,
            grace_s,
        )
        self.signal(signal.SIGKILL)
        code = self.proc.wait()
        # SIGKILL is delivered to the rest of the group asynchronously: the leader's exit does
        # not mean its children are gone yet. Wait for them, a bounded time.
        deadline = time.monotonic() + KILLED_WAIT_S
        while self.alive() and time.monotonic() < deadline:
            time.sleep(GROUP_POLL_S)
        return code


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs, zombies aside."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    wanted = str(pgid)
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if pgrp == wanted and state != "Z":
            return True
    return False
