"""Guards of the re-adoption of lease keys lost alone (`_lib.lua`: readopt)."""

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


async def _lose_lease_keys(world: World, n: int) -> None:
    keys, client = world.rstore.keys, world.store.client
    await client.delete(keys.issue_lock(n), keys.lease(n))
    await client.zrem(keys.leases, str(n))


async def _leases_of(world: World, agent: str) -> list[int]:
    keys, client = world.rstore.keys, world.store.client
    held = []
    for raw in await client.zrange(keys.leases, 0, -1):
        n = int(raw)
        if (await client.hget(keys.lease(n), "agent") or b"").decode() == agent:
            held.append(n)
    return sorted(held)


@pytest.mark.anyio
async def test_readopt_never_gives_an_agent_a_second_lease(world: World) -> None:
    """a1's lease keys on issue n are lost; a1 asks for work again and gets issue m (its held
    task was unknown, so nothing was settled). Its old heartbeat on n must not rebuild the
    lease on n too: an agent holds one task at a time."""
    await world.tick()
    first = await world.ask("a1")
    assert first is not None
    n = first.issue_id
    await _lose_lease_keys(world, n)
    second = await world.ask("a1")
    assert second is not None and second.issue_id != n
    with contextlib.suppress(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", first.lease.token)
    assert await _leases_of(world, "a1") == [second.issue_id]


@pytest.mark.anyio
async def test_readopt_does_not_take_a_forged_token(world: World) -> None:
    """a1's lease keys on issue n are lost. A request of agent a1 carrying a token the broker
    never issued must not become the lease's token (and so revoke a1's real one)."""
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    n = task.issue_id
    await _lose_lease_keys(world, n)
    with pytest.raises(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", "forged-token")
    await world.tasks.heartbeat(REPO, n, "a1", task.lease.token)
