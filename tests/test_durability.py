"""Nothing acknowledged is lost when Redis is: durable acknowledgements, leases that prove
themselves with their signed tokens, completions recovered. Real processes throughout: serve,
redis-servers killed with SIGKILL and started again, a replica promoted, FLUSHALL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.simulator import Simulator, generate_issues
from tests.conftest import _redis_exe, free_port
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
REPO = "acme/widgets"
READY = "gb:{repo::acme::widgets}:ready"
SIGNING = '{"k1": "0123456789abcdef0123456789"}'


class RedisNode:
    """A redis-server of our own on a fixed port, killed with SIGKILL and started again there
    with the same files."""

    def __init__(self, workdir: Path, *args: str) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisNode:
        self.proc = subprocess.Popen(
            [
                _redis_exe(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                str(self.workdir),
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(self.answers, 15, f"redis-server on {self.port}")
        except BaseException:
            self.kill()
            raise
        return self

    def answers(self) -> bool:
        client = redis.Redis(port=self.port, socket_timeout=1)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
            return False
        finally:
            client.close()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[..., RedisNode]]:
    """Started redis-servers (named directory under tmp_path, extra arguments); every one is
    stopped at the end of the test, however it ends (a failed start, a failed assertion)."""
    made: list[RedisNode] = []

    def start(name: str, *args: str) -> RedisNode:
        node = RedisNode(tmp_path / name, *args)
        made.append(node)
        return node.start()

    yield start
    for node in made:
        if node.proc is not None and node.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(node.proc.pid, signal.SIGCONT)
        node.stop()


class Proxy:
    """A TCP forwarder whose target can be switched: the broker's one Redis address before
    and after a failover, as a Sentinel-aware client or a virtual IP would give it."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.server = socket.create_server(("127.0.0.1", self.port))
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=2)
            except OSError:
                client.close()
                continue
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.close()

    def switch(self, target: int) -> None:
        """New connections go to `target`; the open ones are cut (as a failover does)."""
        self.target = target
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.conns = []

    def close(self) -> None:
        self.server.close()
        self.switch(self.target)


def replica_online(primary: RedisNode) -> bool:
    """Whether the primary's replica finished its first sync (WAIT counts only those)."""
    client = primary.client()
    try:
        info = client.info("replication")
    finally:
        client.close()
    replica = info.get("slave0")
    return isinstance(replica, dict) and replica.get("state") == "online"


@dataclass
class Ledger:
    """What the agents were told, and what they were handed."""

    #: (agent, issue) of every development hand-out answered 200.
    handed: list[tuple[str, int]] = field(default_factory=list)
    #: issues whose completion was answered 200.
    completed: set[int] = field(default_factory=set)
    #: every answer to a lease call: (agent, issue, status, reason).
    lease_answers: list[tuple[str, int, int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def call(url: str, path: str, body: dict[str, Any]) -> requests.Response | None:
    try:
        return requests.post(f"{url}{path}", json=body, timeout=10)
    except requests.RequestException:
        return None


def agent_loop(url: str, sim: Simulator, name: str, ledger: Ledger, stop: threading.Event) -> None:
    """Claim, heartbeat, open a PR, complete; retry what answers 503 (as the SDK does)."""
    while not stop.is_set():
        got = call(url, "/request-task", {"agent_id": name, "previous": "completed"})
        if got is None or got.status_code != 200:
            time.sleep(0.2)
            continue
        task = got.json()
        n = task["issue_id"]
        if task["task_type"] != "development":
            continue
        with ledger.lock:
            ledger.handed.append((name, n))
        lease = {"agent_id": name, "token": task["lease"]["token"]}
        for verb in ("heartbeat", "heartbeat", "complete"):
            if verb == "complete":
                sim.state.create_pull(
                    "acme",
                    "widgets",
                    title=f"#{n}",
                    head=task["branch_name"],
                    body=f"Closes #{n}",
                    user="bot",
                )
            tried = False
            while not stop.is_set():
                answer = call(url, f"/tasks/{REPO}/{n}/{verb}", lease)
                if answer is None or answer.status_code == 503:
                    tried = True  # it may have gone through (Redis dropped the reply)
                    time.sleep(0.2)
                    continue
                reason = "" if answer.status_code == 200 else answer.json().get("reason", "")
                if tried and verb == "complete" and reason == "completed":
                    answer.status_code, reason = 200, ""  # the earlier try landed: as the SDK
                with ledger.lock:
                    ledger.lease_answers.append((name, n, answer.status_code, reason))
                    if verb == "complete" and answer.status_code == 200:
                        ledger.completed.add(n)
                break
            time.sleep(0.1)


def run_agents(
    url: str, sim: Simulator, ledger: Ledger, count: int
) -> tuple[threading.Event, list[threading.Thread]]:
    stop = threading.Event()
    threads = [
        threading.Thread(target=agent_loop, args=(url, sim, f"agent-{i}", ledger, stop))
        for i in range(count)
    ]
    for t in threads:
        t.start()
    return stop, threads


def assert_nothing_acknowledged_was_lost(ledger: Ledger) -> None:
    expired = [a for a in ledger.lease_answers if a[3] in ("expired", "not_leased")]
    assert expired == [], f"agents told their lease ended: {expired}"
    again = [(agent, n) for agent, n in ledger.handed if n in ledger.completed]
    twice = {n for n in {n for _, n in ledger.handed} if [m for _, m in ledger.handed].count(n) > 1}
    assert not (twice & ledger.completed), f"completed tasks handed out again: {again}"


def broker_on(redis_url: str, sim: Simulator, tmp_path: Path, **env: str) -> BrokerProcess:
    return BrokerProcess(
        broker_env(
            redis_url,
            sim.base_url,
            REPO,
            GITHUB_BROKER_LEASES__SIGNING_KEYS=SIGNING,
            GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
            GITHUB_BROKER_LEASES__LEASE_TTL_S="9",
            GITHUB_BROKER_REDIS__SOCKET_TIMEOUT_S="1",
            **env,
        ),
        tmp_path,
        "broker",
    ).start(timeout_s=60)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": "widgets",
                    "issues": generate_issues(60, priorities=("P1",)),
                }
            ]
        }
    ) as s:
        yield s


def test_a_lease_claimed_just_before_flushall_is_its_holders_and_nobody_elses(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    """Its labels never reached GitHub (label writes fail), Redis loses everything: the holder's
    heartbeats answer 503 while the mirror is rebuilt and then 200 (its signed token proves
    the lease); nobody else gets the issue meanwhile."""
    sim.faults.add_error(502, method="POST", path=r"/labels$")
    sim.faults.add_error(502, method="POST", path=r"/graphql$")
    broker = broker_on(redis_url, sim, tmp_path)
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.zcard(READY) == 60, 30, "the first sync")
        task = requests.post(f"{broker.url}/request-task", json={"agent_id": "holder"}).json()
        n = task["issue_id"]
        client.flushall()
        lease = {"agent_id": "holder", "token": task["lease"]["token"]}
        beats: list[int] = []
        others: list[int] = []

        def proven() -> bool:
            """One heartbeat of the holder, one request of each other agent: the holder's
            beat answered 200 (its lease proven)."""
            r = requests.post(f"{broker.url}/tasks/{REPO}/{n}/heartbeat", json=lease, timeout=10)
            beats.append(r.status_code)
            assert r.status_code in (200, 503), r.text
            for other in ("b", "c"):
                got = requests.post(f"{broker.url}/request-task", json={"agent_id": other})
                assert got.status_code in (200, 204, 503), got.text
                if got.status_code == 200:
                    others.append(got.json()["issue_id"])
            return r.status_code == 200

        wait_until(proven, 30, "the holder's heartbeat answered 200", every_s=0.5)
        assert 503 in beats, beats
        assert n not in others, (n, others)

        # And after the quarantine the others get work, still never the holder's issue.
        def handed() -> int | None:
            got = requests.post(f"{broker.url}/request-task", json={"agent_id": "b"})
            return int(got.json()["issue_id"]) if got.status_code == 200 else None

        others.append(wait_until(handed, 20, "work for another agent", every_s=0.5))
        assert others and n not in others
        assert client.hget(f"gb:{{repo::acme::widgets}}:lease:{n}", "agent") == b"holder"
    finally:
        client.close()
        broker.stop()


#: Tasks the agents complete before Redis is lost, and after it: the least work each
#: durability test sees on either side of the loss.
DONE_BEFORE = 3
DONE_AFTER = 5
#: Seconds the agents are given for that work on either side (a rebuild and its hold-back
#: included): a bound for a loaded machine, never waited out when the work is done.
WORK_TIMEOUT_S = 60.0


def completed(ledger: Ledger, at_least: int, what: str) -> int:
    """How many tasks were completed, once at least `at_least` were."""
    return wait_until(
        lambda: len(ledger.completed) if len(ledger.completed) >= at_least else 0,
        WORK_TIMEOUT_S,
        what,
    )


def in_flight(ledger: Ledger) -> tuple[set[int], int]:
    """The issues the agents hold now (handed out, not completed), and how many lease answers
    they had been given so far."""
    with ledger.lock:
        return {n for _, n in ledger.handed} - ledger.completed, len(ledger.lease_answers)


def answered_200_since(ledger: Ledger, issues: set[int], mark: int) -> set[int]:
    """Which of `issues` got a lease call answered 200 after the first `mark` answers."""
    with ledger.lock:
        return {n for _, n, status, _ in ledger.lease_answers[mark:] if status == 200} & issues


def work_across_a_loss(ledger: Ledger, lose: Callable[[], None]) -> None:
    """DONE_BEFORE tasks completed, `lose` Redis's data while the agents hold tasks; then a
    task held at the loss is answered 200 again (its lease kept) and DONE_AFTER more tasks
    are completed."""
    before = completed(ledger, DONE_BEFORE, f"{DONE_BEFORE} tasks completed before the loss")
    held, mark = wait_until(lambda: (t := in_flight(ledger))[0] and t, 10, "a task held")
    lose()
    wait_until(
        lambda: answered_200_since(ledger, held, mark),
        WORK_TIMEOUT_S,
        f"a lease call of a task held at the loss ({sorted(held)}) answered 200 after it",
    )
    completed(ledger, before + DONE_AFTER, f"{DONE_AFTER} tasks completed after the loss")


def agents_across_a_loss(
    url: str, sim: Simulator, lose: Callable[[], None], agents: int = 5
) -> Ledger:
    """Agents at work on the broker at `url` across `lose` (`work_across_a_loss`)."""
    ledger = Ledger()
    stop, threads = run_agents(url, sim, ledger, agents)
    try:
        work_across_a_loss(ledger, lose)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    return ledger


def test_with_aof_durability_a_kill_and_restart_of_redis_loses_no_acknowledged_write(
    sim: Simulator, tmp_path: Path, nodes: Callable[..., RedisNode]
) -> None:
    node = nodes("redis", "--appendonly", "yes", "--appendfsync", "always")
    broker = broker_on(node.url, sim, tmp_path, GITHUB_BROKER_REDIS__DURABILITY="aof")
    client = node.client()
    try:
        wait_until(lambda: client.zcard(READY) == 60, 30, "the first sync")

        def restart() -> None:
            node.kill()
            node.start()

        ledger = agents_across_a_loss(broker.url, sim, restart)
        assert_nothing_acknowledged_was_lost(ledger)
    finally:
        client.close()
        broker.stop()


def test_without_durability_a_lost_second_tells_nobody_their_lease_ended(
    sim: Simulator, tmp_path: Path, nodes: Callable[..., RedisNode]
) -> None:
    """AOF everysec, durability none: the restart loses up to a second of writes. Leases are
    proven by their signed tokens after the rebuild; completions whose label write was lost are
    recovered from their PRs; no completed task is handed out again. The agents complete
    tasks before and after the loss, and a task held at the loss is worked on after it."""
    node = nodes("redis", "--appendonly", "yes", "--appendfsync", "everysec")
    broker = broker_on(node.url, sim, tmp_path)
    client = node.client()
    try:
        wait_until(lambda: client.zcard(READY) == 60, 30, "the first sync")

        def restart() -> None:
            node.kill()
            node.start()

        ledger = agents_across_a_loss(broker.url, sim, restart)
        assert_nothing_acknowledged_was_lost(ledger)
    finally:
        client.close()
        broker.stop()


def test_with_replica_durability_a_promoted_replica_has_every_acknowledged_write(
    sim: Simulator, tmp_path: Path, nodes: Callable[..., RedisNode]
) -> None:
    primary = nodes("primary", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
    replica = nodes("replica", "--appendonly", "no", "--replicaof", "127.0.0.1", str(primary.port))
    proxy = Proxy(primary.port)
    url = f"redis://127.0.0.1:{proxy.port}/0"
    broker = None
    try:
        wait_until(lambda: replica_online(primary), 15, "the replica's first sync")
        broker = broker_on(url, sim, tmp_path, GITHUB_BROKER_REDIS__DURABILITY="replica")
        client = primary.client()
        wait_until(lambda: client.zcard(READY) == 60, 30, "the first sync")
        client.close()

        def fail_over() -> None:
            primary.kill()
            promoted = replica.client()
            promoted.execute_command("REPLICAOF", "NO", "ONE")
            promoted.close()
            proxy.switch(replica.port)
            # A replica of the promoted one (as Sentinel re-points the others): without one
            # every write answers 503 "not durable", and no work is done after the loss.
            nodes("replica-2", "--appendonly", "no", "--replicaof", "127.0.0.1", str(replica.port))
            wait_until(lambda: replica_online(replica), 15, "the new replica's first sync")

        ledger = agents_across_a_loss(broker.url, sim, fail_over)
        assert_nothing_acknowledged_was_lost(ledger)
    finally:
        if broker is not None:
            broker.stop()
        proxy.close()


def test_replica_durability_answers_503_while_no_replica_acknowledges(
    sim: Simulator, tmp_path: Path, nodes: Callable[..., RedisNode]
) -> None:
    primary = nodes("primary", "--appendonly", "no", "--repl-diskless-sync-delay", "0")
    replica = nodes("replica", "--appendonly", "no", "--replicaof", "127.0.0.1", str(primary.port))
    wait_until(lambda: replica_online(primary), 15, "the replica's first sync")
    broker = broker_on(
        primary.url,
        sim,
        tmp_path,
        GITHUB_BROKER_REDIS__DURABILITY="replica",
        GITHUB_BROKER_REDIS__DURABLE_TIMEOUT_MS="300",
    )
    try:
        client = primary.client()
        wait_until(lambda: client.zcard(READY) == 60, 30, "the first sync")
        ok = requests.post(f"{broker.url}/request-task", json={"agent_id": "a1"})
        assert ok.status_code == 200, ok.text
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            refused = requests.post(f"{broker.url}/request-task", json={"agent_id": "a2"})
            assert refused.status_code == 503 and "not durable" in refused.json()["detail"]
            assert time.monotonic() - started < 3
        finally:
            os.kill(replica.proc.pid, signal.SIGCONT)
        # The retry (within the settle grace's reach: its held task) gets the same task.
        again = requests.post(f"{broker.url}/request-task", json={"agent_id": "a2"})
        assert again.status_code == 200
        client.close()
    finally:
        broker.stop()
