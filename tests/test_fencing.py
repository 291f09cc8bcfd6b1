"""Only the current leader's work lands; Redis losing its data never ends a live lease."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.claim.rules import Rules
from github_broker.errors import Fenced, LeaseError, MirrorRebuilding
from github_broker.gateway import GitHubGateway
from github_broker.leader.outbox import OutboxDrainer
from github_broker.leader.poller import Daemon
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, Outcome
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from github_broker.store import RepoStore, Store
from tests.factories import issue
from tests.world import World, running_world, simulated

REPO = "acme/widgets"
#: The login the simulator gives the broker's token (the actor of the broker's own writes).
BROKER_LOGIN = "broker-bot"
CLAIM = {"previous": "completed", "mode": "strict", "base_branch": "main", "roles": None}


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    s = Store.from_settings(make_settings(redis={"url": lua_redis_url}))
    yield s
    await s.close()


async def seeded(store: Store) -> RepoStore:
    rstore = store.repo(REPO)
    rules = Rules(store.settings)
    await rstore.upsert_issues([index_item(rules, issue(1, "P1", "BACKENDCODER"), "main")])
    await rstore.save_sync_state({}, rebuilt=True)
    return rstore


@pytest.mark.anyio
async def test_every_change_of_leader_hands_out_a_higher_epoch(store: Store) -> None:
    first = await store.leader("a", 10_000)
    assert first > 0
    assert await store.leader("a", 10_000) == first  # renewal keeps the epoch
    assert await store.leader("b", 10_000) == 0  # not the holder
    assert await store.leader("a", 0, release=True) == 1
    second = await store.leader("b", 10_000)
    assert second > first
    # Redis lost everything, epoch key included: the next epoch is still higher.
    await store.client.flushall()
    third = await store.leader("c", 10_000)
    assert third > second


@pytest.mark.anyio
async def test_a_deposed_leader_can_neither_sync_nor_settle_writes(store: Store) -> None:
    rstore = await seeded(store)
    old = await store.leader("old", 10_000)
    claimed = await rstore.claim("a1", **CLAIM)
    assert isinstance(claimed, Claimed)
    taken = await rstore.outbox_take(10, 60_000, epoch=old)
    assert taken
    await store.client.delete(store.global_keys.leader)  # old stalled past its TTL
    new = await store.leader("new", 10_000)
    await rstore.reap(epoch=new)  # the new leader's first sweep raises the fence
    stale = [index_item(Rules(store.settings), issue(1, "P1"), "main")]
    with pytest.raises(Fenced):
        await rstore.sync_issues(stale, epoch=old)
    with pytest.raises(Fenced):
        await rstore.remove_issues([1], epoch=old)
    with pytest.raises(Fenced):
        await rstore.save_sync_state({"since": "2000-01-01T00:00:00Z"}, epoch=old)
    with pytest.raises(Fenced):
        await rstore.outbox_done(*taken[0][:2], epoch=old)
    with pytest.raises(Fenced):
        await rstore.outbox_take(10, 60_000, epoch=old)
    with pytest.raises(Fenced):
        await rstore.reap(epoch=old)
    # Nothing of the old leader landed: the lease and the queued writes are intact.
    assert (await rstore.leases())[0].agent_id == "a1"
    assert "since" not in await rstore.sync_state()
    # The jobs the old leader had in hand are due again at once for the new one.
    retaken = await rstore.outbox_take(10, 60_000, epoch=new)
    assert {job for job, _, _ in retaken} == {job for job, _, _ in taken}


@pytest.mark.anyio
async def test_a_drain_after_the_lead_is_lost_hides_nothing_from_the_next_leader(
    store: Store,
) -> None:
    """The daemon used to set its drainer's epoch to 0 when it lost the lead, possibly while a
    drain was starting. A take without an epoch is neither fenced nor noted for the next
    leader: the jobs it hid stayed out of the new leader's sight for HIDE_MS (a flaky FLUSHALL
    test). The drainer itself must refuse that, whoever sets its epoch."""
    rstore = await seeded(store)
    old = await store.leader("old", 10_000)
    claimed = await rstore.claim("a1", **CLAIM)  # queues the claim's labels and branch
    assert isinstance(claimed, Claimed)
    gateway = GitHubGateway(store.settings.github)
    drainer = OutboxDrainer(store, gateway)
    drainer.epoch = old

    async def deposed() -> bool:
        drainer.epoch = 0  # as the daemon's hold_leadership did on losing the lead
        return False

    drainer.still_leader = deposed
    repo = store.settings.repositories[0]
    try:
        # The lead was lost just before the drain began (drain_all checked is_leader, then
        # awaited Redis while hold_leadership ran): nothing may be taken without the epoch.
        drainer.epoch = 0
        await drainer.drain(repo)
        # The lead is lost while a drain runs: its take carries the epoch it started under.
        drainer.epoch = old
        await drainer.drain(repo)
    finally:
        gateway.close()
    await store.client.delete(store.global_keys.leader)
    new = await store.leader("new", 10_000)
    await rstore.reap(epoch=new)  # the new leader's first sweep raises the fence
    retaken = await rstore.outbox_take(10, 60_000, epoch=new)
    assert {job for job, _, _ in retaken} == {"labels:1", "branch:1"}


@pytest.mark.anyio
async def test_a_deposed_daemon_keeps_its_epoch_so_work_under_way_stays_fenced(
    store: Store,
) -> None:
    """A leader that finds out it lost the lead while a sync pass or a drain is under way:
    that work must go on fenced. With epoch 0 (unfenced) its next page or take landed
    whoever leads now."""
    rstore = await seeded(store)
    gateway = GitHubGateway(store.settings.github)
    daemon = Daemon(store.settings, store, gateway)
    try:
        assert await daemon.hold_leadership()
        old = daemon.epoch
        await store.client.delete(store.global_keys.leader)  # it stalled past its TTL
        new = await store.leader("other", 10_000)
        await rstore.reap(epoch=new)  # the new leader's first sweep raises the fence
        assert not await daemon.hold_leadership()
        assert not daemon.is_leader
        stale = [index_item(Rules(store.settings), issue(1, "P2"), "main")]
        with pytest.raises(Fenced):  # the pass under way writes its next page
            await rstore.sync_issues(stale, epoch=daemon.syncer.epoch)
        with pytest.raises(Fenced):  # the drain under way takes its next batch
            await rstore.outbox_take(10, 60_000, epoch=daemon.drainer.epoch)
        assert old < new
    finally:
        await daemon.stop()
        gateway.close()


@pytest.mark.anyio
async def test_lease_calls_answer_retry_until_the_mirror_is_rebuilt(store: Store) -> None:
    rstore = await seeded(store)
    claimed = await rstore.claim("a1", **CLAIM)
    assert isinstance(claimed, Claimed)
    await store.client.flushall()
    with pytest.raises(MirrorRebuilding):
        await rstore.heartbeat(1, "a1", claimed.token)
    with pytest.raises(MirrorRebuilding):
        await rstore.finish(1, "a1", claimed.token, "completed")
    with pytest.raises(MirrorRebuilding):
        await rstore.claim("a1", **CLAIM)
    await rstore.save_sync_state({}, rebuilt=True)
    ok, why = await rstore.heartbeat(1, "a1", claimed.token)
    # Rebuilt, GitHub did not show it held, and no record of the hand-out survived.
    assert (ok, why) == (False, "not_leased")


# --- scenarios on the simulator ---------------------------------------------------------


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
async def test_label_the_broker_itself_removed_is_restored_not_taken_for_a_person(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    await world.tick()
    await world.tick()
    # A deposed leader's late DELETE lands after the new leader confirmed a1's labels.
    sim.state.remove_label("acme", "widgets", task.issue_id, "in-progress", actor=BROKER_LOGIN)
    await world.tick()
    await world.tasks.heartbeat(REPO, task.issue_id, "a1", task.lease.token)  # still a1's
    await world.tick()
    assert world.labels(task.issue_id) >= {"in-progress", "a1"}
    assert (await world.ask("a2")).issue_id != task.issue_id  # type: ignore[union-attr]


@pytest.mark.anyio
async def test_agent_label_removed_by_hand_revokes_the_lease(world: World, sim: Simulator) -> None:
    await world.tick()
    task = await world.ask("a1")
    assert task is not None
    await world.tasks.heartbeat(REPO, task.issue_id, "a1", task.lease.token)
    await world.tick()
    await world.tick()
    sim.state.remove_label("acme", "widgets", task.issue_id, "a1")  # a maintainer's edit
    await world.tick()
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, task.issue_id, "a1", task.lease.token)
    assert refused.value.reason == "label_removed"
    await world.tick()
    assert "in-progress" not in world.labels(task.issue_id)


@pytest.mark.anyio
async def test_in_progress_without_a_holder_returns_to_the_pool_after_the_lease_ttl(
    world: World, sim: Simulator
) -> None:
    # After a Redis loss: in-progress, but the agent label was removed by hand.
    sim.state.add_labels("acme", "widgets", 1, ["in-progress"])
    await world.tick()
    assert 1 in await world.rstore.skipped()
    assert {(await world.ask(f"a{i}")).issue_id for i in range(2)} == {2, 3}  # type: ignore[union-attr]
    await asyncio.sleep(1.2)  # the lease TTL
    await world.tick()  # in-progress removed on GitHub
    await world.tick()
    assert "in-progress" not in world.labels(1)
    again = await world.ask("a9")
    assert again is not None and again.issue_id == 1


@pytest.mark.anyio
async def test_redis_loss_never_tells_an_agent_its_lease_ended(world: World) -> None:
    await world.tick()
    task = await world.ask("a1")
    other = await world.ask("a2")
    assert task is not None and other is not None
    await world.tick()
    await world.store.client.flushall()
    # Until the sync rebuilt the mirror: retry, never "expired", and no completion dropped.
    with pytest.raises(MirrorRebuilding):
        await world.tasks.heartbeat(REPO, task.issue_id, "a1", task.lease.token)
    with pytest.raises(MirrorRebuilding):
        await world.tasks.finish(REPO, other.issue_id, "a2", other.lease.token, Outcome.COMPLETED)
    with pytest.raises(MirrorRebuilding):
        await world.ask("a1")
    await world.tick()
    await world.tasks.heartbeat(REPO, task.issue_id, "a1", task.lease.token)
    # a1 now asks for more work: its held task counts as completed, as it would have.
    nxt = await world.ask("a1")
    assert nxt is not None and nxt.issue_id not in (task.issue_id, other.issue_id)
    record = await world.rstore.candidate(task.issue_id, "a1")
    assert record is not None and record["status"] == "needs_review"
    # a2's completion, refused with a retry, lands when retried.
    await world.tasks.finish(REPO, other.issue_id, "a2", other.lease.token, Outcome.COMPLETED)
    record = await world.rstore.candidate(other.issue_id, "a2")
    assert record is not None and record["status"] == "needs_review"


def test_simulator_lists_label_events_with_their_actor(sim: Simulator) -> None:
    import requests

    url = f"{sim.base_url}/repos/acme/widgets/issues/1"
    auth = {"Authorization": "token test-token"}
    assert requests.post(f"{url}/labels", json=["in-progress"], headers=auth).status_code == 200
    assert requests.delete(f"{url}/labels/in-progress", headers=auth).status_code == 200
    sim.state.remove_label("acme", "widgets", 1, "P1")
    events = requests.get(f"{url}/events", headers=auth).json()
    assert [(e["event"], e["label"]["name"], e["actor"]["login"]) for e in events] == [
        ("labeled", "in-progress", BROKER_LOGIN),
        ("unlabeled", "in-progress", BROKER_LOGIN),
        ("unlabeled", "P1", "maintainer"),
    ]
    assert all(e["created_at"] and e["id"] for e in events)


@pytest.mark.anyio
async def test_agent_label_a_late_write_put_back_is_removed_again(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    first = await world.ask("a1")
    assert first is not None and first.issue_id == 1
    await world.tasks.finish(REPO, 1, "a1", first.lease.token, Outcome.ABANDONED)
    await world.tick()
    second = await world.ask("a2")
    assert second is not None and second.issue_id == 1
    await world.tick()
    await world.tick()
    # A deposed leader's late POST of a1's claim labels lands now.
    sim.state.add_labels("acme", "widgets", 1, ["a1"], actor=BROKER_LOGIN)
    await world.tick()
    await world.tick()
    assert world.labels(1) >= {"in-progress", "a2"} and "a1" not in world.labels(1)
    await world.tasks.heartbeat(REPO, 1, "a2", second.lease.token)


@pytest.mark.anyio
async def test_labels_of_an_ended_hand_out_put_back_late_are_not_readopted(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    first = await world.ask("a1")
    assert first is not None and first.issue_id == 1
    await world.tasks.finish(REPO, 1, "a1", first.lease.token, Outcome.ABANDONED)
    await world.tick()
    await world.tick()
    sim.state.add_labels("acme", "widgets", 1, ["in-progress", "a1"], actor=BROKER_LOGIN)
    await world.tick()
    assert await world.rstore.leases() == []  # not re-adopted for a1, who gave it up
    await world.tick()
    assert not world.labels(1) & {"in-progress", "a1"}
    again = await world.ask("a2")
    assert again is not None and again.issue_id == 1
