"""Dependencies end to end with webhooks: the simulator delivers over HTTP to a real `serve`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator
from tests.conftest import sync_client
from tests.factories import body
from tests.processes import BrokerProcess, broker_env, wait_for
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
SECRET = "s3cret-for-tests"
KEYS = RepoKeys("gb", "acme", "widgets")
W = ("acme", "widgets")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    issues = [
        # Not work (no labels): only the dependents can be handed out.
        {"number": 1, "title": "Upstream A", "body": "the schema"},
        {"number": 2, "title": "Upstream B", "body": "the client"},
        {
            "number": 3,
            "title": "Dependent",
            "body": body(),
            "labels": ["P1", "BACKENDCODER"],
            "blocked_by": [1, 2],
        },
    ]
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": issues}]}) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    env = broker_env(
        redis_url,
        sim.base_url,
        "acme/widgets",
        # One poll pass at start-up, then none during the test: only webhooks can help.
        GITHUB_BROKER_POLL__INTERVAL_S="3600",
        GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
    )
    proc = BrokerProcess(env, tmp_path, "broker").start()
    client = sync_client(redis_url)
    wait_for(lambda: bool(client.hexists(KEYS.graph_blocked, "3")), 20, "the links' first read")
    client.close()
    yield proc
    proc.stop()


def ask(broker: BrokerProcess) -> requests.Response:
    return requests.post(f"{broker.url}/request-task", json={"agent_id": "agent-1"}, timeout=10)


def listings(sim: Simulator) -> int:
    return int(sim.stats.snapshot()["by_route"].get("GET /repos/{owner}/{repo}/issues", 0))


def test_the_dependent_is_claimable_within_a_second_of_its_last_blocker_closing(
    sim: Simulator, broker: BrokerProcess
) -> None:
    url = f"{broker.url}/github/webhook"
    sim.webhooks.add_hook(sim.state, {"url": url, "secret": SECRET, "repository": "acme/widgets"})
    assert sim.webhooks.wait_idle()
    lists = listings(sim)
    sim.state.update_issue(*W, 1, state="closed")
    assert sim.webhooks.wait_idle()
    assert ask(broker).status_code == 204  # #2 still blocks it
    started = time.monotonic()
    sim.state.update_issue(*W, 2, state="closed")
    answer = wait_until(
        lambda: (r := ask(broker)).status_code != 204 and r,
        10,
        "the dependent claimable",
        every_s=0.02,
    )
    latency = time.monotonic() - started
    assert answer.status_code == 200 and answer.json()["issue_id"] == 3
    assert latency < 1.0, latency
    assert listings(sim) == lists  # no poll pass: the deliveries did it


def test_a_link_added_on_github_blocks_within_a_second_by_its_delivery(
    sim: Simulator, broker: BrokerProcess, redis_url: str
) -> None:
    url = f"{broker.url}/github/webhook"
    sim.webhooks.add_hook(sim.state, {"url": url, "secret": SECRET, "repository": "acme/widgets"})
    for n in (1, 2):
        sim.state.unblock(*W, 3, by=(*W, n))
    assert sim.webhooks.wait_idle()
    client = sync_client(redis_url)
    wait_until(lambda: not client.hexists(KEYS.graph_blocked, "3"), 10, "the links' removal")
    started = time.monotonic()
    sim.state.block(*W, 3, by=(*W, 1))
    wait_until(lambda: client.hexists(KEYS.graph_blocked, "3"), 10, "the new link", every_s=0.02)
    assert time.monotonic() - started < 1.0
    client.close()
    assert ask(broker).status_code == 204
    deliveries = sim.webhooks.describe()["deliveries"]
    assert {"issue_dependencies"} <= {d["event"] for d in deliveries}
    assert all(d["status"] == 202 for d in deliveries if d["event"] == "issue_dependencies")
