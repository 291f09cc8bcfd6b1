"""The repository context compiled into the Lua scripts survives any label or key text."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed
from github_broker.settings import Settings
from github_broker.store import Store, context_prelude
from tests.factories import issue

pytestmark = pytest.mark.anyio
ODD_LABEL = 'wip "x" \\ ]]=] ✓'


def test_prelude_escapes_every_byte_outside_printable_ascii() -> None:
    lua = context_prelude({"label": ODD_LABEL, "ms": 600_000, "flag": True})
    assert lua.isascii()
    assert "base_context" in lua and "ms = 600000" in lua and "flag = true" in lua


async def test_scripts_use_the_compiled_context(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(redis={"url": lua_redis_url}, labels={"in_progress": ODD_LABEL})
    store = Store.from_settings(settings)
    try:
        rstore = store.repo("acme/widgets")
        work = issue(1, "P1", "BACKENDCODER")
        await rstore.upsert_issues([index_item(Rules(settings), work, "main")])
        await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
        got = await rstore.claim(
            "agent-1", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(got, Claimed)
        intent = await rstore.intent(1)
        assert intent is not None and ODD_LABEL in intent["add"]
    finally:
        await store.close()


async def test_claim_records_read_back_for_any_text(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The hand-out record, request-id record, label intent and branch job a claim writes
    read back as written for any agent id, label or branch text."""
    odd_agent = 'ag"ent\\\x01\t✓/'
    settings = make_settings(
        redis={"url": lua_redis_url},
        labels={"in_progress": ODD_LABEL},
        leases={"settle_grace_s": 0},
    )
    store = Store.from_settings(settings)
    try:
        rstore = store.repo("acme/widgets")
        rules = Rules(settings)
        items = [issue(n, "P1", "BACKENDCODER") for n in (1, 2)]
        await rstore.upsert_issues([index_item(rules, i, "main") for i in items])
        await rstore.save_sync_state({}, rebuilt=True)
        first = await rstore.claim(
            odd_agent,
            previous="completed",
            mode="strict",
            base_branch='ma"in',
            roles=None,
            request_id='r"1',
        )
        assert isinstance(first, Claimed)
        replay = await rstore.claim(
            odd_agent,
            previous="completed",
            mode="strict",
            base_branch="main",
            roles=None,
            request_id='r"1',
        )
        assert isinstance(replay, Claimed) and replay.token == first.token
        handout = json.loads(await store.client.get(rstore.keys.handout(odd_agent, 'r"1')))
        assert handout == {"n": 1, "task_id": "development:1", "token": first.token}
        record = await rstore.candidate(1, odd_agent)
        assert record is not None
        assert record["agent_id"] == odd_agent and record["token"] == first.token
        assert (record["issue"], record["status"], record["task_type"]) == (
            1,
            "assigned",
            "development",
        )
        assert isinstance(record["claimed_ms"], int) and record["claimed_ms"] > 0
        intent = await rstore.intent(1)
        assert intent is not None and sorted(intent["add"]) == sorted([ODD_LABEL, odd_agent])
        assert not intent["remove"] and not intent["on"] and intent["v"] == 1
        job = await store.client.hget(rstore.keys.outbox_data, "branch:1")
        assert json.loads(job) == {"branch": "feature/issue-1", "base": 'ma"in'}

        second = await rstore.claim(
            odd_agent, previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(second, Claimed) and second.issue.number == 2
        ended = await rstore.candidate(1, odd_agent)
        assert ended is not None
        assert (ended["status"], ended["outcome"], ended["agent_id"]) == (
            "needs_review",
            "completed",
            odd_agent,
        )
        assert ended["ended_ms"] >= ended["claimed_ms"] == record["claimed_ms"]
        settled = await rstore.intent(1)
        # The unsent wishes were cancelled; needs-review is the one write left.
        assert settled is not None and settled["add"] == [settings.labels.needs_review]
    finally:
        await store.close()
