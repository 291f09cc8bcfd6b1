"""Keys a sync derives from GitHub lost alone (eviction, an operator's DEL, a failover that lost
some writes) while the `mirror` marker survives: the next full pass brings them back.

GitHub answers every page of an unchanged repository 304 Not Modified, so the full pass
indexes again the issues of those pages from the cache `issue:{n}` (sync.py `_full`), with no
GitHub call; a page one of whose issues lost its cache entry is read again in full.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.factories import body
from tests.world import REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio

#: #1, #2 assignable backend work, #3 frontend work, #4 work without a branch (skipped),
#: #5 waiting for review, #6 a story.
ISSUES: list[dict[str, Any]] = [
    {"number": 1, "title": "One", "body": body(), "labels": ["P1", "BACKENDCODER"]},
    {"number": 2, "title": "Two", "body": body(), "labels": ["P1", "BACKENDCODER"]},
    {"number": 3, "title": "Three", "body": body(), "labels": ["P1", "FRONTENDCODER"]},
    {"number": 4, "title": "Four", "body": "no branch here", "labels": ["P1", "BACKENDCODER"]},
    {
        "number": 5,
        "title": "Five",
        "body": body(),
        "labels": ["P1", "BACKENDCODER", "needs-review"],
    },
    {"number": 6, "title": "Six", "body": body(), "labels": ["P1", "story"]},
]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ISSUES) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(sim, redis_url, make_settings) as w:
        yield w


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


async def derived(world: World) -> dict[str, Any]:
    """Every key a sync derives from the issues (task values without their since_ms)."""
    keys, client = world.rstore.keys, world.store.client

    def task(value: str) -> str:
        fields = value.split("|")
        return "|".join(fields[:4] + fields[5:])

    return {
        "tasks": {_text(k): task(_text(v)) for k, v in (await client.hgetall(keys.tasks)).items()},
        "ready": await client.zrange(keys.ready, 0, -1, withscores=True),
        "ready:BACKENDCODER": await client.zrange(
            keys.ready_role("BACKENDCODER"), 0, -1, withscores=True
        ),
        "ready:FRONTENDCODER": await client.zrange(
            keys.ready_role("FRONTENDCODER"), 0, -1, withscores=True
        ),
        "work": await client.zrange(keys.work, 0, -1, withscores=True),
        "open": sorted(await client.smembers(keys.open)),
        "skipped": await client.hgetall(keys.skipped),
        "reviewing": sorted(await client.smembers(keys.reviewing)),
        "issues": [await client.get(keys.issue(n)) for n in range(1, 7)],
    }


async def unchanged_full_pass_calls(world: World, sim: Simulator) -> dict[str, Any]:
    sim.stats.reset()
    await world.full_sync()
    return sim.stats.snapshot()


@pytest.mark.parametrize(
    "lost",
    [
        "tasks",
        "ready",
        "ready:BACKENDCODER",
        "ready:FRONTENDCODER",
        "work",
        "open",
        "skipped",
        "reviewing",
    ],
)
async def test_full_pass_rebuilds_a_lost_index_key_without_github_calls(
    world: World, sim: Simulator, lost: str
) -> None:
    await world.tick()
    before = await derived(world)
    assert before["tasks"] and before["skipped"] and before["reviewing"]
    baseline = await unchanged_full_pass_calls(world, sim)
    keys = world.rstore.keys
    key = keys.ready_role(lost.split(":")[1]) if ":" in lost else getattr(keys, lost)
    assert await world.store.client.delete(key) == 1
    assert await derived(world) != before

    calls = await unchanged_full_pass_calls(world, sim)

    assert await derived(world) == before
    # Only the same 304s as an unchanged pass: nothing counted against the quota.
    assert calls["total"] == baseline["total"], (calls, baseline)
    assert calls["rate_limited_cost"] == 0, calls
    assert set(calls["by_status"]) == {"304"}, calls


async def test_lost_tasks_hash_claims_work_again_after_a_full_pass(world: World) -> None:
    await world.tick()
    await world.store.client.delete(world.rstore.keys.tasks)
    await world.full_sync()
    got = []
    for agent in ("a1", "a2", "a3", "a4"):
        task = await world.ask(agent)
        got.append(task.issue_id if task else None)
    # the review of #5 waits for its delay; #4 has no branch; #6 is a story
    assert sorted(n for n in got if n) == [1, 2, 3] and got[-1] is None, got


async def test_lost_ready_set_claims_work_again_after_a_full_pass(world: World) -> None:
    await world.tick()
    await world.store.client.delete(world.rstore.keys.ready)
    await world.full_sync()
    task = await world.ask("a1")
    assert task is not None and task.issue_id == 1


async def test_lost_role_ready_set_claims_work_again_after_a_full_pass(world: World) -> None:
    await world.tick()
    await world.store.client.delete(world.rstore.keys.ready_role("FRONTENDCODER"))
    await world.full_sync()
    task = await world.tasks.request_task("a1", roles=["FRONTENDCODER"])
    assert task is not None and task.issue_id == 3


async def test_lost_work_index_keeps_the_strict_bucket_after_a_full_pass(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """#1 is P0 and held; #2 (P1) must not be handed out while it is open. With `work` lost
    the bucket is unknown and #2 would go out; the full pass brings the bucket back."""
    issues = [
        {"number": 1, "title": "Urgent", "body": body(), "labels": ["P0", "BACKENDCODER"]},
        {"number": 2, "title": "Later", "body": body(), "labels": ["P1", "BACKENDCODER"]},
    ]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()
            first = await world.ask("a1")
            assert first is not None and first.issue_id == 1
            await world.tick()
            await world.full_sync()  # the page's ETag now covers #1's new labels
            await world.store.client.delete(world.rstore.keys.work)
            await world.full_sync()
            assert await world.ask("a2") is None
            assert await world.rstore.work_priorities() == {1: 0, 2: 1}


async def test_lost_open_set_comes_back_after_a_full_pass(world: World, sim: Simulator) -> None:
    await world.tick()
    await world.store.client.delete(world.rstore.keys.open)
    await world.full_sync()
    assert await world.rstore.open_numbers() == {1, 2, 3, 4, 5, 6}
    task = await world.ask("a1")
    assert task is not None and task.issue_id == 1


async def test_lost_issue_cache_entry_is_read_again_from_github(
    world: World, sim: Simulator
) -> None:
    """`issue:{2}` lost alone: its page is a 304, so the pass has no copy of #2 to index from.
    It reads that page again in full (one counted call) and the cache and #2's task return."""
    await world.tick()
    before = await derived(world)
    baseline = await unchanged_full_pass_calls(world, sim)
    await world.store.client.delete(world.rstore.keys.issue(2))

    calls = await unchanged_full_pass_calls(world, sim)

    assert await derived(world) == before
    assert calls["total"] == baseline["total"] + 1, (calls, baseline)
    assert calls["by_status"].get("200") == 1, calls
    # The next unchanged pass is all 304 again.
    again = await unchanged_full_pass_calls(world, sim)
    assert again["total"] == baseline["total"] and set(again["by_status"]) == {"304"}, again
    t1, t2 = await world.ask("a1"), await world.ask("a2")
    assert t1 is not None and t2 is not None
    assert (t1.issue_id, t2.issue_id) == (1, 2) and t2.title == "Two"


async def test_lost_issue_cache_and_tasks_together(world: World) -> None:
    await world.tick()
    before = await derived(world)
    keys = world.rstore.keys
    await world.store.client.delete(keys.issue(1), keys.issue(5), keys.tasks, keys.ready)
    await world.full_sync()
    assert await derived(world) == before


async def test_dead_agents_lost_lease_keys_are_adopted_then_expire_into_the_pool(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """a1 holds #1 (labels on GitHub) and dies; its lease keys are lost. Nothing else touches
    #1, so no sync re-reads it: before, it stayed in-progress on GitHub and out of the pool for
    good. The full pass adopts it for a1 (as after a FLUSHALL); the lease then expires
    unrenewed, GitHub shows no PR for it, and #1 goes to another agent."""
    issues = [{"number": 1, "title": "One", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()
            task = await world.ask("a1")
            assert task is not None
            await world.tick()  # the labels reach GitHub and the sync confirms them
            assert world.labels(1) >= {"in-progress", "a1"}
            await world.full_sync()  # the page's ETag now covers #1's new labels
            await world.tick()
            await world.lose_lease_keys(1)
            await world.tick()
            # No sync re-reads #1: no lease, and nobody can take it.
            assert await world.live_leases("a1") == []
            assert await world.ask("a2") is None

            await world.full_sync()

            assert await world.live_leases("a1") == [1]
            assert await world.ask("a2") is None  # still a1's until its lease runs out
            # a1 never heartbeats: its lease runs out (lock gone, reaper index due).
            keys = world.rstore.keys
            await world.store.client.delete(keys.issue_lock(1))
            await world.store.client.zadd(keys.leases, {"1": 0}, xx=True)
            await world.daemon.reap_all()
            # Never proved: the leader reads GitHub first (no PR for it), then it returns.
            assert await world.ask("a2") is None
            await world.daemon.progress_all()
            again = await world.ask("a2")
            assert again is not None and again.issue_id == 1
            await world.tick()
            assert "a1" not in world.labels(1)


async def test_unchanged_full_pass_makes_only_304_calls_and_writes_nothing(
    world: World, sim: Simulator
) -> None:
    """Nothing lost: the reconciling pass costs GitHub what it did before (one 304 per page,
    none counted) and rewrites no issue."""
    await world.tick()
    before = await derived(world)
    await world.full_sync()
    sim.stats.reset()
    report = await world.daemon.syncer.sync(world.settings.repositories[0], full=True)
    calls = sim.stats.snapshot()
    assert set(calls["by_status"]) == {"304"} and calls["rate_limited_cost"] == 0, calls
    assert calls["total"] == report.pages == report.not_modified, (calls, report)
    assert (report.written, report.readied) == (0, 0), report
    assert await derived(world) == before
    assert world.settings.repositories[0].full_name == REPO


async def test_reindexing_from_the_cache_keeps_a_fresh_claim(world: World) -> None:
    """a1 claims #1 and its labels are not written yet: the cache (and GitHub, 304) show #1
    unclaimed. The full pass indexes #1 again from that cache and must keep a1's lease and keep
    #1 out of the pool, before and after the labels land."""
    await world.tick()
    await world.full_sync()
    task = await world.ask("a1")
    assert task is not None and task.issue_id == 1
    await world.full_sync()
    assert await world.live_leases("a1") == [1]
    other = await world.ask("a2")
    assert other is not None and other.issue_id == 2
    await world.tick()
    await world.full_sync()
    await world.full_sync()
    assert await world.live_leases("a1") == [1]
    assert "development:1" not in dict(await world.rstore.ready_tasks())
    await world.tasks.heartbeat(REPO, 1, "a1", task.lease.token)


async def test_an_orphan_in_progress_label_is_cleared_by_a_later_unchanged_full_pass(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """#1 carries in-progress with no agent label and no lease (an orphan): a sync notes the
    time and removes the label once it stayed so for the lease TTL. Nothing changes on GitHub
    meanwhile, so only a pass that indexes #1 again from the cache can see the TTL pass."""
    issues = [
        {"number": 1, "title": "One", "body": body(), "labels": ["P1", "BACKENDCODER"]},
        {
            "number": 2,
            "title": "Two",
            "body": body(),
            "labels": ["P1", "BACKENDCODER", "in-progress"],
        },
    ]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, leases={"lease_ttl_s": 1}) as world:
            await world.tick()
            await world.full_sync()
            await asyncio.sleep(1.1)
            await world.full_sync()
            await world.tick()
            assert world.labels(2) == {"P1", "BACKENDCODER"}
            await world.tick()
            got = {(await world.ask(a)).issue_id for a in ("a1", "a2")}  # type: ignore[union-attr]
            assert got == {1, 2}


async def test_an_in_progress_label_for_an_agent_that_is_not_configured_is_named_and_cleared(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """With agent tokens configured, #2 carries in-progress and `ghost-agent`, no configured
    agent: the skip reason names that label (not "no single agent label"), and once the lease
    TTL passes both labels come off, so a real claim later leaves no stray agent label."""
    issues = [
        {
            "number": 2,
            "title": "Two",
            "body": body(),
            "labels": ["P1", "BACKENDCODER", "in-progress", "ghost-agent"],
        },
    ]
    server = {"agent_tokens": {"claude-1": "tok-1-0123456789abcdef"}, "admin_token": "boss"}
    with simulated(issues) as sim:
        async with running_world(
            sim, redis_url, make_settings, leases={"lease_ttl_s": 1}, server=server
        ) as world:
            await world.tick()
            skip = (await world.rstore.skipped())[2]
            assert "'ghost-agent'" in skip.reason and "not a configured agent" in skip.reason
            assert "no single agent label" not in skip.reason
            await asyncio.sleep(1.1)
            await world.full_sync()
            await world.tick()
            assert world.labels(2) == {"P1", "BACKENDCODER"}
            await world.tick()
            task = await world.ask("claude-1")
            assert task is not None and task.issue_id == 2
            await world.tick()
            assert world.labels(2) == {"P1", "BACKENDCODER", "in-progress", "claude-1"}
