"""A decision holds when Redis loses its data and another process leads the rebuild.

The leader keeps a copy of the deployment's decisions (paused agents, a broker pause,
keep-aways) to write back after a loss. Here the leader's poller is stopped (SIGSTOP) before
Redis is flushed, so the other serve process's poller leads the rebuild: it must write back
the keep-away a maintainer's revoke set from its own copy. Before each process kept one, the
revoked agent was handed its issue again as soon as the post-loss hold-back ended.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from github_broker.keys import GlobalKeys, RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, start_all
from tests.test_durability import SIGNING
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")
GLOBAL = GlobalKeys("gb")
#: Each process checks its leadership (and refreshes its copy) every LEADER_TTL_S / 3.
LEADER_TTL_S = 1.5
TRIES = 20


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(1, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


def ask(url: str, agent: str) -> requests.Response:
    return requests.post(f"{url}/request-task", json={"agent_id": agent}, timeout=10)


def test_a_keep_away_holds_when_another_process_leads_the_rebuild_after_a_loss(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = broker_env(
        redis_url,
        sim.base_url,
        REPO,
        GITHUB_BROKER_LEASES__SIGNING_KEYS=SIGNING,
        GITHUB_BROKER_LEASES__LEASE_TTL_S="6",
        GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
        GITHUB_BROKER_POLL__LEADER_TTL_S=str(LEADER_TTL_S),
    )
    brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
    client = redis.Redis.from_url(redis_url)
    stopped: int | None = None
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 1, 30, "the first sync")
        got = ask(brokers[0].url, "kept")
        assert got.status_code == 200, got.text
        n = got.json()["issue_id"]
        revoked = requests.post(
            f"{brokers[1].url}/admin/tasks/{REPO}/{n}/revoke",
            json={"reason": "wrong approach"},
            timeout=10,
        )
        assert revoked.status_code == 200, revoked.text
        assert f"kept is not handed #{n} again" in revoked.json()["outcome"]
        wait_until(lambda: client.hlen(GLOBAL.kept_away) == 1, 10, "the deployment's keep-away")
        # Every process refreshes its copy at its leadership check (nothing outside shows
        # it): six checks' time, for a machine loaded by the rest of the suite.
        time.sleep(6 * LEADER_TTL_S / 3)
        leader = wait_until(lambda: client.get(GLOBAL.leader), 10, "a leader")
        stopped = int(leader.decode().split(":")[1])
        os.kill(stopped, signal.SIGSTOP)  # the leader's poller, with its copy, stands still
        client.flushall()
        new_leader = wait_until(
            lambda: (client.get(GLOBAL.leader) or b"").decode() or None, 20, "a new leader"
        )
        assert int(new_leader.split(":")[1]) != stopped
        wait_until(lambda: client.exists(KEYS.mirror), 30, "the rebuild")
        wait_until(lambda: not client.exists(KEYS.quarantine), 30, "the hold-back's end")
        answers = [ask(brokers[i % 2].url, "kept").status_code for i in range(TRIES)]
        assert answers == [204] * TRIES, f"the revoked agent was answered {answers}"
        other = ask(brokers[0].url, "someone-else")
        assert other.status_code == 200 and other.json()["issue_id"] == n, other.text
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        client.close()
        for broker in brokers:
            broker.stop()
