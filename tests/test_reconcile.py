"""Redis and GitHub converge after crashes, lost data and hand-edited labels."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.errors import LeaseError, StoreUnavailable
from github_broker.keys import RepoKeys
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, start_all
from tests.waiting import wait_until
from tests.world import World, running_world, simulated

REPO = "acme/widgets"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(generate_issues(3, priorities=("P1",))) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(
        sim, redis_url, make_settings, leases={"lease_ttl_s": 1, "agent_task_ttl_s": 60}
    ) as w:
        yield w


@pytest.mark.anyio
async def test_after_redis_loses_everything_held_issue_is_readopted_for_its_agent(
    world: World,
) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None and task.issue_id == 1
    await world.tick()
    assert world.labels(1) >= {"in-progress", "a1"}

    await world.store.client.flushall()
    await world.tick()

    other = await world.ask("a2")
    assert other is not None and other.issue_id == 2  # never the issue a1 still holds
    # a1 is still at work: its next heartbeat binds the rebuilt lease to its token.
    await world.tasks.heartbeat(REPO, 1, "a1", task.lease.token)
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, 1, "a2", other.lease.token)
    assert refused.value.reason == "not_owner"


@pytest.mark.anyio
async def test_readopted_lease_of_a_vanished_agent_expires_and_issue_returns(world: World) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    await world.tick()
    await world.store.client.flushall()
    await world.tick()
    assert (await world.ask("a2")).issue_id == 2  # type: ignore[union-attr]
    await asyncio.sleep(1.2)  # nobody heartbeats the adopted lease
    await world.daemon.reap_all()
    await world.daemon.progress_all()  # GitHub shows no PR for it: back to the pool
    await world.tick()  # labels removed on GitHub
    assert not world.labels(1) & {"in-progress", "a1"}
    await world.tick()  # the sync sees the clean issue
    again = await world.ask("a3")
    assert again is not None and again.issue_id in (1, 3)


@pytest.mark.anyio
async def test_killed_agent_lease_expires_and_issue_goes_to_another(world: World) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None and task.issue_id == 1
    await world.tick()
    await asyncio.sleep(1.2)  # a1 died: no heartbeat
    other = await world.ask("a2")
    assert other is not None and other.issue_id == 1
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, 1, "a1", task.lease.token)
    assert refused.value.reason == "expired"
    await world.tick()
    assert world.labels(1) >= {"in-progress", "a2"} and "a1" not in world.labels(1)


@pytest.mark.anyio
async def test_in_progress_removed_by_hand_revokes_the_lease(world: World, sim: Simulator) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    await world.tasks.heartbeat(REPO, 1, "a1", task.lease.token)
    await world.tick()
    await world.tick()  # the sync has now seen our in-progress label
    sim.state.remove_label("acme", "widgets", 1, "in-progress")
    await world.tick()
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, 1, "a1", task.lease.token)
    assert refused.value.reason == "label_removed"


@pytest.mark.slow
def test_killed_leader_is_replaced_once_its_lease_runs_out_and_the_successor_syncs(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = broker_env(redis_url, sim.base_url, REPO)
    brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(lambda: client.get("gb:leader") is not None, 15, "a leader")
        leader = client.get("gb:leader").decode()
        victim = next(b for b in brokers if b.holds_leadership(leader))
        survivor = next(b for b in brokers if b is not victim)
        victim.kill()
        # leader TTL 3 s + renewal every 1 s, and slack for a loaded machine
        wait_until(
            lambda: (current := client.get("gb:leader")) is not None and current.decode() != leader,
            8,
            "a new leader",
        )
        created = sim.state.create_issue(
            "acme",
            "widgets",
            title="After failover",
            body="## Deliverables\n- x\n\nBranch: after-failover\n",
            labels=["P0", "BACKENDCODER"],
        )

        def synced() -> bool:
            r = requests.post(f"{survivor.url}/request-task", json={"agent_id": "late"}, timeout=10)
            return r.status_code == 200 and r.json()["issue_id"] == created["number"]

        wait_until(synced, 10, "the new leader's sync of the new issue", every_s=0.3)
    finally:
        client.close()
        for b in brokers:
            b.stop()


@pytest.mark.slow
def test_poll_daemon_stops_cleanly_on_sigterm_and_hands_back_leadership(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = {**os.environ, **broker_env(redis_url, sim.base_url, REPO)}
    log = tmp_path / "poll.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "github_broker", "poll"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    client = redis.Redis.from_url(redis_url)
    try:
        wait_until(
            lambda: client.zcard(RepoKeys("gb", "acme", "widgets").ready) >= 3,
            15,
            "the first sync",
        )
        assert client.get("gb:leader") is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert client.get("gb:leader") is None
        assert "Traceback" not in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        client.close()


@pytest.mark.anyio
async def test_write_queue_stops_at_first_outage_and_resumes_without_loss(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    held = [await world.ask(f"a{i}") for i in range(3)]
    assert all(t is not None for t in held)
    sim.faults.add_error(503, method="POST")
    sim.stats.reset()
    report = await world.daemon.drainer.drain(world.settings.repositories[0])
    assert report.applied == 0 and report.paused_until_s > time.time()
    assert sim.stats.snapshot()["by_method"].get("POST", 0) == 1  # no hammering a down GitHub
    assert await world.rstore.outbox_size() == 6  # 3 label + 3 branch jobs, none lost
    sim.faults.clear()
    await asyncio.sleep(max(0.0, report.paused_until_s - time.time()) + 0.2)
    resumed = await world.daemon.drainer.drain(world.settings.repositories[0])
    assert resumed.applied == 6 and await world.rstore.outbox_size() == 0
    for i, task in enumerate(held):
        assert task is not None and world.labels(task.issue_id) >= {"in-progress", f"a{i}"}


@pytest.mark.anyio
async def test_outages_do_not_count_toward_dropping_a_write(world: World, sim: Simulator) -> None:
    await world.tick()
    assert await world.ask("a1") is not None
    for _ in range(3):
        sim.faults.add_error(503, method="POST", count=1)
        world.daemon.drainer.paused_until_s = 0.0
        await world.rstore.client.zadd(world.rstore.keys.outbox, {"labels:1": 0}, xx=True)
        await world.daemon.drainer.drain(world.settings.repositories[0])
    attempts = await world.store.client.hgetall(world.rstore.keys.outbox_attempts)
    assert attempts == {}


@pytest.mark.anyio
async def test_redis_error_mid_drain_leaves_no_write_hidden_for_a_minute(
    world: World, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis stall or dropped connection while a batch is in hand (settling its second job)
    used to leave the rest of the batch taken, hidden for HIDE_MS (60 s): claims' labels
    reached GitHub a minute late. The next drain puts them back due at once."""
    await world.tick()
    held = [await world.ask(f"a{i}") for i in range(3)]
    assert all(t is not None for t in held)
    rstore = world.rstore
    settle = rstore.outbox_done
    calls = 0

    async def flaky(*args: Any, **kwargs: Any) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StoreUnavailable("Redis did not answer within 2.0s")
        return await settle(*args, **kwargs)

    monkeypatch.setattr(rstore, "outbox_done", flaky)
    repo = world.settings.repositories[0]
    with pytest.raises(StoreUnavailable):
        await world.daemon.drainer.drain(repo)
    monkeypatch.setattr(rstore, "outbox_done", settle)
    report = await world.daemon.drainer.drain(repo)  # the next drain, well inside the minute
    assert await rstore.outbox_size() == 0, await rstore.client.zrange(
        rstore.keys.outbox, 0, -1, withscores=True
    )
    assert await rstore.client.hlen(rstore.keys.outbox_taken) == 0
    assert report.applied >= 4  # the unsettled job is sent again: every write is idempotent
    for i, task in enumerate(held):
        assert task is not None and world.labels(task.issue_id) >= {"in-progress", f"a{i}"}


def test_lease_keys_lost_alone_are_rebuilt_for_the_agent_still_at_work(
    redis_url: str, tmp_path: Path
) -> None:
    """Eviction takes an issue's lease keys only (lock, lease hash, leases entry); GitHub still
    shows it in-progress with the agent's label and the mirror is intact. No sync re-reads an
    unchanged issue, so nothing re-adopted it and the agent's heartbeat was told `expired`:
    the issue stayed stuck. The agent's next lease call rebuilds the lease with its token; the
    task then completes as usual and nobody else is handed the issue meanwhile."""
    from tests.processes import live_broker

    keys = RepoKeys("gb", "acme", "widgets")
    client = redis.Redis.from_url(redis_url)
    with (
        simulated(generate_issues(2, priorities=("P1",))) as sim,
        live_broker(sim, redis_url, tmp_path, 2) as broker,
    ):
        url = broker.url
        got = requests.post(f"{url}/request-task", json={"agent_id": "a1"}, timeout=10)
        assert got.status_code == 200, got.text
        task = got.json()
        n = task["issue_id"]
        labels = lambda: set(sim.state.issue_labels("acme", "widgets", n))  # noqa: E731
        wait_until(lambda: labels() >= {"in-progress", "a1"}, 10, "a1's labels on GitHub")
        time.sleep(2.5)  # a couple of sync passes: the mirror shows the labels too
        client.delete(keys.issue_lock(n), keys.lease(n))
        client.zrem(keys.leases, str(n))
        time.sleep(2.5)  # more sync passes: nothing GitHub shows changed
        other = requests.post(f"{url}/request-task", json={"agent_id": "a2"}, timeout=10)
        assert other.status_code in (200, 204)
        if other.status_code == 200:
            assert other.json()["issue_id"] != n, "the held issue went to another agent"
        body = {"agent_id": "a1", "token": task["lease"]["token"]}
        beat = requests.post(f"{url}/tasks/acme/widgets/{n}/heartbeat", json=body, timeout=10)
        assert beat.status_code == 200, beat.text
        assert client.hget(keys.lease(n), "token").decode() == task["lease"]["token"]
        done = requests.post(f"{url}/tasks/acme/widgets/{n}/complete", json=body, timeout=10)
        assert done.status_code == 200, done.text
        wait_until(
            lambda: "needs-review" in labels() and "in-progress" not in labels(),
            10,
            "needs-review and no in-progress on GitHub",
        )
    client.close()
