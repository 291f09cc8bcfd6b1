"""The repository context compiled into the Lua scripts survives any label or key text."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.models import Claimed
from github_broker.rules import Rules
from github_broker.settings import Settings
from github_broker.store import Store, context_prelude
from github_broker.sync import index_item
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
