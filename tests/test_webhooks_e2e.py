"""Webhooks end to end: the simulator delivers over HTTP to a real `serve` process."""

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
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
SECRET = "s3cret-for-tests"
KEYS = RepoKeys("gb", "acme", "widgets")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    issues = [
        {"number": n, "title": f"Task {n}", "body": body(), "labels": ["BACKENDCODER"]}
        for n in (1, 2)
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
    # The first pass ends with an incremental request that records its ETag.
    wait_until(
        lambda: client.scard(KEYS.open) >= 2 and client.hget(KEYS.sync, "inc_since"),
        20,
        "the first sync",
    )
    client.close()
    yield proc
    proc.stop()


def ask(broker: BrokerProcess) -> requests.Response:
    return requests.post(f"{broker.url}/request-task", json={"agent_id": "agent-1"}, timeout=10)


def claimed(broker: BrokerProcess, agent: str) -> dict[str, Any] | None:
    """The task `agent` gets now, or None (204)."""
    got = requests.post(f"{broker.url}/request-task", json={"agent_id": agent}, timeout=10)
    return got.json() if got.status_code == 200 else None


def issue_lists(sim: Simulator) -> int:
    return int(sim.stats.snapshot()["by_route"].get("GET /repos/{owner}/{repo}/issues", 0))


def failures(sim: Simulator) -> int:
    return int(sim.stats.snapshot()["by_status"].get("502", 0))


def test_label_becomes_claimable_within_a_second_and_mis_signed_changes_nothing(
    sim: Simulator, broker: BrokerProcess
) -> None:
    url = f"{broker.url}/github/webhook"
    lists = issue_lists(sim)
    # A hook with the wrong secret: every delivery is refused, nothing changes.
    sim.webhooks.add_hook(sim.state, {"url": url, "secret": "wrong", "repository": "acme/widgets"})
    sim.state.add_labels("acme", "widgets", 1, ["P1"])
    assert sim.webhooks.wait_idle()
    assert {d["status"] for d in sim.webhooks.describe()["deliveries"]} == {401}
    assert ask(broker).status_code == 204
    sim.webhooks.clear_hooks()

    sim.webhooks.add_hook(sim.state, {"url": url, "secret": SECRET, "repository": "acme/widgets"})
    assert sim.webhooks.wait_idle()
    assert sim.webhooks.describe()["deliveries"][-1]["event"] == "ping"
    assert sim.webhooks.describe()["deliveries"][-1]["status"] == 200  # pong
    started = time.monotonic()
    sim.state.add_labels("acme", "widgets", 2, ["P2"])
    task = wait_until(
        lambda: claimed(broker, "agent-1"), 10, "the labelled issue claimable", every_s=0.02
    )
    latency = time.monotonic() - started
    assert task["issue_id"] == 2
    assert latency < 1.0, latency  # typically ~0.05 s
    assert issue_lists(sim) == lists  # no poll pass, no listing
    # The simulator records a delivery once it has read the answer, which may come after the
    # broker made the issue claimable.
    assert sim.webhooks.wait_idle()
    statuses = [d["status"] for d in sim.webhooks.describe()["deliveries"]]
    assert statuses[-1] == 202


def test_deliveries_queued_while_the_leader_is_dead_are_applied_by_the_next(
    sim: Simulator, broker: BrokerProcess, redis_url: str, tmp_path: Path
) -> None:
    # `broker` leads the poller; a second process only receives webhooks.
    receiver_env = broker_env(
        redis_url,
        sim.base_url,
        "acme/widgets",
        GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
        GITHUB_BROKER_SERVER__RUN_POLLER="false",
    )
    receiver = BrokerProcess(receiver_env, tmp_path, "receiver").start()
    try:
        broker.kill()  # kill -9: the leader lease stays until its TTL runs out
        client = sync_client(redis_url)
        # The poller child dies with serve (PDEATHSIG) a moment later; once nobody renews
        # the leader lease it is gone for sure.
        wait_until(lambda: not client.exists("gb:leader"), 15, "the killed leader's lease gone")
        sim.webhooks.add_hook(
            sim.state,
            {
                "url": f"{receiver.url}/github/webhook",
                "secret": SECRET,
                "repository": "acme/widgets",
            },
        )
        sim.state.add_labels("acme", "widgets", 1, ["P1"])
        assert sim.webhooks.wait_idle()
        assert sim.webhooks.describe()["deliveries"][-1]["status"] == 202
        assert client.llen(KEYS.webhooks) == 1
        # GitHub's listing fails from now on: only the queued delivery can help the successor.
        lists, failed = issue_lists(sim), failures(sim)
        sim.faults.add_error(502, method="GET", path=r"/issues$")
        successor = BrokerProcess(broker.env, tmp_path, "successor").start()
        try:
            task = wait_until(
                lambda: claimed(receiver, "agent-1"), 20, "the queued delivery applied"
            )
            assert task["issue_id"] == 1
            assert client.llen(KEYS.webhooks) == 0 and client.llen(KEYS.webhooks_inflight) == 0
            assert failures(sim) - failed == issue_lists(sim) - lists  # no listing succeeded
        finally:
            successor.stop()
        client.close()
    finally:
        receiver.stop()


def test_a_push_delivery_is_a_held_tasks_progress_and_clears_its_stall(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    """With webhooks, GitHub's `push` to the task's branch is its progress at once; no branch
    is polled (0 branch reads per held task)."""
    env = broker_env(
        redis_url,
        sim.base_url,
        "acme/widgets",
        GITHUB_BROKER_POLL__INTERVAL_S="3600",
        GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
        GITHUB_BROKER_PROGRESS__STALL_AFTER_S="1",
        GITHUB_BROKER_PROGRESS__CHECK_INTERVAL_S="0.2",
        GITHUB_BROKER_PROGRESS__BRANCH_CHECK_INTERVAL_S="0.2",
    )
    broker = BrokerProcess(env, tmp_path, "broker").start()
    client = sync_client(redis_url)
    try:
        sim.webhooks.add_hook(
            sim.state,
            {"url": f"{broker.url}/github/webhook", "secret": SECRET, "repository": "acme/widgets"},
        )
        sim.state.add_labels("acme", "widgets", 1, ["P1"])  # a delivery: webhooks are healthy
        task = wait_until(lambda: claimed(broker, "agent-1"), 10, "the labelled issue claimable")
        lease = KEYS.lease(1)
        wait_until(lambda: client.hget(lease, "stalled"), 10, "the lease flagged stalled")
        branch_reads = sim.stats.snapshot()["by_route"].get(
            "GET /repos/{owner}/{repo}/git/ref/{ref}", 0
        )
        sim.state.push("acme", "widgets", task["branch_name"], message="Parse the header")
        wait_until(lambda: not client.hget(lease, "stalled"), 5, "the push to clear the stall")
        progress = (client.hget(lease, "progress") or b"").decode()
        assert progress.startswith(f"push: {task['branch_name']} at ")
        after = sim.stats.snapshot()["by_route"].get("GET /repos/{owner}/{repo}/git/ref/{ref}", 0)
        # The base branch's tip is read to create the task branch; the task branch never.
        assert after == branch_reads
    finally:
        client.close()
        broker.stop()


def test_reviews_and_fixes_follow_webhooks_alone_with_no_poll_pass(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    """The `needs-review` label's delivery starts the review timer and a review's delivery the
    fix's debounce: both tasks are claimable within a second of being due, while the poller
    makes no pass (one at start-up, the next in an hour)."""
    env = broker_env(
        redis_url,
        sim.base_url,
        "acme/widgets",
        GITHUB_BROKER_POLL__INTERVAL_S="3600",
        GITHUB_BROKER_POLL__INTERVAL_WITH_WEBHOOKS_S="3600",
        GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
        GITHUB_BROKER_REVIEW__DELAY_S="1",
        GITHUB_BROKER_REVIEW__FIX_DEBOUNCE_S="1",
        GITHUB_BROKER_REVIEW__TIMEOUT_S="3600",
    )
    broker = BrokerProcess(env, tmp_path, "broker").start()
    try:
        sim.webhooks.add_hook(
            sim.state,
            {"url": f"{broker.url}/github/webhook", "secret": SECRET, "repository": "acme/widgets"},
        )
        sim.state.add_labels("acme", "widgets", 1, ["P1"])
        task = wait_until(lambda: claimed(broker, "agent-1"), 10, "#1 claimable")
        assert task["issue_id"] == 1
        pull = sim.state.create_pull(
            "acme", "widgets", title="x", head=task["branch_name"], body="Closes #1", user="bot"
        )
        lists = issue_lists(sim)
        done = requests.post(
            f"{broker.url}/tasks/acme/widgets/1/complete",
            json={"agent_id": "agent-1", "token": task["lease"]["token"]},
            timeout=10,
        )
        assert done.status_code == 200
        wait_until(
            lambda: "needs-review" in sim.state.issue_labels("acme", "widgets", 1),
            10,
            "needs-review written to GitHub",
        )
        labelled_s = time.monotonic()
        # When due (1 s), give or take a loaded machine; the poll would take an hour.
        got = wait_until(lambda: claimed(broker, "reviewer"), 1 + 5.0, "the review when due")
        assert got["task_type"] == "review" and got["issue_id"] == 1
        assert time.monotonic() - labelled_s < 1 + 5.0
        requests.post(
            f"{broker.url}/tasks/acme/widgets/1/complete",
            json={"agent_id": "reviewer", "token": got["lease"]["token"]},
            timeout=10,
        ).raise_for_status()
        sim.state.add_review(
            "acme",
            "widgets",
            pull["number"],
            user="alice",
            body="Rename it.",
            state="REQUEST_CHANGES",
        )
        reviewed_s = time.monotonic()

        def fix() -> dict[str, object] | None:
            got = requests.post(
                f"{broker.url}/request-task", json={"agent_id": "fixer"}, timeout=10
            )
            return got.json() if got.status_code == 200 else None

        fixed = wait_until(fix, 1 + 5.0, "the fix task offered when its debounce ended")
        assert fixed["task_type"] == "fix"
        assert time.monotonic() - reviewed_s < 1 + 5.0
        assert issue_lists(sim) == lists  # no poll pass listed the issues meanwhile
    finally:
        broker.stop()
