"""claim.lua's settle-and-claim bookkeeping and want_labels' label rules (on every Lua engine)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from github_broker.models import Claimed, NoTask
from github_broker.settings import Settings
from github_broker.store import Store
from tests.factories import issue
from tests.test_store_leases import claim, load

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"lease_ttl_s": 5, "agent_task_ttl_s": 60, "settle_grace_s": 0},
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


async def test_settling_keys_after_each_way_out_of_a_claim(store: Store) -> None:
    """claim.lua rewrites the agent's current-task key when it claims again and deletes it on
    every other way out (settled only, empty, bucket); a completed task leaves no ready entry
    and no branch job behind, whether its branch job was still queued or already drained."""
    rstore = await load(
        store,
        issue(1, "P0", "BACKENDCODER"),
        issue(2, "P0", "BACKENDCODER"),
        issue(3, "P1", "BACKENDCODER"),
    )
    keys, client = rstore.keys, store.client
    first = await claim(rstore, "a1")
    assert isinstance(first, Claimed) and first.issue.number == 1
    # Completed with its branch job still queued, and the next task claimed.
    second = await claim(rstore, "a1")
    assert isinstance(second, Claimed) and second.issue.number == 2
    assert await client.get(keys.agent_current_task("a1")) == b"2"
    assert await client.zscore(keys.outbox, "branch:1") is None
    assert await client.hget(keys.outbox_data, "branch:1") is None
    assert await client.hget(keys.tasks, "development:1") is None
    for index in (keys.ready, keys.ready_role("BACKENDCODER")):
        assert await client.zscore(index, "development:1") is None
        assert await client.zscore(index, "development:2") is None
    # The branch job of issue 2 drained, then a settle-only request: the key goes.
    for job, payload, _ in await rstore.outbox_take(10, 1000):
        await rstore.outbox_done(job, payload)
    settled = await rstore.claim(
        "a1", previous="completed", mode="strict", base_branch="main", roles=None,
        settle_only=True,
    )
    assert isinstance(settled, NoTask) and settled.reason == "settled"
    assert settled.settled_issue == 2
    assert await client.get(keys.agent_current_task("a1")) is None
    # Issue 3 (P1) alone is left (1 and 2 wait for review): a3 takes it, completes it and
    # finds the pool empty: its key goes too.
    third = await claim(rstore, "a3", mode="best_effort")
    assert isinstance(third, Claimed) and third.issue.number == 3
    empty = await claim(rstore, "a3", mode="best_effort")
    assert isinstance(empty, NoTask) and empty.reason == "empty" and empty.settled_issue == 3
    assert await client.get(keys.agent_current_task("a3")) is None
    assert await client.hlen(keys.tasks) == 0
    assert await client.zcard(keys.ready) == 0


async def test_failed_settle_then_bucket_refusal_drops_the_current_task_key(store: Store) -> None:
    rstore = await load(
        store,
        issue(1, "P1", "BACKENDCODER"),
        issue(2, "P0", "BACKENDCODER"),
        issue(3, "P1", "BACKENDCODER"),
    )
    held = await claim(rstore, "a2")
    assert isinstance(held, Claimed) and held.issue.number == 2
    first = await claim(rstore, "a1", mode="best_effort")
    assert isinstance(first, Claimed) and first.issue.number == 1
    # a1 gives up issue 1; P0 issue 2 is still open and held: strict mode refuses issue 3.
    refused = await claim(rstore, "a1", previous="failed")
    assert isinstance(refused, NoTask) and refused.reason == "bucket"
    assert refused.settled_issue == 1
    assert await store.client.get(rstore.keys.agent_current_task("a1")) is None
    assert await store.client.zscore(rstore.keys.ready_role("BACKENDCODER"), "development:1")


def _want_model(
    intent: dict[str, Any] | None, add: list[str], remove: list[str]
) -> dict[str, Any] | None:
    """want_labels' rules on sets (the reference the Lua list implementation must match)."""
    cur = intent or {"add": [], "remove": [], "on": [], "v": 0}
    adds, removes, on = set(cur["add"]), set(cur["remove"]), set(cur["on"])
    for label in add:
        if label in removes:
            on.add(label)
        adds.add(label)
        removes.discard(label)
    for label in remove:
        if label in on or label not in adds:
            removes.add(label)
        adds.discard(label)
    if not adds and not removes and not on:
        return None
    return {"add": sorted(adds), "remove": sorted(removes), "on": sorted(on), "v": cur["v"] + 1}


async def test_label_wishes_match_the_set_rules_from_any_state(store: Store) -> None:
    """Random wishes, interleaved with write-queue takes and acknowledgements (which put
    labels in `on` and prune what was applied), give the intent and the labels job the set
    rules say."""
    rng = random.Random(7)
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    client, keys = store.client, rstore.keys
    pool = ["a1", "a2", "in-progress", "needs-review", "needs-human", "z-last"]
    for _ in range(300):
        step = rng.random()
        if step < 0.15:
            for job, payload, _ in await rstore.outbox_take(10, 1000):
                if rng.random() < 0.7:
                    await rstore.outbox_done(job, payload)
                else:
                    await rstore.outbox_done(job, payload, retry_in_ms=0)
            continue
        add = rng.sample(pool, rng.randint(0, 3))
        remove = rng.sample(pool, rng.randint(0, 3))
        expected = _want_model(await rstore.intent(1), add, remove)
        await rstore.want_labels(1, add, remove)
        assert await rstore.intent(1) == expected, (add, remove)
        queued = await client.zscore(keys.outbox, "labels:1") is not None
        assert queued == bool(expected and (expected["add"] or expected["remove"]))
