"""Real processes that stall, die and lose their data: no lease is lost, nothing handed twice."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, start_all
from tests.waiting import wait_until
from tests.world import simulated

pytestmark = pytest.mark.slow
REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")


def leading(client: redis.Redis, brokers: list[BrokerProcess]) -> BrokerProcess | None:
    raw = client.get("gb:leader")
    if raw is None:
        return None
    return next((b for b in brokers if b.holds_leadership(raw.decode())), None)


def signal_all(broker: BrokerProcess, sig: int) -> None:
    """Signal serve and every process under it (API workers, the poller): the whole stalls."""
    for pid in broker.pids():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def post(url: str, path: str, body: dict[str, Any], timeout: float = 5) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, timeout=timeout)


def lease_call(url: str, task: dict[str, Any], agent: str, verb: str) -> requests.Response:
    n = task["issue_id"]
    body = {"agent_id": agent, "token": task["lease"]["token"]}
    if verb == "release":
        body["reason"] = "abandoned"
    return post(url, f"/tasks/acme/widgets/{n}/{verb}", body)


@pytest.fixture
def one_issue() -> Iterator[Simulator]:
    with simulated(generate_issues(1, priorities=("P1",))) as s:
        yield s


def test_stalled_leaders_late_label_delete_does_not_revoke_the_live_lease(
    one_issue: Simulator, redis_url: str, tmp_path: Path
) -> None:
    sim = one_issue
    env = broker_env(redis_url, sim.base_url, REPO, GITHUB_BROKER_LEASES__LEASE_TTL_S="60")
    brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
    client = redis.Redis.from_url(redis_url)
    stopped: BrokerProcess | None = None
    try:
        old = wait_until(lambda: leading(client, brokers), 15, "a leader")
        other = next(b for b in brokers if b is not old)
        wait_until(lambda: client.zcard(KEYS.ready) == 1, 15, "the first sync")
        a = post(other.url, "/request-task", {"agent_id": "agent-a"}).json()
        labels = lambda: set(sim.state.issue_labels("acme", "widgets", 1))  # noqa: E731
        wait_until(lambda: labels() >= {"in-progress", "agent-a"}, 10, "agent-a's labels")

        # The leader's removal of in-progress (a GraphQL mutation) takes 6 s; the leader
        # stalls 9 s meanwhile.
        sim.faults.add_latency(6000, method="POST", path=r"/graphql$", count=1)
        assert lease_call(other.url, a, "agent-a", "release").status_code == 200
        time.sleep(1.0)
        signal_all(old, signal.SIGSTOP)
        stopped, stalled_at = old, time.monotonic()
        wait_until(lambda: leading(client, brokers) is other, 10, "a new leader")

        b = post(other.url, "/request-task", {"agent_id": "agent-b"})
        assert b.status_code == 200 and b.json()["issue_id"] == 1
        task_b = b.json()
        # The stale DELETE lands 6 s after it was sent, after agent-b's labels were written.
        time.sleep(max(0.0, 9.0 - (time.monotonic() - stalled_at)))
        signal_all(old, signal.SIGCONT)
        stopped = None

        for _ in range(8):  # several sync passes and drains of both processes
            time.sleep(1.0)
            beat = lease_call(other.url, task_b, "agent-b", "heartbeat")
            assert beat.status_code == 200, beat.text
            c = post(old.url, "/request-task", {"agent_id": "agent-c"})
            assert c.status_code == 204, "issue #1 was handed out twice"
        wait_until(lambda: labels() >= {"in-progress", "agent-b"}, 10, "agent-b's labels back")
        assert "agent-a" not in labels()
        assert "removed by the broker" in other.log_path.read_text()
    finally:
        if stopped is not None:
            signal_all(stopped, signal.SIGCONT)
        client.close()
        for br in brokers:
            br.stop()


def test_flushall_during_work_keeps_every_holder_and_tells_no_agent_its_lease_ended(
    redis_url: str, tmp_path: Path
) -> None:
    agents = 20
    with simulated(generate_issues(40, priorities=("P1",))) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            REPO,
            GITHUB_BROKER_POLL__INTERVAL_S="3",
            # The newcomer gives back every task it probes with: not a broken agent here.
            GITHUB_BROKER_FAILURES__BREAKER_STREAK="0",
        )
        brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
        client = redis.Redis.from_url(redis_url)
        try:
            wait_until(lambda: client.zcard(KEYS.ready) == 40, 20, "the first sync")
            held = {}
            for i in range(agents):
                r = post(brokers[i % 2].url, "/request-task", {"agent_id": f"agent-{i:02d}"})
                held[f"agent-{i:02d}"] = r.json()
            wait_until(
                lambda: all(
                    {"in-progress", agent}
                    <= set(sim.state.issue_labels("acme", "widgets", t["issue_id"]))
                    for agent, t in held.items()
                ),
                15,
                "the labels of every hand-out",
            )
            # GitHub answers the rebuild's listing slowly: the window is at least 2 s wide.
            sim.faults.add_latency(2000, method="GET", path=r"/issues$", count=3)
            client.flushall()
            flushed_at = time.monotonic()
            answers: dict[int, int] = {}
            # Heartbeats and new agents while the mirror is rebuilt, and after.
            while time.monotonic() - flushed_at < 6:
                for i, (agent, task) in enumerate(held.items()):
                    r = lease_call(brokers[i % 2].url, task, agent, "heartbeat")
                    answers[r.status_code] = answers.get(r.status_code, 0) + 1
                    assert r.status_code in (200, 503), f"{agent} was told {r.text}"
                    if r.status_code == 503:
                        assert r.headers.get("Retry-After")
                newcomer = post(brokers[0].url, "/request-task", {"agent_id": "newcomer"})
                assert newcomer.status_code in (200, 204, 503), newcomer.text
                if newcomer.status_code == 200:
                    got = newcomer.json()
                    held_issues = {t["issue_id"] for t in held.values()}
                    assert got["issue_id"] not in held_issues, "a held issue went to another"
                    lease_call(brokers[0].url, got, "newcomer", "release")
                time.sleep(0.3)
            assert answers.get(503, 0) > 0, "the test never hit the rebuild window"
            for i, (agent, task) in enumerate(held.items()):
                r = lease_call(brokers[i % 2].url, task, agent, "complete")
                assert r.status_code == 200, f"{agent}: {r.text}"
            print(f"\nFLUSHALL during work: answers {answers}, {agents} holders kept")
        finally:
            client.close()
            for b in brokers:
                b.stop()


def test_ready_and_api_fail_fast_when_redis_hangs(tmp_path: Path) -> None:
    from tests.conftest import _redis_exe, _start_redis

    proc, port = _start_redis(_redis_exe(), str(tmp_path))
    url = f"redis://127.0.0.1:{port}/0"
    with simulated(generate_issues(2, priorities=("P1",))) as sim:
        env = broker_env(url, sim.base_url, REPO, GITHUB_BROKER_REDIS__SOCKET_TIMEOUT_S="1.5")
        broker = BrokerProcess(env, tmp_path, "b").start()
        client = redis.Redis(port=port)
        try:
            # The first full pass must have finished (the mirror marked rebuilt) before Redis
            # stalls: a pass cut short by the stall leaves every hand-out refused with
            # "the mirror is being rebuilt" until the next one, long after Redis woke up.
            wait_until(lambda: client.exists(KEYS.mirror), 20, "the first full sync")
            assert requests.get(f"{broker.url}/ready", timeout=5).status_code == 200
            proc.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            ready = requests.get(f"{broker.url}/ready", timeout=10)
            ready_s = time.monotonic() - started
            assert ready.status_code == 503 and ready_s < 1.5, (ready.status_code, ready_s)
            started = time.monotonic()
            beat = post(
                broker.url,
                "/tasks/acme/widgets/1/heartbeat",
                {"agent_id": "a1", "token": "t" * 24},
                timeout=15,
            )
            beat_s = time.monotonic() - started
            assert beat.status_code == 503 and beat.headers.get("Retry-After")
            assert beat_s < 4, beat_s
            started = time.monotonic()
            ask = post(broker.url, "/request-task", {"agent_id": "a1"}, timeout=15)
            assert ask.status_code == 503 and time.monotonic() - started < 4
            print(f"\nRedis hung: /ready {ready_s:.2f}s, heartbeat {beat_s:.2f}s")
            # Redis wakes up and runs the calls that timed out. Their late replies must reach
            # no later call (a timed-out call closes its connection): each agent gets an
            # answer of its own, and its lease is its own.
            proc.send_signal(signal.SIGCONT)
            wait_until(
                lambda: requests.get(f"{broker.url}/ready", timeout=5).status_code == 200,
                10,
                "ready again",
            )
            tasks = {}
            for agent in ("a1", "a2"):
                got = post(broker.url, "/request-task", {"agent_id": agent}, timeout=15)
                assert got.status_code == 200, (agent, got.status_code, got.text)
                tasks[agent] = got.json()
            assert tasks["a1"]["issue_id"] != tasks["a2"]["issue_id"]
            for agent, task in tasks.items():
                beat = post(
                    broker.url,
                    f"/tasks/acme/widgets/{task['issue_id']}/heartbeat",
                    {"agent_id": agent, "token": task["lease"]["token"]},
                    timeout=15,
                )
                assert beat.status_code == 200, (agent, beat.text)
        finally:
            proc.send_signal(signal.SIGCONT)
            broker.stop()
            client.close()
            proc.terminate()
            proc.wait(timeout=10)


def test_sigterm_answers_long_polls_at_once_and_hands_back_leadership(
    one_issue: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = broker_env(redis_url, one_issue.base_url, REPO)
    broker = BrokerProcess(env, tmp_path, "b").start()
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 1, 15, "the first sync")
        assert post(broker.url, "/request-task", {"agent_id": "holder"}).status_code == 200
        wait_until(lambda: client.get("gb:leader") is not None, 10, "leadership")
        answer: dict[str, Any] = {}

        def long_poll() -> None:
            r = post(broker.url, "/request-task", {"agent_id": "w", "wait_seconds": 50}, 60)
            answer["status"] = r.status_code
            answer["at"] = time.monotonic()

        waiter = threading.Thread(target=long_poll)
        waiter.start()
        time.sleep(1.0)
        assert broker.proc is not None
        broker.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        broker.proc.wait(timeout=15)
        exited_s = time.monotonic() - signalled
        waiter.join(timeout=15)
        assert answer["status"] == 204
        assert answer["at"] - signalled < 3
        assert exited_s < 6, exited_s
        assert client.get("gb:leader") is None
        assert "Traceback" not in broker.log_path.read_text()
        print(
            f"\nSIGTERM: long-poll answered in {answer['at'] - signalled:.2f}s, "
            f"exit after {exited_s:.2f}s"
        )
    finally:
        client.close()
        broker.stop()


# --- the race: many agents, two serve processes, the leader killed and stalled -------------

RACE_AGENTS = 100
RACE_ISSUES = 500
#: Seconds the agents are given, after the faults, for RACE_AGENTS claims (a bound for a
#: loaded machine, not waited out).
RACE_AFTER_S = 30.0
LEASE_TTL_S = 3


class Ledger:
    """What the agents saw, with the client's clock: claims and the lease calls that passed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: list[tuple[float, int, str]] = []  # (answer received, issue, agent)
        self.passed: list[tuple[float, int, str, str]] = []  # (request sent, issue, agent, verb)
        self.refused: dict[str, int] = {}
        self.unavailable = 0

    def claimed(self, at: float, n: int, agent: str) -> None:
        with self.lock:
            self.claims.append((at, n, agent))

    def ok(self, sent: float, n: int, agent: str, verb: str) -> None:
        with self.lock:
            self.passed.append((sent, n, agent, verb))

    def double_assignments(self) -> list[tuple[int, str, str]]:
        """Lease calls that passed for an agent after another agent was handed the issue."""
        by_issue: dict[int, list[tuple[float, str]]] = {}
        for at, n, agent in sorted(self.claims):
            by_issue.setdefault(n, []).append((at, agent))
        bad = []
        for sent, n, agent, _ in self.passed:
            before = [a for at, a in by_issue.get(n, []) if at < sent]
            if before and before[-1] != agent:
                bad.append((n, agent, before[-1]))
        return bad

    def lost_completions(self) -> list[tuple[int, str]]:
        """Issues handed out again after a completion the broker accepted."""
        done = {(n, agent): sent for sent, n, agent, verb in self.passed if verb == "complete"}
        return [
            (n, agent)
            for (n, agent), sent in done.items()
            if any(m == n and at > sent for at, m, _ in self.claims)
        ]


def race_agent(i: int, urls: list[str], ledger: Ledger, stop: threading.Event) -> None:
    import random

    agent = f"racer-{i:03d}"
    rng = random.Random(i)
    session = requests.Session()
    k = i

    def call(path: str, body: dict[str, Any]) -> tuple[requests.Response | None, float]:
        nonlocal k
        sent = time.monotonic()
        try:
            r = session.post(f"{urls[k % len(urls)]}{path}", json=body, timeout=(1, 2))
        except requests.RequestException:
            r = None
        if r is None or r.status_code == 503:
            k += 1  # that process is down or stalled: try the other
            with ledger.lock:
                ledger.unavailable += 1
        return r, sent

    while not stop.is_set():
        k += 1  # spread the agents over every process, whichever is killed or stalled
        r, _ = call("/request-task", {"agent_id": agent, "previous": "abandoned"})
        if r is None or r.status_code != 200:
            time.sleep(0.3 if r is not None and r.status_code == 204 else 0.1)
            continue
        task = r.json()
        n, token = task["issue_id"], task["lease"]["token"]
        ledger.claimed(time.monotonic(), n, agent)
        lease = {"agent_id": agent, "token": token}
        work_until = time.monotonic() + rng.uniform(0.5, 2.5)
        lost = False
        while time.monotonic() < work_until and not lost:
            time.sleep(min(0.8, max(0.0, work_until - time.monotonic())))
            beat, sent = call(f"/tasks/acme/widgets/{n}/heartbeat", lease)
            if beat is not None and beat.status_code == 200:
                ledger.ok(sent, n, agent, "heartbeat")
            elif beat is not None and beat.status_code == 409:
                with ledger.lock:
                    reason = beat.json()["reason"]
                    ledger.refused[reason] = ledger.refused.get(reason, 0) + 1
                lost = True
        if lost:
            continue
        verb = "complete" if rng.random() < 0.5 else "release"
        body = {**lease, "reason": "abandoned"} if verb == "release" else lease
        for _ in range(20):
            done, sent = call(f"/tasks/acme/widgets/{n}/{verb}", body)
            if done is not None and done.status_code == 200:
                ledger.ok(sent, n, agent, verb)
                break
            if done is not None and done.status_code == 409:
                with ledger.lock:
                    reason = done.json()["reason"]
                    ledger.refused[reason] = ledger.refused.get(reason, 0) + 1
                break
            time.sleep(0.2)


def claims_since(ledger: Ledger, since: float) -> int:
    with ledger.lock:
        return sum(1 for at, *_ in ledger.claims if at > since)


def labels_without_lease(sim: Simulator, client: redis.Redis) -> list[tuple[int, list[str]]]:
    out = []
    for n in range(1, RACE_ISSUES + 1):
        names = sim.state.issue_labels("acme", "widgets", n)
        ours = [x for x in names if x == "in-progress" or x.startswith("racer-")]
        if not ours:
            continue
        holder = client.hget(KEYS.lease(n), "agent")
        if holder is None or sorted(ours) != sorted(["in-progress", holder.decode()]):
            out.append((n, names))
    return out


def test_race_with_the_leader_killed_and_stalled_hands_nothing_out_twice(
    redis_url: str, tmp_path: Path
) -> None:
    with simulated(generate_issues(RACE_ISSUES, priorities=("P1",))) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            REPO,
            GITHUB_BROKER_LEASES__LEASE_TTL_S=str(LEASE_TTL_S),
        )
        brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
        client = redis.Redis.from_url(redis_url)
        urls = [b.url for b in brokers]
        ledger = Ledger()
        stopped: BrokerProcess | None = None
        stop = threading.Event()
        try:
            wait_until(lambda: client.zcard(KEYS.ready) == RACE_ISSUES, 30, "the first sync")
            started = time.monotonic()
            threads = [
                threading.Thread(target=race_agent, args=(i, urls, ledger, stop), daemon=True)
                for i in range(RACE_AGENTS)
            ]
            for t in threads:
                t.start()
            wait_until(lambda: claims_since(ledger, started) >= RACE_AGENTS, 30, "claims")
            victim = wait_until(lambda: leading(client, brokers), 5, "a leader")
            victim.kill()  # kill -9 in the middle of its drains and syncs
            killed_at = time.monotonic() - started
            replacement = BrokerProcess(env, tmp_path, "b2")
            brokers.append(replacement)

            def restart() -> None:
                replacement.start()
                urls[urls.index(victim.url)] = replacement.url

            restarting = threading.Thread(target=restart)
            restarting.start()
            # The agents race on meanwhile; the stall waits for the restart to be up (a
            # process stopped while it starts is told apart from a stall by nobody).
            restarting.join(timeout=60)
            stalled = wait_until(
                lambda: (b := leading(client, brokers)) is not victim and b, 30, "a new leader"
            )
            signal_all(stalled, signal.SIGSTOP)  # longer than the leader TTL (3 s)
            stopped, stalled_at = stalled, time.monotonic() - started
            time.sleep(5)
            signal_all(stalled, signal.SIGCONT)
            stopped, resumed = None, time.monotonic()
            restarting.join(timeout=30)
            # The least work after the faults: every agent claims again after the stalled
            # leader resumed, and tasks are completed.
            wait_until(
                lambda: claims_since(ledger, resumed) >= RACE_AGENTS,
                RACE_AFTER_S,
                f"{RACE_AGENTS} claims after the stalled leader resumed",
            )
            stop.set()
            for t in threads:
                t.join(timeout=30)
            # Every agent has finished: the labels converge on "nobody holds anything".
            deadline = time.monotonic() + 20
            while labels_without_lease(sim, client) and time.monotonic() < deadline:
                time.sleep(0.5)
            leftover = labels_without_lease(sim, client)
            doubles = ledger.double_assignments()
            lost = ledger.lost_completions()
            completions = sum(1 for *_, verb in ledger.passed if verb == "complete")
            print(
                f"\nrace: {RACE_AGENTS} agents, {len(ledger.claims)} claims, {completions} "
                f"completions, {len(ledger.passed)} lease calls passed, refusals "
                f"{ledger.refused}, {ledger.unavailable} unavailable answers; leader "
                f"{victim.log_path.stem} killed at {killed_at:.1f}s, leader "
                f"{stalled.log_path.stem} stalled at {stalled_at:.1f}s for 5 s; "
                f"{len(doubles)} double assignments, {len(lost)} completions lost, "
                f"{len(leftover)} issues with labels and no lease"
            )
            assert completions >= RACE_AGENTS // 2, completions
            assert doubles == []
            assert lost == []
            assert leftover == []
        finally:
            if stopped is not None:
                signal_all(stopped, signal.SIGCONT)
            stop.set()
            client.close()
            for b in brokers:
                b.stop()


def test_sdk_heartbeat_and_complete_ride_out_a_redis_loss(
    one_issue: Simulator, redis_url: str, tmp_path: Path
) -> None:
    from github_broker.agent.client import BrokerClient

    env = broker_env(redis_url, one_issue.base_url, REPO, GITHUB_BROKER_POLL__INTERVAL_S="3")
    broker = BrokerProcess(env, tmp_path, "b").start()
    client = redis.Redis.from_url(redis_url)
    sdk = BrokerClient(broker.url, "agent-a", retries=6)
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 1, 15, "the first sync")
        task = sdk.request_task()
        assert task is not None
        labels = lambda: set(one_issue.state.issue_labels("acme", "widgets", 1))  # noqa: E731
        wait_until(lambda: labels() >= {"in-progress", "agent-a"}, 10, "the labels")
        client.flushall()
        started = time.monotonic()
        sdk.heartbeat(task)  # 503 + Retry-After until the sync re-adopted the lease
        sdk.complete(task)
        print(f"\nSDK across FLUSHALL: heartbeat and complete in {time.monotonic() - started:.1f}s")
        wait_until(lambda: "needs-review" in labels(), 10, "the completion on GitHub")
    finally:
        sdk.close()
        client.close()
        broker.stop()


def test_runner_keeps_its_command_running_across_a_redis_loss(
    one_issue: Simulator, redis_url: str, tmp_path: Path
) -> None:
    import sys

    from github_broker.agent.client import BrokerClient
    from github_broker.agent.runner import Runner, RunnerConfig

    env = broker_env(
        redis_url,
        one_issue.base_url,
        REPO,
        GITHUB_BROKER_LEASES__LEASE_TTL_S="3",
        GITHUB_BROKER_POLL__INTERVAL_S="3",
    )
    broker = BrokerProcess(env, tmp_path, "b").start()
    client = redis.Redis.from_url(redis_url)
    work = tmp_path / "work"
    work.mkdir()
    # The agent's command: works 6 s, then leaves a mark that it ran to the end.
    (work / "agent.py").write_text("import time\ntime.sleep(6)\nopen('done', 'w').close()\n")
    sdk = BrokerClient(broker.url, "agent-a", backoff_s=0.2)
    result: list[int] = []
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 1, 15, "the first sync")
        config = RunnerConfig(
            command=[sys.executable, str(work / "agent.py")], workdir=work, once=True, wait_s=5
        )
        worker = threading.Thread(target=lambda: result.append(Runner(sdk, config).run()))
        worker.start()
        labels = lambda: set(one_issue.state.issue_labels("acme", "widgets", 1))  # noqa: E731
        wait_until(lambda: labels() >= {"in-progress", "agent-a"}, 10, "the labels")
        client.flushall()
        worker.join(timeout=40)
        assert result == [0] and (work / "done").exists()
        wait_until(lambda: "needs-review" in labels(), 10, "the completion on GitHub")
    finally:
        sdk.close()
        client.close()
        broker.stop()


def test_agent_mutex_taken_by_a_call_redis_ran_late_does_not_lock_the_agent_out(
    tmp_path: Path,
) -> None:
    """Two repositories: an agent's requests are serialised by its mutex in Redis. A request
    whose SET NX times out against a stalled Redis leaves the SET queued; Redis runs it when it
    wakes, and nobody holds the token. The agent must get an answer about one call bound after
    Redis is back, not wait for a 10 s TTL and a 503."""
    from tests.conftest import _redis_exe, _start_redis

    proc, port = _start_redis(_redis_exe(), str(tmp_path))
    url = f"redis://127.0.0.1:{port}/0"
    bound_s = 1.0
    world = {
        "repositories": [
            {"owner": "acme", "name": name, "issues": generate_issues(3, priorities=("P1",))}
            for name in ("widgets", "gadgets")
        ]
    }
    client = redis.Redis(port=port)
    with Simulator(world) as sim:
        env = broker_env(
            url,
            sim.base_url,
            "acme/widgets,acme/gadgets",
            GITHUB_BROKER_REDIS__SOCKET_TIMEOUT_S=str(bound_s),
        )
        broker = BrokerProcess(env, tmp_path, "b").start()
        try:
            gadgets = RepoKeys("gb", "acme", "gadgets")
            wait_until(
                lambda: (
                    client.exists(KEYS.mirror, gadgets.mirror) == 2
                    and client.zcard(KEYS.ready) == 3
                    and client.zcard(gadgets.ready) == 3
                ),
                20,
                "the first full sync of both repositories",
            )
            first = post(broker.url, "/request-task", {"agent_id": "a1"}, timeout=15)
            assert first.status_code == 200, first.text
            proc.send_signal(signal.SIGSTOP)
            try:
                lost = post(broker.url, "/request-task", {"agent_id": "a1"}, timeout=15)
                assert lost.status_code == 503, lost.text
            finally:
                proc.send_signal(signal.SIGCONT)
            wait_until(
                lambda: requests.get(f"{broker.url}/ready", timeout=5).status_code == 200,
                10,
                "ready again",
            )
            started = time.monotonic()
            again = post(broker.url, "/request-task", {"agent_id": "a1"}, timeout=30)
            took = time.monotonic() - started
            assert again.status_code == 200, (again.status_code, again.text, took)
            assert took < 2.5 * bound_s, f"a1 waited {took:.1f}s for its own stale mutex"
            print(f"\nagent mutex after a Redis stall: answered in {took:.2f}s")
        finally:
            proc.send_signal(signal.SIGCONT)
            broker.stop()
            client.close()
            proc.terminate()
            proc.wait(timeout=10)
