"""Real broker processes for tests: `github-broker serve` under uvicorn, started and killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import free_port
from tests.waiting import wait_until

#: Seconds a broker may take to answer /health: a start-up is one to three seconds alone, but
#: under parallel test workers on a loaded 2-core machine spawning serve's children has taken 13.
START_TIMEOUT_S = 60.0


class BrokerProcess:
    """One `github-broker serve` process configured by environment variables."""

    def __init__(
        self,
        env: dict[str, str],
        log_dir: Path,
        name: str,
        workers: int = 1,
        preexec_fn: Callable[[], None] | None = None,
        *,
        single_process: bool = False,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env}
        self.log_path = log_dir / f"{name}.log"
        self.workers = workers
        #: Run in the child before serve starts (a lowered file limit, say).
        self.preexec_fn = preexec_fn
        #: `serve --single-process`: the API with the poller inside it, one process instead of
        #: a supervisor, an API worker and a poller (each spawned one imports the whole stack).
        self.single_process = single_process
        self.proc: subprocess.Popen[bytes] | None = None
        #: Whether it answered once: a restart keeps its port, whatever happens.
        self.started = False
        self._log_from = 0

    def start(self, timeout_s: float = START_TIMEOUT_S) -> BrokerProcess:
        return self.launch().wait_started(timeout_s)

    def launch(self) -> BrokerProcess:
        """Spawn the process without waiting for it to answer (see `start_all`)."""
        with self.log_path.open("ab") as log:
            self._log_from = log.tell()
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "github_broker",
                    "serve",
                    "--port",
                    str(self.port),
                    "--workers",
                    str(self.workers),
                    *(["--single-process"] if self.single_process else []),
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=self.preexec_fn,
            )
        return self

    def wait_started(self, timeout_s: float = START_TIMEOUT_S) -> BrokerProcess:
        """Wait until the launched process answers /health. If it does not, it is killed:
        a half-started broker left behind would take the poller's leadership in the next
        test's Redis."""
        try:
            return self._wait_started(timeout_s)
        except BaseException:
            self.kill()
            raise

    def _wait_started(self, timeout_s: float) -> BrokerProcess:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if not self.started and self._port_taken():
                    # Taken between its pick and serve's bind (a client's outgoing connection
                    # may take any free port): a first start moves to another.
                    self.port = free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    self.launch()
                    continue
                raise RuntimeError(f"broker exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                    self.started = True
                    return self
            except (requests.ConnectionError, requests.Timeout):
                pass  # not listening yet, or too busy starting to answer within a second
            time.sleep(0.1)
        raise RuntimeError(f"broker did not start:\n{self.log_path.read_text()[-3000:]}")

    def _port_taken(self) -> bool:
        with self.log_path.open("rb") as log:
            log.seek(self._log_from)
            return b"Address already in use" in log.read()

    def pids(self) -> set[int]:
        """serve's supervisor and every process under it (API workers, the poller)."""
        if self.proc is None:
            return set()
        parents: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    raw = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                parents[int(entry)] = int(raw[raw.rindex(")") + 2 :].split()[1])
        found, todo = set(), [self.proc.pid]
        while todo:
            current = todo.pop()
            found.add(current)
            todo.extend(child for child, parent in parents.items() if parent == current)
        return found

    def holds_leadership(self, leader_id: str) -> bool:
        """Whether the poller's leader id (`host:pid:suffix`) names one of this serve's
        processes."""
        return int(leader_id.split(":")[1]) in self.pids()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def start_all(
    brokers: list[BrokerProcess], timeout_s: float = START_TIMEOUT_S
) -> list[BrokerProcess]:
    """Start several brokers side by side (their start-ups overlap); all answer on return. If
    one fails to start, every one is stopped before the error propagates."""
    try:
        for broker in brokers:
            broker.launch()
        for broker in brokers:
            broker.wait_started(timeout_s)
    except BaseException:
        for broker in brokers:
            broker.kill()
        raise
    return brokers


def broker_env(redis_url: str, github_url: str, repositories: str, **extra: str) -> dict[str, str]:
    env = {
        "GITHUB_BROKER_CONFIG_DIR": str(Path(__file__).parent / "no-config"),
        "GITHUB_BROKER_REPOSITORIES": repositories,
        "GITHUB_BROKER_REDIS__URL": redis_url,
        "GITHUB_BROKER_GITHUB__BASE_URL": github_url,
        "GITHUB_BROKER_GITHUB__TOKEN": "test-token",
        "GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES": "0",
        "GITHUB_BROKER_POLL__INTERVAL_S": "1",
        "GITHUB_BROKER_POLL__OUTBOX_INTERVAL_S": "0.2",
        "GITHUB_BROKER_POLL__LEADER_TTL_S": "3",
    }
    env.update(extra)
    return env


def post(url: str, path: str, body: dict[str, Any]) -> requests.Response:
    """POST `body` as JSON to `path` of the broker at `url`."""
    return requests.post(f"{url}{path}", json=body, timeout=10)


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Wait until `check` holds (`tests.waiting.wait_until`: it says what it waited for)."""
    wait_until(check, timeout_s, what)


@contextmanager
def live_broker(
    sim: Simulator,
    redis_url: str,
    tmp_path: Path,
    issues: int,
    *,
    single_process: bool = False,
    **extra: str,
) -> Iterator[BrokerProcess]:
    """`github-broker serve` on acme/widgets against `sim`, once its first sync has made the
    `issues` simulated issues claimable; stopped on exit. `extra`: more environment."""
    env = broker_env(redis_url, sim.base_url, "acme/widgets", **extra)
    proc = BrokerProcess(env, tmp_path, "broker", single_process=single_process).start()
    try:
        client = redis.Redis.from_url(redis_url)
        try:
            ready = RepoKeys("gb", "acme", "widgets").ready
            wait_for(lambda: client.zcard(ready) == issues, 30, "the first sync")
        finally:
            client.close()
        yield proc
    finally:
        proc.stop()


@dataclass(frozen=True)
class LiveStack:
    """A simulator holding acme/widgets, and a broker process serving it over HTTP."""

    sim: Simulator
    broker: BrokerProcess


@contextmanager
def live_stack(
    redis_url: str, tmp_path: Path, *, issues: int = 1, env: dict[str, str] | None = None
) -> Iterator[LiveStack]:
    """A simulator whose acme/widgets holds `issues` P1 issues (#1, #2, ...) and
    `serve --single-process` on it, its first sync done: the stack of the tests whose subject
    is the agent side (SDKs, runner, presets). They need a real broker over HTTP, not serve's
    process layout (test_serve_processes, test_stalls and the other fault tests start that),
    and one process starts in half the time and CPU of three."""
    seed = {
        "repositories": [
            {
                "owner": "acme",
                "name": "widgets",
                "issues": generate_issues(issues, priorities=("P1",)),
            }
        ]
    }
    with (
        Simulator(seed) as sim,
        live_broker(sim, redis_url, tmp_path, issues, single_process=True, **(env or {})) as proc,
    ):
        yield LiveStack(sim, proc)
