"""Adoption by the sync: a lease the agent left behind must not come back to it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.errors import LeaseError
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
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
    async with running_world(sim, redis_url, make_settings) as w:
        yield w


async def _leases_of(world: World, agent: str) -> list[int]:
    keys, client = world.rstore.keys, world.store.client
    held = []
    for raw in await client.zrange(keys.leases, 0, -1):
        n = int(raw)
        if (await client.hget(keys.lease(n), "agent") or b"").decode() == agent:
            held.append(n)
    return sorted(held)


@pytest.mark.anyio
async def test_full_sync_does_not_readopt_a_lease_its_agent_moved_on_from(world: World) -> None:
    """a1's lease keys on issue n are lost (only those: its task_candidate record still says
    'assigned', GitHub still shows in-progress + a1). a1 asks for work again and gets issue m:
    n is not its task any more (readopt refuses it for that reason). The next full sync must
    not rebuild n's lease for a1 either (sync_upsert's adoption checks only the candidate
    record), and a1's old token must not then bind it: a1 would hold two leases, and its
    next request would settle n (the wrong task) while m stays leased."""
    await world.tick()
    first = await world.ask("a1")
    assert first is not None
    n = first.issue_id
    await world.tick()  # the labels reach GitHub and the sync confirms them
    keys, client = world.rstore.keys, world.store.client
    await client.delete(keys.issue_lock(n), keys.lease(n))
    await client.zrem(keys.leases, str(n))
    second = await world.ask("a1")
    assert second is not None and second.issue_id != n
    await world.tick()
    await world.daemon.hold_leadership()
    await world.daemon.syncer.sync(world.settings.repositories[0], full=True)
    await world.tick()
    with contextlib.suppress(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", first.lease.token)
    assert await _leases_of(world, "a1") == [second.issue_id]
