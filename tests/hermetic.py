"""What keeps the suite hermetic: each test its own runtime directory, and no process that the
suite started may outlive it.

Every process a test worker starts carries `OWNER_ENV` in its environment (children inherit
it, and so do grandchildren that are reparented to init when their parent dies). At the end of
each worker's session, the processes that still carry the worker's mark, or still descend from
the worker, are named, killed and reported; the controller then fails the run. A leftover
`redis-server` or broker would otherwise hold ports and CPU for the next run, or for a
`make sandbox` beside it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Environment variable that marks the processes one test worker started.
OWNER_ENV = "GB_TEST_PROCESS_OWNER"
#: Directory (shared by the controller and its workers) where workers report leftovers.
REPORT_DIR_ENV = "GB_TEST_LEFTOVER_DIR"
#: Seconds a process that is on its way out (SIGTERM sent by a fixture) is given to end.
GRACE_S = 5.0


def configure() -> None:
    """Mark this process's children as ours (each xdist worker gets its own mark)."""
    os.environ[OWNER_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    if REPORT_DIR_ENV not in os.environ:  # the controller, or a run without xdist
        report_dir = Path(f"/tmp/gb-test-leftovers-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        report_dir.mkdir()
        os.environ[REPORT_DIR_ENV] = str(report_dir)


@pytest.fixture(autouse=True)
def own_runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test its own `XDG_RUNTIME_DIR` (where a running sandbox says how to reach it):
    a sandbox the person runs beside the suite is never seen by a test, nor the reverse; and
    its own `XDG_STATE_HOME`."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    # And its own state directory: where a broker with tokens generates its signing key.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("GITHUB_BROKER_STATE_DIR", raising=False)
    yield runtime


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone meanwhile, or not ours to read
        return b""


def _parent(pid: int) -> int:
    stat = _read(pid, "stat")
    # The command name (second field) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else 0


def _is_zombie(pid: int) -> bool:
    stat = _read(pid, "stat")
    return stat[stat.rfind(b")") + 2 :][:1] == b"Z"


def leftovers(mark: str, me: int) -> dict[int, str]:
    """pid -> command line of every live process marked `mark` or descending from `me`."""
    needle = f"{OWNER_ENV}={mark}".encode()
    parents = {pid: _parent(pid) for pid in _pids()}

    def descends(pid: int) -> bool:
        seen = set()
        while pid > 1 and pid not in seen:
            seen.add(pid)
            pid = parents.get(pid, 0)
            if pid == me:
                return True
        return False

    found = {}
    for pid in parents:
        if pid == me or _is_zombie(pid):
            continue
        if descends(pid) or needle in _read(pid, "environ").split(b"\0"):
            found[pid] = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")
    return found


def finish(session: pytest.Session) -> None:
    """At the end of a worker's session: kill and report what it left running; at the end of
    the controller's, fail the run if any worker reported anything."""
    mark, me = os.environ[OWNER_ENV], os.getpid()
    # xdist's controller starts only its workers (which carry its mark from their start):
    # each worker checks its own children, and the controller reads their reports.
    controller = bool(getattr(session.config.option, "numprocesses", None))
    controller = controller and not hasattr(session.config, "workerinput")
    deadline = time.monotonic() + GRACE_S
    left = {} if controller else leftovers(mark, me)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(mark, me)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    report_dir = Path(os.environ[REPORT_DIR_ENV])
    if left:
        (report_dir / f"{mark}.txt").write_text(
            "".join(f"{pid} {cmd.strip()}\n" for pid, cmd in sorted(left.items()))
        )
    if hasattr(session.config, "workerinput"):
        return  # a worker: the controller reads the report
    reports = sorted(report_dir.glob("*.txt"))
    lines = [line for r in reports for line in r.read_text().splitlines()]
    for r in reports:
        r.unlink()
    report_dir.rmdir()
    if lines:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "processes started by the suite outlived it (killed now):\n  " + "\n  ".join(
            lines
        )
        if reporter is not None:
            reporter.write_sep("=", "leftover processes", red=True)
            reporter.write_line(message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
