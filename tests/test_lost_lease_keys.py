"""An issue's lease keys lost alone (eviction), or everything lost (FLUSHALL): the lease comes
back for the agent still at work on it, and for nobody else.

`_lib.lua`'s `readopt` rebuilds it on the agent's own lease call; `sync_upsert.lua` adopts an
in-progress issue without a lease for its holder, unless the holder has moved on.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.errors import LeaseError
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.world import TWO_REPOS, World, running_world, simulated, two_repositories

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


@pytest.mark.anyio
async def test_readopt_never_gives_an_agent_a_second_lease(world: World) -> None:
    """a1's lease keys on issue n are lost; a1 asks for work again and gets issue m (its held
    task was unknown, so nothing was settled). Its old heartbeat on n must not rebuild the
    lease on n too: an agent holds one task at a time."""
    await world.tick()
    first = await world.ask("a1")
    assert first is not None
    n = first.issue_id
    await world.lose_lease_keys(n)
    second = await world.ask("a1")
    assert second is not None and second.issue_id != n
    with contextlib.suppress(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", first.lease.token)
    assert await world.live_leases("a1") == [second.issue_id]


@pytest.mark.anyio
async def test_readopt_does_not_take_a_forged_token(world: World) -> None:
    """a1's lease keys on issue n are lost. A request of agent a1 carrying a token the broker
    never issued must not become the lease's token (and so revoke a1's real one)."""
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    n = task.issue_id
    await world.lose_lease_keys(n)
    with pytest.raises(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", "forged-token")
    await world.tasks.heartbeat(REPO, n, "a1", task.lease.token)


@pytest.mark.anyio
async def test_full_sync_does_not_readopt_a_lease_its_agent_moved_on_from(world: World) -> None:
    """a1's lease keys on issue n are lost (only those: its task_candidate record still says
    'assigned', GitHub still shows in-progress + a1). a1 asks for work again and gets issue m:
    n is not its task any more (readopt refuses it for that reason). The next full sync must
    not rebuild n's lease for a1 either, and a1's old token must not then bind it: a1 would
    hold two leases, and its next request would settle n (the wrong task) while m stays
    leased. n goes back to the pool instead."""
    await world.tick()
    first = await world.ask("a1")
    assert first is not None
    n = first.issue_id
    await world.tick()  # the labels reach GitHub and the sync confirms them
    await world.lose_lease_keys(n)
    second = await world.ask("a1")
    assert second is not None and second.issue_id != n
    await world.tick()
    await world.full_sync()
    await world.tick()
    with contextlib.suppress(LeaseError):
        await world.tasks.heartbeat(REPO, n, "a1", first.lease.token)
    assert await world.live_leases("a1") == [second.issue_id]
    assert f"development:{n}" in dict(await world.rstore.ready_tasks())


@pytest.mark.anyio
async def test_full_sync_does_not_readopt_a_lease_whose_agent_moved_on_to_another_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The same with two repositories: a1's lease keys on acme/widgets#n are lost, a1 asks
    again and gets m in acme/gadgets (the settle pass drops widgets' current-task key). The
    full sync of widgets must not rebuild n's lease for a1, nor its old token bind it."""
    with two_repositories(widgets=1, gadgets=2) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=TWO_REPOS) as w:
            await w.tick()
            first = await w.tasks.request_task("a1", repositories=["acme/widgets"])
            assert first is not None and first.repository == "acme/widgets"
            n = first.issue_id
            await w.tick()  # labels reach GitHub and the sync confirms them
            await w.lose_lease_keys(n, "acme/widgets")
            second = await w.tasks.request_task("a1", repositories=["acme/gadgets"])
            assert second is not None and second.repository == "acme/gadgets"
            await w.tick()
            await w.full_sync()
            await w.tick()
            with contextlib.suppress(LeaseError):
                await w.tasks.heartbeat("acme/widgets", n, "a1", first.lease.token)
            held = (
                await w.live_leases("a1", "acme/widgets"),
                await w.live_leases("a1", "acme/gadgets"),
            )
            assert held == ([], [second.issue_id]), held


@pytest.mark.anyio
async def test_after_flushall_the_agent_heartbeat_binds_the_adopted_lease(world: World) -> None:
    """Redis loses everything; the recovery sync re-adopts the in-progress issue for its
    holder (no records survive), and the holder's heartbeat with its own token binds it."""
    await world.tick()
    t = await world.ask("a1")
    assert t is not None
    await world.tick()
    await world.store.client.flushall()
    await world.tick()
    await world.tick()
    await world.tasks.heartbeat(t.repository, t.issue_id, "a1", t.lease.token)
    assert await world.live_leases("a1") == [t.issue_id]
    # and a made-up token is refused afterwards
    with pytest.raises(LeaseError):
        await world.tasks.heartbeat(t.repository, t.issue_id, "a1", "bogus")
