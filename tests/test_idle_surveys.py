"""The leader's idle surveys (one round trip for every repository) answer what each
repository's own reads answer, on every engine: a plain server, a Cluster, fakeredis."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed
from github_broker.settings import Settings
from github_broker.store import Store
from tests.factories import issue

pytestmark = pytest.mark.anyio
NAMES = [f"acme/repo-{i}" for i in range(6)]


async def test_the_surveys_agree_with_each_repositorys_own_reads(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(
        redis={"url": lua_redis_url}, repositories=NAMES, leases={"settle_grace_s": 0}
    )
    store = Store.from_settings(settings)
    try:
        rules = Rules(settings)
        for name in NAMES[:3]:  # mirrored, one issue each; the others never synced
            rstore = store.repo(name)
            await rstore.upsert_issues([index_item(rules, issue(1, "P1", "BACKENDCODER"), "main")])
            await rstore.save_sync_state({}, rebuilt=True)
        claimed = await store.repo(NAMES[1]).claim(
            "agent-1", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(claimed, Claimed)  # a lease, and its label and branch writes due
        assert await store.mirrors_built(NAMES) == set(NAMES[:3])
        assert await store.holding(NAMES) == {NAMES[1]}
        due = {n for n in NAMES if await store.repo(n).outbox_due(1)}
        assert due == {NAMES[1]} and await store.writes_due(NAMES) == due
        await store.record_servers("run-1", {n: f"mark-{n}" for n in NAMES[:2]})
        recorded = await store.recorded_servers(NAMES)
        assert recorded == {
            **{n: ("run-1", f"mark-{n}") for n in NAMES[:2]},
            **dict.fromkeys(NAMES[2:]),
        }
    finally:
        await store.close()
