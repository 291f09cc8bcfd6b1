"""serve's supervisor: N API workers, each on its own SO_REUSEPORT socket, and the poller.

uvicorn's own `--workers` binds one socket in the parent and lets the workers race to
accept on it; with kept-alive connections the busiest worker wins nearly every accept
(49 of 50 connections went to one of two workers in the benchmark). Here every worker binds
its own socket with SO_REUSEPORT, so the kernel spreads connections over the workers by
their address hash. The poller (sync, write queue, reaper) runs as a process of its own so
its GitHub calls and JSON work never share an event loop or a GIL with the request path.

The supervisor forwards SIGTERM/SIGINT to every child and waits for them; each child dies
with the supervisor (PR_SET_PDEATHSIG), so a `kill -9` of serve leaves no orphans.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
from typing import Any

from github_broker.processes.api_worker import ServeSpec, bind, run_api_worker

logger = logging.getLogger(__name__)

#: Seconds the supervisor waits for its children after forwarding a stop signal.
STOP_GRACE_S = 10.0
#: Seconds between two checks that every child is still alive.
WATCH_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere); exit at once
    if the parent already died while this child was starting."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _child_api(spec: ServeSpec, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    run_api_worker(spec)


def _child_poller(env: dict[str, str], log_level: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    os.environ.update(env)
    from github_broker import logs
    from github_broker.errors import ConfigError
    from github_broker.processes.poller import run_poller
    from github_broker.settings import load_settings

    logs.configure(log_level, logs.default_format())
    try:
        run_poller(load_settings(None))
    except ConfigError as e:
        print(f"github-broker poller: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


class Supervisor:
    """Starts the children, restarts none of them: if one dies, the others are stopped and
    serve exits non-zero, so the orchestrator (systemd, Kubernetes) restarts it whole."""

    def __init__(self, spec: ServeSpec, *, poller: bool) -> None:
        self.spec = spec
        self.poller = poller
        self.children: list[multiprocessing.process.BaseProcess] = []
        self._stopping = False

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        if self.poller:
            self.children.append(
                ctx.Process(
                    target=_child_poller,
                    args=(self.spec.env, self.spec.log_level.upper(), os.getpid()),
                    name="github-broker-poller",
                )
            )
        for i in range(self.spec.workers):
            self.children.append(
                ctx.Process(
                    target=_child_api, args=(self.spec, os.getpid()), name=f"github-broker-api-{i}"
                )
            )
        for child in self.children:
            child.start()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stopping = True
        for child in self.children:
            if child.pid and child.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def run(self) -> int:
        # Check the port before starting anything: a clear message instead of N tracebacks.
        bind(self.spec.host, self.spec.port, reuse_port=True).close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._start()
        code = 0
        while not self._stopping:
            dead = [c for c in self.children if not c.is_alive()]
            if dead:
                logger.error(
                    "%s exited with code %s; stopping serve", dead[0].name, dead[0].exitcode
                )
                code = 1
                self._on_signal(signal.SIGTERM, None)
                break
            time.sleep(WATCH_INTERVAL_S)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in self.children:
            child.join(max(0.0, deadline - time.monotonic()))
            if child.is_alive():
                logger.warning("%s did not stop in time; killing it", child.name)
                child.kill()
                child.join(5)
        return code
