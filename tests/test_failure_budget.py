"""The failure budget: cool-downs per agent, needs-human after repeated failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, NoTask, Outcome
from github_broker.reports import status as status_view
from github_broker.reports.explain import explain_repo
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import RepoStore, Store
from tests.factories import issue
from tests.world import ONE_ISSUE, World, running_world, simulated

pytestmark = pytest.mark.anyio
REPO = "acme/widgets"


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"lease_ttl_s": 1, "agent_task_ttl_s": 60, "settle_grace_s": 0},
        failures={"cooldown_s": 60, "max_failures": 3},
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


async def load(store: Store, *numbers: int) -> RepoStore:
    rstore = store.repo(REPO)
    rules = Rules(store.settings)
    await rstore.upsert_issues(
        [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in numbers]
    )
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
    return rstore


async def claim(rstore: RepoStore, agent: str, previous: str = "completed") -> Claimed | NoTask:
    return await rstore.claim(
        agent, previous=previous, mode="strict", base_branch="main", roles=None
    )


async def fail(rstore: RepoStore, agent: str, how: str = "failed") -> int:
    got = await claim(rstore, agent)
    assert isinstance(got, Claimed), got
    if how == "expired":
        await asyncio.sleep(1.2)
        await rstore.reap()
    else:
        ok, _ = await rstore.finish(got.issue.number, agent, got.token, how)
        assert ok
    return got.issue.number


async def test_a_failed_task_is_not_handed_back_to_the_same_agent(store: Store) -> None:
    rstore = await load(store, 1)
    assert await fail(rstore, "a1") == 1
    again = await claim(rstore, "a1")
    assert isinstance(again, NoTask)
    other = await claim(rstore, "a2")
    assert isinstance(other, Claimed) and other.issue.number == 1


async def test_abandoned_and_expired_tasks_cool_down_too(store: Store) -> None:
    rstore = await load(store, 1, 2)
    assert await fail(rstore, "a1", "abandoned") == 1
    assert await fail(rstore, "a1", "expired") == 2
    assert isinstance(await claim(rstore, "a1"), NoTask)
    streaks = await rstore.client.hget(rstore.keys.agent_streaks, "a1")
    assert int(streaks) == 2


async def test_a_failure_reported_inside_the_settle_grace_spends_no_budget(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    # Found by a hostile client: concurrent requests saying `previous: failed` each failed
    # the task the one before had just been handed, charging issues nobody worked on.
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"settle_grace_s": 30},
        failures={"cooldown_s": 60, "max_failures": 3},
    )
    store = Store.from_settings(settings)
    try:
        rstore = await load(store, 1, 2)
        first = await claim(rstore, "a1")
        assert isinstance(first, Claimed)
        second = await claim(rstore, "a1", previous="failed")
        assert isinstance(second, Claimed) and second.issue.number != first.issue.number
        assert await rstore.client.hget(rstore.keys.task_failures, str(first.issue.number)) is None
        assert await rstore.client.hget(rstore.keys.agent_streaks, "a1") is None
        # The task went back to the pool for others.
        other = await claim(rstore, "a2")
        assert isinstance(other, Claimed) and other.issue.number == first.issue.number
    finally:
        await store.close()


async def test_a_completion_resets_the_agents_streak(store: Store) -> None:
    rstore = await load(store, 1, 2)
    await fail(rstore, "a1")
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed) and got.issue.number == 2
    assert (await rstore.finish(2, "a1", got.token, "completed"))[0]
    assert await rstore.client.hget(rstore.keys.agent_streaks, "a1") is None


async def test_the_third_failure_labels_needs_human_and_says_why(store: Store) -> None:
    rstore = await load(store, 1)
    for agent, how in (("a1", "failed"), ("a2", "abandoned"), ("a3", "expired")):
        assert await fail(rstore, agent, how) == 1
    assert isinstance(await claim(rstore, "a4"), NoTask)
    intent = await rstore.intent(1)
    assert intent is not None and "needs-human" in intent["add"]
    skipped = (await rstore.skipped())[1]
    assert skipped.code == "too_many_failures" and "a3" in skipped.reason
    verdicts = await explain_repo(rstore, store.settings, None)
    assert [(v.issue, v.verdict) for v in verdicts] == [(1, "waiting_on_person")]
    assert "(needs_human): 3 failed attempts (last: a3, expired)" in verdicts[0].detail
    report = await status_view.status(store, store.settings)
    assert report["repositories"][0]["skipped"][1]["code"] == "too_many_failures"


# --- end to end on the simulator ------------------------------------------------------------


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(
        sim, lua_redis_url, make_settings, failures={"cooldown_s": 60, "max_failures": 2}
    ) as w:
        yield w


async def test_repeated_failures_put_needs_human_on_github_and_a_sync_keeps_it_out(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    for agent in ("a1", "a2"):
        task = await world.ask(agent)
        assert task is not None and task.issue_id == 1
        await world.tasks.finish(REPO, 1, agent, task.lease.token, Outcome.FAILED)
    # A sync that reads the issue before the label is written must not offer it again.
    sim.state.update_issue("acme", "widgets", 1, title="Add CSV export (edited)")
    report = await world.daemon.syncer.sync(world.settings.repositories[0])
    assert report.written == 1
    assert await world.ask("a3") is None
    assert (await world.rstore.skipped())[1].code == "too_many_failures"
    await world.tick()
    assert "needs-human" in world.labels(1)
    assert not world.labels(1) & {"in-progress", "a1", "a2"}
    await world.tick()
    assert await world.ask("a3") is None
    assert (await world.rstore.skipped())[1].code == "too_many_failures"


async def test_an_agent_with_100_cooled_down_tasks_at_the_head_still_gets_claimable_work(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    # The claim used to look 65 entries deep (5 pages of 16): an agent with more cool-downs
    # at the head of the queue got 204 while tasks were claimable.
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"settle_grace_s": 0},
        failures={"cooldown_s": 600, "max_failures": 1000, "breaker_streak": 0},
    )
    store = Store.from_settings(settings)
    try:
        rstore = await load(store, *range(1, 103))
        for n in range(1, 101):
            assert await fail(rstore, "a1") == n
        got = await claim(rstore, "a1")
        assert isinstance(got, Claimed) and got.issue.number == 101
    finally:
        await store.close()


async def test_an_agent_failing_every_task_at_once_stops_ping_ponging_between_two_issues(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Failures reported inside the settle grace are free a couple of times in a row (a retry,
    a concurrent request), then count: the agent cools down on what it failed (and its streak
    grows toward the circuit breaker) instead of bouncing between two issues for ever."""
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"settle_grace_s": 30},
        failures={"cooldown_s": 60, "max_failures": 3, "instant_failures_allowed": 2},
    )
    store = Store.from_settings(settings)
    try:
        rstore = await load(store, 1, 2)
        seen = []
        for _ in range(12):
            got = await claim(rstore, "flaky", previous="failed")
            if isinstance(got, NoTask):
                seen.append(got.reason)
                break
            seen.append(got.issue.number)
        # Two free instant failures, then two counted ones cool both issues down for it.
        assert seen == [1, 2, 1, 2, "empty"], seen
        assert int(await rstore.client.hget(rstore.keys.agent_streaks, "flaky")) == 2
        other = await claim(rstore, "healthy")
        assert isinstance(other, Claimed)  # the issues are not charged for its failures
    finally:
        await store.close()
