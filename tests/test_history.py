"""The history behind the dashboard's charts: every timeline event counted in the same script
step, in its entry's minute; the queue samples; memory bounded over an hour of traffic."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store
from github_broker.store.history import (
    HISTORY_HOUR_TTL_S,
    HISTORY_MINUTE_TTL_S,
    HOUR_MS,
    MINUTE_MS,
    is_sample,
)
from tests.factories import issue

pytestmark = pytest.mark.anyio
REPO = "acme/widgets"

#: The bound docs/dashboard.md "What the history costs" states for one hash of 6 agents:
#: 100 + 30 bytes per field, 61 + 3 x 6 fields at most (measured on Redis 7.0 after the hour
#: below: ~310 bytes a minute, ~410 the hour, ~20 kB in all).
MINUTE_BYTES_MAX = 100 + 30 * (61 + 3 * 6)
HOUR_BYTES_MAX = MINUTE_BYTES_MAX


def settings_for(make_settings: Callable[..., Settings], url: str) -> Settings:
    return make_settings(
        redis={"url": url},
        leases={"lease_ttl_s": 60, "agent_task_ttl_s": 60, "settle_grace_s": 0},
        failures={"cooldown_s": 0, "breaker_streak": 0, "max_failures": 1000},
    )


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    s = Store.from_settings(settings_for(make_settings, lua_redis_url))
    yield s
    await s.close()


@pytest.fixture
async def real_store(
    redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[Store]:
    s = Store.from_settings(settings_for(make_settings, redis_url))
    yield s
    await s.close()


async def load(store: Store, *issues_) -> RepoStore:  # type: ignore[no-untyped-def]
    rstore = store.repo(REPO)
    await rstore.upsert_issues([index_item(Rules(store.settings), i, "main") for i in issues_])
    await rstore.save_sync_state({}, rebuilt=True)
    return rstore


async def claimed(rstore: RepoStore, agent: str) -> Claimed:
    got = await rstore.claim(
        agent, previous="completed", mode="best_effort", base_branch="main", roles=None
    )
    assert isinstance(got, Claimed), got
    return got


async def finish(rstore: RepoStore, agent: str, got: Claimed, outcome: str) -> None:
    ok, _ = await rstore.finish(got.issue.number, agent, got.token, outcome)
    assert ok


def summed(hashes: list[dict[str, int]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for h in hashes:
        total.update(h)
    return total


async def test_every_timeline_event_is_counted_in_its_minute_its_hour_and_the_totals(
    store: Store,
) -> None:
    rstore = await load(store, *(issue(n, "P1", "BACKENDCODER") for n in range(1, 6)))
    a = await claimed(rstore, "ann")
    b = await claimed(rstore, "bo")
    c = await claimed(rstore, "cy")
    await finish(rstore, "ann", a, "completed")
    await finish(rstore, "bo", b, "failed")
    await finish(rstore, "cy", c, "abandoned")
    d = await claimed(rstore, "bo")
    await finish(rstore, "bo", d, "completed")

    events = await rstore.timeline(100)
    kinds = Counter(e.kind for e in events)
    assert kinds["claim"] == 4 and kinds["completed"] == 2  # the work the test did
    first, last = min(e.at_ms for e in events), max(e.at_ms for e in events)
    for fold in (False, True):
        if fold:  # the minutes are over (the timeline moved on): folded, the same figures
            await advance_history_to(rstore.client, rstore, (last // MINUTE_MS + 1) * MINUTE_MS)
            assert await rstore.fold_history() >= 1
            assert not await rstore.client.exists(rstore.keys.history_unfolded)
        minutes = summed(await rstore.history_minutes(first // MINUTE_MS, last // MINUTE_MS))
        hours = summed(await rstore.history_hours(first // HOUR_MS, last // HOUR_MS))
        totals = await rstore.history_totals()
        for counts in (minutes, hours, totals):
            assert {k[3:]: v for k, v in counts.items() if k.startswith("ev:")} == dict(kinds)
            assert counts["claim:development"] == 4
            # Every development hand-out's wait and completion's time, one bucket each.
            waits = [v for k, v in counts.items() if k.startswith("wait:") and k != "wait:ms"]
            prs = [v for k, v in counts.items() if k.startswith("pr:") and k != "pr:ms"]
            assert sum(waits) == 4 and sum(prs) == 2
            assert counts["a:ann:ok"] == 1 and counts["a:bo:ok"] == 1
            assert counts["a:bo:fail"] == 1 and counts["a:cy:fail"] == 1
            assert "a:cy:ok" not in counts
            assert counts["a:ann:ms"] >= 0 and "a:cy:ms" not in counts


async def test_a_queue_sample_counts_ready_tasks_per_priority_and_work_waiting(
    store: Store,
) -> None:
    rstore = await load(
        store,
        issue(1, "P0", "BACKENDCODER"),
        issue(2, "P2", "BACKENDCODER"),
        issue(3, "P2", "BACKENDCODER"),
        issue(4, "P12", "BACKENDCODER"),
    )
    ready, waiting = await rstore.queue_sample()
    assert ready == {0: 1, 2: 2, 9: 1} and waiting == 0  # P12 counts as the last, P9
    minute = 29_000_000
    assert await store.samples.claim_minute(minute)
    assert not await store.samples.claim_minute(minute)  # once per minute, whoever leads
    await rstore.record_sample(minute * MINUTE_MS, ready, waiting)
    [sample] = await rstore.history_minutes(minute, minute)
    assert sample == {"q:P0": 1, "q:P2": 2, "q:P9": 1}
    assert await store.samples.minutes(minute - 5, minute + 5) == {minute}


async def advance_history_to(client: aioredis.Redis, rstore: RepoStore, at_ms: int) -> None:
    """Move the history's time on: an event's minute is its timeline entry's id, and Redis
    gives a new entry an id above the stream's last one. The marker entry goes at once."""
    entry = await client.xadd(rstore.keys.timeline, {"kind": "tick"}, id=f"{at_ms}-0")
    await client.xdel(rstore.keys.timeline, entry)


async def a_minute_of_traffic(rstore: RepoStore, minute: int, agents: list[str]) -> None:
    """Two new issues; each agent takes a task and completes or fails it in turn."""
    await rstore.upsert_issues(
        [
            index_item(Rules(rstore.settings), issue(n, "P1", "BACKENDCODER"), "main")
            for n in (1000 + 2 * minute, 1001 + 2 * minute)
        ]
    )
    for i, agent in enumerate(agents):
        got = await rstore.claim(
            agent, previous="completed", mode="best_effort", base_branch="main", roles=None
        )
        if isinstance(got, Claimed):
            outcome = "completed" if (i + minute) % 2 else "failed"
            await finish(rstore, agent, got, outcome)


async def test_an_hour_of_traffic_keeps_the_history_within_its_documented_bound(
    real_store: Store, redis_url: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    rstore = await load(real_store)
    agents = [f"agent-{i}" for i in range(6)]
    start_ms = (await rstore.timeline(1) or [None])[0]
    base = (2_000_000_000_000 // HOUR_MS) * HOUR_MS  # an hour boundary in 2033
    assert start_ms is None
    for minute in range(60):
        at_ms = base + minute * MINUTE_MS
        await advance_history_to(client, rstore, at_ms)
        await a_minute_of_traffic(rstore, minute, agents)
        assert await real_store.samples.claim_minute(at_ms // MINUTE_MS)
        await rstore.record_sample(at_ms, *await rstore.queue_sample())
    busy = base + 60 * MINUTE_MS
    await advance_history_to(client, rstore, busy)
    assert await rstore.fold_history() == 60  # the hour is over: its minutes fold into it

    keys = [k.decode() async for k in client.scan_iter(match=rstore.keys.base + "history:*")]
    minutes = [k for k in keys if k.startswith(rstore.keys.history_minute_prefix)]
    hours = [k for k in keys if k.startswith(rstore.keys.history_hour_prefix)]
    assert len(minutes) == 60 and len(hours) == 1 and len(keys) == 62
    for key in minutes:
        assert 0 < await client.ttl(key) <= HISTORY_MINUTE_TTL_S
    for key in hours:
        assert 0 < await client.ttl(key) <= HISTORY_HOUR_TTL_S
    counts = summed(await rstore.history_minutes(base // MINUTE_MS, base // MINUTE_MS + 59))
    assert counts["ev:claim"] >= 60 * len(agents) // 2  # the traffic really ran
    sizes = {k: await client.memory_usage(k) for k in keys}
    assert max(sizes[k] for k in minutes) <= MINUTE_BYTES_MAX
    assert max(sizes[k] for k in hours) <= HOUR_BYTES_MAX
    assert sum(sizes.values()) <= 60 * MINUTE_BYTES_MAX + HOUR_BYTES_MAX * 2

    # Ten times the traffic in one minute: the same fields, larger numbers.
    for round_ in range(10):
        await a_minute_of_traffic(rstore, 60 + round_, agents)
    [quiet] = await rstore.history_minutes(base // MINUTE_MS + 59, base // MINUTE_MS + 59)
    [loud] = await rstore.history_minutes(busy // MINUTE_MS, busy // MINUTE_MS)
    assert loud["ev:claim"] >= 5 * quiet["ev:claim"]
    assert len(loud) <= 61 + 3 * len(agents)
    assert await client.memory_usage(rstore.keys.history_minute(busy // MINUTE_MS)) <= (
        MINUTE_BYTES_MAX
    )
    await client.aclose()


def test_the_scripts_and_the_readers_share_the_duration_buckets() -> None:
    from importlib import resources

    from github_broker.store.history import DURATION_BOUNDS_S

    lib = (resources.files("github_broker") / "lua" / "_lib.lua").read_text(encoding="utf-8")
    line = next(x for x in lib.splitlines() if x.startswith("local HISTORY_LE_S = "))
    assert tuple(int(v) for v in line.split("{")[1].rstrip("}").split(",")) == DURATION_BOUNDS_S


async def test_the_leader_samples_every_repository_once_a_minute_and_only_what_is_queued(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    from tests.world import TWO_REPOS, running_world, two_repositories

    with two_repositories(3, 0) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=TWO_REPOS) as world:
            await world.tick()
            at_ms = 1_900_000_000_000 // MINUTE_MS * MINUTE_MS
            await world.daemon.sample_history(at_ms)
            await world.daemon.sample_history(at_ms + 30_000)  # the same minute: not again
            minute = at_ms // MINUTE_MS
            widgets, gadgets = (world.store.repo(r) for r in TWO_REPOS)
            assert await widgets.history_minutes(minute, minute) == [{"q:P1": 3}]
            assert await gadgets.history_minutes(minute, minute) == [{}]  # nothing: no key
            assert await widgets.history_hours(at_ms // HOUR_MS, at_ms // HOUR_MS) == [{"q:P1": 3}]
            assert await world.store.samples.minutes(minute, minute) == {minute}
            # A hand-out, its minute over: the leader's fold takes it; the sample stays once.
            await claimed(widgets, "ann")
            await advance_history_to(widgets.client, widgets, at_ms - MINUTE_MS)
            await world.daemon.fold_history()
            assert not await widgets.client.exists(widgets.keys.history_unfolded)
            hours = await widgets.history_hours(at_ms // HOUR_MS, at_ms // HOUR_MS)
            assert hours == [{"q:P1": 3}]
            assert (await widgets.history_totals())["ev:claim"] == 1
            await world.daemon.stop()  # no longer the leader: no sample, no fold
            await world.daemon.sample_history(at_ms + MINUTE_MS)
            assert await world.store.samples.minutes(minute + 1, minute + 1) == set()
            await claimed(widgets, "bo")
            await advance_history_to(widgets.client, widgets, at_ms)
            await world.daemon.fold_history()
            assert await widgets.client.exists(widgets.keys.history_unfolded)
            assert (await widgets.history_totals())["ev:claim"] == 2


def events_of(counts: dict[str, int]) -> Counter[str]:
    return Counter({k: v for k, v in counts.items() if not is_sample(k)})


async def folded_totals(client: aioredis.Redis, rstore: RepoStore) -> Counter[str]:
    """The totals hash itself: only what the fold put there."""
    raw = await client.hgetall(rstore.keys.history_total)  # type: ignore[misc]
    return Counter({k.decode(): int(v) for k, v in raw.items()})


async def test_the_fold_moves_each_finished_minute_into_its_hour_and_the_totals_once(
    real_store: Store, redis_url: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    rstore = await load(real_store, *(issue(n, "P1", "BACKENDCODER") for n in range(1, 9)))
    agents = ["ann", "bo", "cy"]
    hour = 2_000_000_000_000 // HOUR_MS  # minutes on both sides of an hour's end, in 2033
    minutes = [hour * 60 - 2, hour * 60 - 1, hour * 60, hour * 60 + 1]
    for i, minute in enumerate(minutes):
        await advance_history_to(client, rstore, minute * MINUTE_MS)
        await a_minute_of_traffic(rstore, i, agents)
        assert await real_store.samples.claim_minute(minute)
        await rstore.record_sample(minute * MINUTE_MS, {1: 4 + i}, 0)

    async def check(minutes_folded: int) -> None:
        """Hours and totals as read equal the minutes' events (and the hours' samples),
        whatever was folded; the totals hash holds exactly the folded minutes."""
        counts = await rstore.history_minutes(minutes[0], minutes[-1] + 2)
        every = summed([events_of(c) for c in counts])
        kinds = Counter(e.kind for e in await rstore.timeline(1000))
        assert {k[3:]: v for k, v in every.items() if k.startswith("ev:")} == dict(kinds)
        assert Counter(await rstore.history_totals()) == every
        hours = await rstore.history_hours(hour - 1, hour)
        by_hour = [summed(counts[:2]), summed(counts[2:])]
        assert [Counter(h) for h in hours] == by_hour
        folded = summed([events_of(c) for c in counts[:minutes_folded]])
        assert await folded_totals(client, rstore) == folded

    folds = [await rstore.fold_history()]  # the timeline's last minute may still count
    await check(3)
    folds.append(await rstore.fold_history())  # again: nothing folded twice
    await check(3)
    await a_minute_of_traffic(rstore, 4, agents)  # more in the minute not folded
    assert (await rstore.history_minutes(minutes[-1], minutes[-1]))[0]["ev:claim"] >= 2 * 2
    await check(3)
    await advance_history_to(client, rstore, (minutes[-1] + 2) * MINUTE_MS)
    folds += [await rstore.fold_history(), await rstore.fold_history()]
    await check(4)
    assert folds == [3, 0, 1, 0]
    assert not await client.exists(rstore.keys.history_unfolded)
    assert (await folded_totals(client, rstore))["ev:claim"] >= 5 * 2  # the traffic ran
    await client.aclose()
