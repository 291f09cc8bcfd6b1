"""Claims, leases and the write queue's Lua scripts, on a real redis-server."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Beat, Claimed, NoTask
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store
from tests.factories import issue

pytestmark = pytest.mark.anyio
REPO = "acme/widgets"


@pytest.fixture
async def store(lua_redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"lease_ttl_s": 5, "agent_task_ttl_s": 60, "settle_grace_s": 0},
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


@pytest.fixture
async def short_store(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": lua_redis_url},
        leases={"lease_ttl_s": 1, "agent_task_ttl_s": 60, "settle_grace_s": 0},
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


async def load(store: Store, *issues_) -> RepoStore:  # type: ignore[no-untyped-def]
    rstore = store.repo(REPO)
    rules = Rules(store.settings)
    await rstore.upsert_issues([index_item(rules, i, "main") for i in issues_])
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
    return rstore


async def claim(
    rstore: RepoStore,
    agent: str,
    *,
    previous: str = "completed",
    roles: list[str] | None = None,
    mode: str = "strict",
) -> Claimed | NoTask:
    return await rstore.claim(agent, previous=previous, mode=mode, base_branch="main", roles=roles)


async def test_claim_takes_most_urgent_oldest_first(store: Store) -> None:
    rstore = await load(
        store,
        issue(3, "P1", "BACKENDCODER"),
        issue(2, "P0", "BACKENDCODER"),
        issue(1, "P0", "BACKENDCODER", minute=50),
    )
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    assert got.issue.number == 2 and got.branch == "feature/issue-2" and got.role == "BACKENDCODER"


async def test_strict_bucket_blocks_lower_priority_while_p0_is_held(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"), issue(2, "P1", "BACKENDCODER"))
    first = await claim(rstore, "a1")
    assert isinstance(first, Claimed) and first.issue.number == 1
    second = await claim(rstore, "a2")
    assert isinstance(second, NoTask) and second.reason == "bucket" and second.bucket == 0
    relaxed = await claim(rstore, "a3", mode="best_effort")
    assert isinstance(relaxed, Claimed) and relaxed.issue.number == 2


async def test_roles_filter_and_unknown_role_gets_nothing(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "FRONTENDCODER"), issue(2, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1", roles=["BACKENDCODER"])
    assert isinstance(got, Claimed) and got.issue.number == 2
    none = await claim(rstore, "a2", roles=["TESTER"])
    assert isinstance(none, NoTask) and none.reason == "empty"


@pytest.mark.parametrize("roles", [None, ["BACKENDCODER"]])
async def test_index_entries_without_their_task_are_dropped_not_an_error(
    store: Store, roles: list[str] | None
) -> None:
    """The tasks hash lost alone (evicted) leaves `ready` and `ready:{role}` naming tasks with
    no value. A claim drops those entries and takes the next task that has one, or finds
    nothing; it never fails (it did: a Lua error, a 503 on every claim)."""
    rstore = await load(store, *(issue(n, "P1", "BACKENDCODER") for n in (1, 2, 3)))
    keys, client = rstore.keys, store.client
    await client.hdel(keys.tasks, "development:1", "development:2")
    got = await claim(rstore, "a1", roles=roles)
    assert isinstance(got, Claimed) and got.issue.number == 3
    await client.delete(keys.tasks)
    await client.zadd(keys.ready, {"development:4": 1})  # more than one lost entry in a row
    await client.zadd(keys.ready_role("BACKENDCODER"), {"development:4": 1})
    nothing = await claim(rstore, "a2", roles=roles)
    assert isinstance(nothing, NoTask) and nothing.reason == "empty"
    assert await client.zcard(keys.ready) == 0
    # A claim of any role reads `ready`, which cannot tell an entry's role once its value is
    # gone: the role index keeps its entries until a claim by role meets them.
    by_role = await claim(rstore, "a3", roles=["BACKENDCODER"])
    assert isinstance(by_role, NoTask) and by_role.reason == "empty"
    assert await client.zcard(keys.ready_role("BACKENDCODER")) == 0


async def test_claim_writes_seed_schema_keys(store: Store) -> None:
    rstore = await load(store, issue(7, "P2", "TESTER"))
    got = await claim(rstore, "agent-x")
    assert isinstance(got, Claimed)
    keys = rstore.keys
    client = store.client
    assert await client.get(keys.issue_lock(7)) == b"agent-x"
    assert 0 < await client.ttl(keys.issue_lock(7)) <= 5
    assert await client.get(keys.agent_current_task("agent-x")) == b"7"
    candidate = json.loads(await client.get(keys.task_candidate(7, "agent-x")))
    assert candidate["status"] == "assigned" and candidate["task_type"] == "development"
    assert 86000 < await client.ttl(keys.task_candidate(7, "agent-x")) <= 86400
    assert await client.ttl(keys.issue(7)) == -1
    intent = await rstore.intent(7)
    assert intent is not None and intent["add"] == ["agent-x", "in-progress"]
    jobs = dict((j, p) for j, p, _ in await rstore.outbox_take(10, 1000))
    assert json.loads(jobs["branch:7"]) == {"branch": "feature/issue-7", "base": "main"}


async def test_heartbeat_extends_and_stale_token_is_refused(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    ok, beat = await rstore.heartbeat(1, "a1", got.token)
    assert ok and isinstance(beat, Beat) and beat.expires_ms >= got.expires_ms
    assert await rstore.heartbeat(1, "a1", "forged") == (False, "revoked")
    assert await rstore.heartbeat(1, "a2", got.token) == (False, "not_owner")
    assert await rstore.finish(1, "a2", got.token, "completed") == (False, "not_owner")


async def test_expired_lease_is_reassigned_and_old_token_refused(short_store: Store) -> None:
    store = short_store
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    first = await claim(rstore, "a1")
    assert isinstance(first, Claimed)
    assert isinstance(await claim(rstore, "a2"), NoTask)
    await asyncio.sleep(1.1)  # the 1 s lease runs out without a heartbeat
    second = await claim(rstore, "a2")
    assert isinstance(second, Claimed) and second.issue.number == 1
    assert await rstore.heartbeat(1, "a1", first.token) == (False, "expired")
    assert await rstore.finish(1, "a1", first.token, "completed") == (False, "expired")
    cand = await rstore.candidate(1, "a1")
    assert cand is not None and cand["status"] == "expired"
    ok, _ = await rstore.heartbeat(1, "a2", second.token)
    assert ok


async def test_release_returns_task_to_pool_and_removes_labels(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    assert await rstore.finish(1, "a1", got.token, "abandoned") == (True, "abandoned")
    assert await rstore.heartbeat(1, "a1", got.token) == (False, "abandoned")
    # Released before any write went out: the wish and its undo cancel, no GitHub call.
    assert await rstore.intent(1) is None
    assert await store.client.zscore(rstore.keys.outbox, "labels:1") is None
    again = await claim(rstore, "a2")
    assert isinstance(again, Claimed) and again.issue.number == 1


async def test_release_after_the_labels_were_written_queues_their_removal(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    for job, payload, _ in await rstore.outbox_take(10, 60_000):
        assert await rstore.outbox_done(job, payload)
    assert await rstore.intent(1) == {"add": [], "remove": [], "on": ["a1", "in-progress"], "v": 1}
    assert await rstore.finish(1, "a1", got.token, "abandoned") == (True, "abandoned")
    assert await rstore.intent(1) == {
        "add": [],
        "remove": ["a1", "in-progress"],
        "on": ["a1", "in-progress"],
        "v": 2,
    }
    [(job, payload, _)] = await rstore.outbox_take(10, 60_000)
    assert job == "labels:1"
    assert await rstore.outbox_done(job, payload)
    # Applied removals leave the record: it stays small however many agents held the issue.
    assert await rstore.intent(1) == {"add": [], "remove": [], "on": [], "v": 2}
    assert await rstore.outbox_take(10, 60_000) == []


async def test_asking_again_completes_held_task_by_default(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"), issue(2, "P0", "BACKENDCODER"))
    first = await claim(rstore, "a1")
    assert isinstance(first, Claimed) and first.issue.number == 1
    second = await claim(rstore, "a1")
    assert isinstance(second, Claimed) and second.issue.number == 2
    assert second.settled_issue == 1 and second.settled_outcome == "completed"
    cand = await rstore.candidate(1, "a1")
    assert cand is not None and cand["status"] == "needs_review"
    intent = await rstore.intent(1)
    assert intent is not None and intent["add"] == ["needs-review"]
    # Completed development work is not offered again while it waits for review.
    other = await claim(rstore, "a9")
    assert isinstance(other, NoTask)


async def test_asking_again_with_failed_puts_task_back_for_others(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    first = await claim(rstore, "a1")
    assert isinstance(first, Claimed)
    retry = await claim(rstore, "a1", previous="failed")
    assert isinstance(retry, NoTask) and retry.settled_outcome == "failed"
    other = await claim(rstore, "a2")
    assert isinstance(other, Claimed) and other.issue.number == 1


async def test_sync_never_reoffers_claimed_issue_before_labels_land(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    await claim(rstore, "a1")  # completes issue 1; GitHub still shows no label at all
    await load(store, issue(1, "P0", "BACKENDCODER"))  # a sync with the stale view
    assert isinstance(await claim(rstore, "a2"), NoTask)
    # While the write is still queued, even a page showing it keeps the wish (it may be a
    # page read before a newer wish); once written and seen, GitHub is the truth again.
    await load(store, issue(1, "P0", "BACKENDCODER", "needs-review"))
    assert await rstore.intent(1) is not None
    for job, payload, _ in await rstore.outbox_take(10, 60_000):
        await rstore.outbox_done(job, payload)
    await load(store, issue(1, "P0", "BACKENDCODER", "needs-review"))
    assert await rstore.intent(1) is None


async def test_closing_held_issue_revokes_lease(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    assert await rstore.remove_issues([1]) == (1, 1)
    assert await rstore.heartbeat(1, "a1", got.token) == (False, "issue_closed")
    assert await store.client.exists(rstore.keys.issue(1)) == 0


async def test_unlabelling_held_issue_revokes_with_label_removed(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    await load(store, issue(1, "BACKENDCODER"))  # priority label removed
    assert await rstore.heartbeat(1, "a1", got.token) == (False, "label_removed")


async def test_outbox_keeps_newer_wish_when_payload_changed(store: Store) -> None:
    rstore = await load(store, issue(1, "P0", "BACKENDCODER"))
    got = await claim(rstore, "a1")
    assert isinstance(got, Claimed)
    taken = {j: p for j, p, _ in await rstore.outbox_take(10, 60_000)}
    await rstore.finish(1, "a1", got.token, "completed")  # intent changes while in flight
    assert await rstore.outbox_done("labels:1", taken["labels:1"]) is False
    assert await rstore.outbox_done("branch:1", taken["branch:1"]) is True
    again = {j: p for j, p, _ in await rstore.outbox_take(10, 60_000)}
    assert json.loads(again["labels:1"])["add"] == ["needs-review"]


async def test_a_claim_past_its_mutex_fence_is_refused_and_settles_nothing(store: Store) -> None:
    """A script of a request across repositories runs only before the fence its agent mutex
    yielded (Redis's clock): past it, the claim neither settles the held task nor claims."""
    from github_broker.errors import StoreUnavailable

    rstore = await load(store, issue(1, "P1", "BACKENDCODER"), issue(2, "P1", "BACKENDCODER"))
    held = await claim(rstore, "a1")
    assert isinstance(held, Claimed)
    seconds, micros = await store.client.time()
    now = int(seconds) * 1000 + int(micros) // 1000
    with pytest.raises(StoreUnavailable, match="outlived the agent's mutex"):
        await rstore.claim(
            "a1",
            previous="completed",
            mode="strict",
            base_branch="main",
            roles=None,
            fence_ms=now - 1,
        )
    assert [lease.issue for lease in await rstore.leases()] == [held.issue.number]
    # Before its fence the same call settles and claims.
    got = await rstore.claim(
        "a1",
        previous="completed",
        mode="strict",
        base_branch="main",
        roles=None,
        fence_ms=now + 60_000,
    )
    assert isinstance(got, Claimed) and got.settled_issue == held.issue.number


async def test_agent_mutex_lives_as_long_as_the_calls_of_one_request(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Held one call bound per Redis call a request makes (a repeated request id's check, a
    settling round, then per repository a pointer, a default-branch lookup, a claim and a look
    at a rebuilding mirror's sync) plus one, not a fixed 10 s; released when the request
    ends."""
    settings = make_settings(
        redis={"url": redis_url, "socket_timeout_s": 0.3},
        repositories=["acme/widgets", "acme/gadgets"],
    )
    s = Store.from_settings(settings)
    try:
        key = s.global_keys.agent_busy("a1")
        async with s.agent_mutex("a1"):
            ttl_ms = await s.client.pttl(key)
            assert 3900 < ttl_ms <= 4200  # 0.3 s x (4 + 1 + 4 x 2 + 1)
            # A second request of the agent waits until the hold has run out, no longer.
            started = asyncio.get_running_loop().time()
            async with s.agent_mutex("a1"):
                waited = asyncio.get_running_loop().time() - started
            assert 3.6 < waited < 4.7, waited
        # The release is written without waiting for its answer: Redis runs it at once.
        for _ in range(50):
            if not await s.client.exists(key):
                break
            await asyncio.sleep(0.01)
        assert await s.client.exists(key) == 0
    finally:
        await s.close()


# --- claim.lua's settle-and-claim bookkeeping, want_labels' label rules -------------------


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
        "a1",
        previous="completed",
        mode="strict",
        base_branch="main",
        roles=None,
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
