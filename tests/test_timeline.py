"""The timeline streams: claims and lease ends from Lua, writes and leader changes from Python."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed
from github_broker.settings import Settings
from github_broker.store import TIMELINE_MAX, Store
from tests.factories import issue

pytestmark = pytest.mark.anyio
REPO = "acme/widgets"


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": lua_redis_url}, leases={"lease_ttl_s": 1, "agent_task_ttl_s": 60}
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


async def test_claims_and_lease_ends_land_on_the_timeline(store: Store) -> None:
    rstore = store.repo(REPO)
    rules = Rules(store.settings)
    items = [issue(1, "P1", "BACKENDCODER"), issue(2, "P1", "BACKENDCODER")]
    await rstore.upsert_issues([index_item(rules, i, "main") for i in items])
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
    first = await rstore.claim(
        "a1", previous="completed", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(first, Claimed)
    # a1 gives up issue 1 and gets issue 2; issue 1 goes back to the pool.
    second = await rstore.claim(
        "a1", previous="failed", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(second, Claimed) and second.issue.number == 2
    ok, _ = await rstore.finish(2, "a1", second.token, "completed")
    assert ok
    third = await rstore.claim(
        "a2", previous="completed", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(third, Claimed) and third.issue.number == 1
    await asyncio.sleep(1.2)
    await rstore.reap()

    events = list(reversed(await rstore.timeline()))
    assert [(e.kind, e.issue, e.agent) for e in events] == [
        ("claim", 1, "a1"),
        ("failed", 1, "a1"),
        ("claim", 2, "a1"),
        ("completed", 2, "a1"),
        ("claim", 1, "a2"),
        ("expired", 1, "a2"),
    ]
    assert events[0].detail == "development:1" and events[0].repository == REPO
    assert all(e.at_ms > 0 for e in events)


async def test_writes_and_leader_changes_are_recorded_and_counted(store: Store) -> None:
    rstore = store.repo(REPO)
    await rstore.record_write("applied", "labels:7", "labels +in-progress")
    await rstore.record_write("refused", "branch:8", "422 Reference already exists")
    await rstore.record_write("dropped", "labels:9", "404 Not Found")
    await store.record_event("leader_gained", None, "", "host:1")

    queue = await rstore.write_queue()
    assert (queue["applied"], queue["refused"], queue["dropped"]) == (1, 1, 1)
    merged = await store.timeline()
    assert [e.kind for e in merged] == [
        "leader_gained",
        "write_dropped",
        "write_refused",
        "write_applied",
    ]
    assert merged[0].repository is None and merged[0].detail == "host:1"
    assert merged[1].issue == 9 and merged[1].repository == REPO


async def test_timeline_stays_capped(store: Store) -> None:
    rstore = store.repo(REPO)
    for i in range(TIMELINE_MAX + 500):
        await rstore.record_event("claim", i, "a", "")
    length = await store.client.xlen(rstore.keys.timeline)
    # MAXLEN ~ trims whole stream nodes: close to the cap, never the whole history.
    assert TIMELINE_MAX <= length < TIMELINE_MAX + 500
