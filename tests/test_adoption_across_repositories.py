"""Adoption by the sync, with two repositories: a lease the agent left behind stays behind."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest

from github_broker.errors import LeaseError
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.world import World, running_world, simulated


async def _leases_of(world: World, repo: str, agent: str) -> list[int]:
    rstore = world.store.repo(repo)
    keys, client = rstore.keys, world.store.client
    held = []
    for raw in await client.zrange(keys.leases, 0, -1):
        n = int(raw)
        owner = (await client.hget(keys.lease(n), "agent") or b"").decode()
        if owner == agent and await client.exists(keys.issue_lock(n)):
            held.append(n)
    return sorted(held)


@pytest.mark.anyio
async def test_full_sync_does_not_readopt_a_lease_whose_agent_moved_on_to_another_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The two-repository form of test_adoption_guards' scenario. a1's lease keys on
    acme/widgets#n are lost (only those: the task_candidate record still says 'assigned',
    GitHub still shows in-progress + a1). a1 asks again and gets m in acme/gadgets. The full
    sync of widgets must not rebuild n's lease for a1: `moved_on` looks only at widgets'
    agent_current_task (which the settle pass deleted), so n is adopted, and a1's old token
    binds it through the candidate record: a1 holds two live leases."""
    sim = Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": "widgets",
                    "issues": generate_issues(1, priorities=("P1",)),
                },
                {
                    "owner": "acme",
                    "name": "gadgets",
                    "issues": generate_issues(2, priorities=("P1",)),
                },
            ]
        }
    )
    with sim:
        async with running_world(
            sim, redis_url, make_settings, repositories=["acme/widgets", "acme/gadgets"]
        ) as w:
            await w.tick()
            first = await w.tasks.request_task("a1", repositories=["acme/widgets"])
            assert first is not None and first.repository == "acme/widgets"
            n = first.issue_id
            await w.tick()  # labels reach GitHub and the sync confirms them
            keys, client = w.rstore.keys, w.store.client
            await client.delete(keys.issue_lock(n), keys.lease(n))
            await client.zrem(keys.leases, str(n))
            second = await w.tasks.request_task("a1", repositories=["acme/gadgets"])
            assert second is not None and second.repository == "acme/gadgets"
            await w.tick()
            await w.daemon.hold_leadership()
            await w.daemon.syncer.sync(w.settings.repositories[0], full=True)
            await w.tick()
            with contextlib.suppress(LeaseError):
                await w.tasks.heartbeat("acme/widgets", n, "a1", first.lease.token)
            held = (
                await _leases_of(w, "acme/widgets", "a1"),
                await _leases_of(w, "acme/gadgets", "a1"),
            )
            assert held == ([], [second.issue_id]), held


@pytest.mark.anyio
async def test_after_flushall_the_agent_heartbeat_binds_the_adopted_lease(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Redis loses everything; the recovery sync re-adopts the in-progress issue for its
    holder (no records survive), and the holder's heartbeat with its own token binds it."""
    with simulated(generate_issues(3, priorities=("P1",))) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            t = await w.ask("a1")
            assert t is not None
            await w.tick()
            await w.store.client.flushall()
            await w.tick()
            await w.tick()
            await w.tasks.heartbeat(t.repository, t.issue_id, "a1", t.lease.token)
            assert await _leases_of(w, t.repository, "a1") == [t.issue_id]
            # and a bogus token is refused afterwards
            with pytest.raises(LeaseError):
                await w.tasks.heartbeat(t.repository, t.issue_id, "a1", "bogus")
