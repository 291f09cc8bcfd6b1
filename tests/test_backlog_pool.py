"""The pool under the benchmark's claim-abandon flow: an abandoned task always comes back.

`make bench` once reported 0 claims/s against 100 open issues. The cause was the harness:
each load run's agents (new ids every run) ended holding the task they last claimed, so
every run left 50 leases for the lease TTL and the pool was empty after two runs. These
tests pin the product side: many agents abandoning and claiming at once never lose a task
from the ready index, and a released pool is whole again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from github_broker.claim.rules import Rules
from github_broker.keys import RepoKeys
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, NoTask
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store
from tests.factories import issue

REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")
ISSUES = 100
AGENTS = 50
ROUNDS = 20


@pytest.fixture
async def rstore(
    redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[RepoStore]:
    # The benchmark's settings (benchmarks/servers.py::broker_env): no settle grace, no
    # failure budget, no cool-down.
    settings = make_settings(
        redis={"url": redis_url},
        leases={"settle_grace_s": 0},
        failures={"max_failures": 1_000_000_000, "cooldown_s": 0, "breaker_streak": 0},
    )
    store = Store.from_settings(settings)
    rstore = store.repo(REPO)
    rules = Rules(settings)
    await rstore.upsert_issues(
        [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in range(1, ISSUES + 1)]
    )
    await rstore.save_sync_state({}, rebuilt=True)
    yield rstore
    await store.close()


def pool(redis_url: str) -> tuple[set[str], set[str], set[str]]:
    """(every task, the ready ones, the leased ones) as task ids."""
    # redis-py types its sync answers as maybe-awaitable.
    r: Any = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        tasks = set(r.hkeys(KEYS.tasks))
        ready = set(r.zrange(KEYS.ready, 0, -1))
        leased = {r.hget(KEYS.lease(int(n)), "task_id") for n in r.zrange(KEYS.leases, 0, -1)}
        return tasks, ready, {t for t in leased if t}
    finally:
        r.close()


async def agent(
    rstore: RepoStore, name: str, rounds: int = ROUNDS
) -> tuple[str, int, int, Claimed | None]:
    """`rounds` requests with previous=abandoned: (name, claims, no-task answers, task held)."""
    claims = empty = 0
    held: Claimed | None = None
    for _ in range(rounds):
        got = await rstore.claim(
            name, previous="abandoned", mode="strict", base_branch="main", roles=None
        )
        if isinstance(got, Claimed):
            claims += 1
            held = got
        else:
            assert isinstance(got, NoTask)
            empty += 1
            held = None
    return name, claims, empty, held


@pytest.mark.anyio
async def test_concurrent_abandons_never_lose_a_task(rstore: RepoStore, redis_url: str) -> None:
    for run in range(3):  # new agent ids every run, as the benchmark's load generator
        results = await asyncio.gather(
            *(agent(rstore, f"bench-{run}-{i:03d}") for i in range(AGENTS))
        )
        # 50 agents, 100 tasks: each of them always finds one.
        assert sum(empty for _, _, empty, _ in results) == 0
        assert sum(claims for _, claims, _, _ in results) == AGENTS * ROUNDS
        tasks, ready, leased = pool(redis_url)
        assert len(tasks) == ISSUES
        assert len(leased) == AGENTS and not ready & leased
        assert ready | leased == tasks  # nothing lost: every task is ready or held
        # The agents give back what they hold, as the harness now does after a run.
        for name, _, _, held in results:
            assert held is not None
            ok, why = await rstore.finish(held.issue.number, name, held.token, "abandoned")
            assert ok, why
        tasks, ready, leased = pool(redis_url)
        assert ready == tasks and not leased


@pytest.mark.anyio
async def test_leases_left_by_earlier_agents_shrink_the_pool(
    rstore: RepoStore, redis_url: str
) -> None:
    """What the benchmark saw: a held task is not claimable (by design) until released or
    expired, so agents that never give back their last task shrink the pool for good."""
    first = await asyncio.gather(*(agent(rstore, f"gone-0-{i:03d}") for i in range(AGENTS)))
    assert all(held is not None for *_, held in first)
    _, ready, _ = pool(redis_url)
    assert len(ready) == ISSUES - AGENTS
    # A second cohort of new ids cannot settle those leases: it takes the other half.
    second = await asyncio.gather(
        *(agent(rstore, f"gone-1-{i:03d}", rounds=1) for i in range(AGENTS))
    )
    assert all(held is not None for *_, held in second)
    tasks, ready, leased = pool(redis_url)
    assert not ready and leased == tasks
    got = await rstore.claim(
        "late", previous="abandoned", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(got, NoTask) and got.reason == "empty"
