"""Comment commands end to end: a real `serve` process, the simulator commenting as people and
delivering over HTTP (or not at all: the poll's read of new comments)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator
from tests.conftest import sync_client
from tests.factories import body
from tests.processes import BrokerProcess, broker_env, post, wait_for

pytestmark = pytest.mark.slow
SECRET = "s3cret-for-tests"
REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    issues = [
        {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in (1, 2)
    ]
    repo = {"owner": "acme", "name": "widgets", "issues": issues}
    repo["collaborators"] = {"alice": "write", "rita": "read"}
    with Simulator({"repositories": [repo]}) as s:
        yield s


def started(sim: Simulator, redis_url: str, tmp_path: Path, **env: str) -> BrokerProcess:
    proc = BrokerProcess(broker_env(redis_url, sim.base_url, REPO, **env), tmp_path, "b").start()
    client = sync_client(redis_url)
    try:
        wait_for(lambda: client.zcard(KEYS.ready) == 2, 30, "the first sync")
        wait_for(lambda: client.hget(KEYS.comments, "since") is not None, 30, "the first look")
    finally:
        client.close()
    return proc


def beat(broker: BrokerProcess, task: dict[str, Any], agent: str) -> requests.Response:
    lease = {"agent_id": agent, "token": task["lease"]["token"]}
    return post(broker.url, f"/tasks/{REPO}/{task['issue_id']}/heartbeat", lease)


def reacted(sim: Simulator, comment: dict[str, Any]) -> list[str]:
    return [r["content"] for r in sim.state.list_reactions("acme", "widgets", comment["id"])]


def test_release_by_webhook_reaches_the_agent_and_a_reader_changes_nothing(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    # One poll pass at start-up, then none during the test: only the webhook can carry it.
    broker = started(
        sim,
        redis_url,
        tmp_path,
        GITHUB_BROKER_POLL__INTERVAL_S="3600",
        GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
    )
    try:
        hook = {"url": f"{broker.url}/github/webhook", "secret": SECRET, "repository": REPO}
        sim.webhooks.add_hook(sim.state, hook)
        task = post(broker.url, "/request-task", {"agent_id": "a1"}).json()
        n = task["issue_id"]
        ignored = sim.state.add_issue_comment(
            "acme", "widgets", n, user="rita", body="/broker release"
        )
        time.sleep(1.0)
        assert beat(broker, task, "a1").status_code == 200
        assert reacted(sim, ignored) == []
        started_at = time.monotonic()
        done = sim.state.add_issue_comment(
            "acme", "widgets", n, user="alice", body="/broker release"
        )
        wait_for(lambda: beat(broker, task, "a1").status_code == 409, 10, "the revoke")
        assert time.monotonic() - started_at < 5
        assert "revoked by github:alice" in beat(broker, task, "a1").json()["detail"]
        wait_for(lambda: reacted(sim, done) == ["+1"], 10, "the reaction")
        wait_for(
            lambda: "in-progress" not in sim.state.issue_labels("acme", "widgets", n), 10, "labels"
        )
    finally:
        broker.stop()


def test_stop_without_webhooks_through_the_poll(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    broker = started(sim, redis_url, tmp_path)  # poll.interval_s 1, no webhook secret
    try:
        task = post(broker.url, "/request-task", {"agent_id": "a1"}).json()
        comment = sim.state.add_issue_comment(
            "acme", "widgets", 2, user="alice", body="/broker stop a1"
        )
        wait_for(lambda: beat(broker, task, "a1").status_code == 409, 15, "the stop")
        assert "agent stopped by github:alice" in beat(broker, task, "a1").json()["detail"]
        assert post(broker.url, "/request-task", {"agent_id": "a1"}).status_code == 409
        wait_for(lambda: reacted(sim, comment) == ["+1"], 10, "the reaction")
    finally:
        broker.stop()
