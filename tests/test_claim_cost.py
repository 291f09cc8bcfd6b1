"""What one settle + claim costs inside Redis: the commands claim.lua runs on a real
redis-server, counted, so that a rule added to the claim shows up here as a number rather
than later as a slower benchmark (`benchmarks.lua_cost` times the same flow)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis as sync_redis

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed
from github_broker.settings import Settings
from github_broker.store import Store
from tests.factories import issue

pytestmark = pytest.mark.anyio

#: Commands claim.lua runs for one request-task of an agent holding a development task:
#: the task settled as completed, the next development task claimed. Default settings
#: (dependencies and cool-downs on), nothing steered. 87 before issue 38; 77 after its first
#: steps (the history no longer reads the task value and the hand-out record the script has
#: at hand, sets a minute's or an hour's time to live once, not on every event; the rules
#: read no reservation or cool-down per task while none exists; a completion clears the
#: agent's streak's first failure only when it has a streak); 59 since the history counts in
#: the minute's hash only (the leader folds finished minutes into the hours and the totals,
#: history_fold.lua). 9 of them are the history's counters (9 fields in the minute's hash).
SETTLE_CLAIM_COMMANDS = 59
#: Of them, the history's counters.
HISTORY_COMMANDS = 9


@pytest.fixture
async def store(redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(redis={"url": redis_url}, leases={"settle_grace_s": 0})
    s = Store.from_settings(settings)
    yield s
    await s.close()


def script_commands(url: str) -> dict[str, int]:
    """Commands Redis ran since the last reset, by name, but the script calls themselves."""
    client = sync_redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {
        k.removeprefix("cmdstat_"): int(v["calls"])
        for k, v in stats.items()
        if k not in ("cmdstat_evalsha", "cmdstat_info", "cmdstat_config|resetstat")
    }


async def test_a_settle_and_claim_runs_a_counted_number_of_redis_commands(
    store: Store, redis_url: str
) -> None:
    rstore = store.repo("acme/widgets")
    rules = Rules(store.settings)
    await rstore.upsert_issues(
        [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in range(1, 31)]
    )
    await rstore.save_sync_state({}, rebuilt=True)
    for _ in range(2):  # a claim, then a settle + claim: the history's hashes exist
        got = await rstore.claim(
            "a1", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(got, Claimed)
    sync_redis.Redis.from_url(redis_url).config_resetstat()
    calls = 10
    for _ in range(calls):
        got = await rstore.claim(
            "a1", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(got, Claimed) and got.settled_issue is not None
    ran = script_commands(redis_url)
    # A minute that starts during the calls sets its hash's time to live and marks it
    # unfolded once for each of the two event kinds.
    started = ran.pop("expire", 0)
    assert started <= 4, ran
    ran["zadd"] -= started
    assert sum(ran.values()) == SETTLE_CLAIM_COMMANDS * calls, ran
    assert ran["hincrby"] == HISTORY_COMMANDS * calls, ran
    # Nothing steered: no reservation or cool-down is read per task.
    assert "zscore" not in ran, ran
