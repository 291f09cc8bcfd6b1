"""The GitHub write queue: claims never wait on GitHub, and no write is ever lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
KEYS = RepoKeys("gb", "acme", "widgets")
SLOW_MS = 500


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(12, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


def labels(sim: Simulator, n: int) -> set[str]:
    return set(sim.state.issue_labels("acme", "widgets", n))


def test_slow_github_claims_stay_fast_and_writes_survive_crash_and_5xx(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = broker_env(redis_url, sim.base_url, "acme/widgets")
    broker = BrokerProcess(env, tmp_path, "broker").start()
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 12, 30, "the first sync")
        sim.faults.add_latency(SLOW_MS)

        tasks, latencies = [], []
        for i in range(6):
            started = time.monotonic()
            r = requests.post(
                f"{broker.url}/request-task", json={"agent_id": f"bot-{i}"}, timeout=10
            )
            latencies.append(time.monotonic() - started)
            assert r.status_code == 200
            tasks.append(r.json())
        # Each claim implies three GitHub calls at 500 ms; none of them is on the response path.
        assert max(latencies) < SLOW_MS / 1000

        # Crash the broker while writes are queued, and make GitHub fail for a while.
        broker.kill()
        sim.faults.add_error(502, method="POST")
        broker = BrokerProcess(env, tmp_path, "broker-restarted").start()
        for i in (0, 1):  # two finish, two give up, two keep working
            r = requests.post(
                f"{broker.url}/tasks/acme/widgets/{tasks[i]['issue_id']}/complete",
                json={"agent_id": f"bot-{i}", "token": tasks[i]["lease"]["token"]},
                timeout=10,
            )
            assert r.status_code == 200, r.text
        for i in (2, 3):
            r = requests.post(
                f"{broker.url}/tasks/acme/widgets/{tasks[i]['issue_id']}/release",
                json={"agent_id": f"bot-{i}", "token": tasks[i]["lease"]["token"]},
                timeout=10,
            )
            assert r.status_code == 200, r.text
        time.sleep(2)
        sim.faults.clear()
        wait_until(lambda: client.zcard(KEYS.outbox) == 0, 60, "the write queue to drain")

        branches = sim.state.branches("acme", "widgets")
        for i, task in enumerate(tasks):
            n = task["issue_id"]
            # A branch not made before its lease ended is not made at all (the agent that
            # completes pushed its own; a released task's next claim queues it again).
            if i >= 4:
                assert task["branch_name"] in branches
            if i < 2:
                assert labels(sim, n) >= {"needs-review"}
                assert not labels(sim, n) & {"in-progress", f"bot-{i}"}
            elif i < 4:
                assert not labels(sim, n) & {"in-progress", f"bot-{i}", "needs-review"}
            else:
                assert labels(sim, n) >= {"in-progress", f"bot-{i}"}
    finally:
        client.close()
        broker.stop()


def test_queued_writes_follow_github_back_within_seconds_whatever_the_backoff_grew_to(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    """GitHub refuses writes (503) long enough for the write queue's backoff to grow past
    8 s; once GitHub answers again, the queued labels land within 5 s (a probe or any
    answered call ends the backoff), not when the backoff runs out."""
    env = broker_env(
        redis_url, sim.base_url, "acme/widgets", GITHUB_BROKER_POLL__OUTBOX_INTERVAL_S="0.2"
    )
    broker = BrokerProcess(env, tmp_path, "broker").start()
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 12, 30, "the first sync")
        rule = sim.faults.add_error(503, method="POST")
        got = requests.post(f"{broker.url}/request-task", json={"agent_id": "bot-1"}, timeout=10)
        assert got.status_code == 200
        n = got.json()["issue_id"]

        def refused_writes() -> int:
            return int(sim.stats.snapshot()["by_status"].get("503", 0))

        # Three refused drains in a row: the next pause is 8 s (±20 %) or more.
        wait_until(lambda: refused_writes() >= 3, 30, "three refused write attempts")
        assert sim.faults.remove(rule.id)
        back_s = time.monotonic()
        wait_until(lambda: {"in-progress", "bot-1"} <= labels(sim, n), 10, "the claim's labels")
        assert time.monotonic() - back_s < 5.0
    finally:
        client.close()
        broker.stop()
