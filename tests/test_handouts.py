"""Idempotent hand-outs: repeated request ids and concurrent requests of one agent."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.rules import Rules
from github_broker.claim.service import TaskService
from github_broker.keys import RepoKeys
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, NoTask
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from github_broker.store import RepoStore, Store
from tests.factories import issue
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")
#: Rounds of the solo agent's loop (at most 25 s of them on a slow machine). A round takes at
#: most one issue out of the pool, so ISSUES = ROUNDS never empties it: a fast machine ran
#: 1000 issues dry in under 25 s (round 1714: no task).
ROUNDS = 600
ISSUES = ROUNDS


@pytest.fixture
async def make_store(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Awaitable[RepoStore]]]:
    stores: list[Store] = []

    async def make(grace_s: float = 5.0) -> RepoStore:
        settings = make_settings(
            redis={"url": lua_redis_url}, leases={"lease_ttl_s": 60, "settle_grace_s": grace_s}
        )
        store = Store.from_settings(settings)
        stores.append(store)
        rstore = store.repo(REPO)
        rules = Rules(settings)
        await rstore.upsert_issues(
            [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in (1, 2, 3)]
        )
        await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
        return rstore

    yield make
    for store in stores:
        await store.close()


@pytest.fixture
async def rstore(make_store: Callable[..., Awaitable[RepoStore]]) -> RepoStore:
    return await make_store()


async def claim(rstore: RepoStore, agent: str, **kw: Any) -> Claimed | NoTask:
    kw.setdefault("previous", "completed")
    return await rstore.claim(agent, mode="strict", base_branch="main", roles=None, **kw)


@pytest.mark.anyio
async def test_repeated_request_id_gets_the_same_lease_and_settles_nothing(
    rstore: RepoStore,
) -> None:
    first = await claim(rstore, "a1", request_id="r-1")
    again = await claim(rstore, "a1", request_id="r-1")
    assert isinstance(first, Claimed) and isinstance(again, Claimed)
    assert (again.issue.number, again.token) == (first.issue.number, first.token)
    assert again.settled_issue is None
    assert (await rstore.candidate(first.issue.number, "a1") or {})["status"] == "assigned"
    assert "needs-review" not in ((await rstore.intent(first.issue.number)) or {}).get("add", [])


@pytest.mark.anyio
async def test_concurrent_requests_of_one_agent_share_the_task_instead_of_settling_it(
    rstore: RepoStore,
) -> None:
    got = await asyncio.gather(*(claim(rstore, "a1") for _ in range(5)))
    assert all(isinstance(g, Claimed) for g in got)
    numbers = {g.issue.number for g in got if isinstance(g, Claimed)}
    tokens = {g.token for g in got if isinstance(g, Claimed)}
    assert len(numbers) == 1 and len(tokens) == 1
    (n,) = numbers
    assert (await rstore.candidate(n, "a1") or {})["status"] == "assigned"
    assert len(await rstore.leases()) == 1


@pytest.mark.anyio
async def test_a_new_request_id_after_the_grace_settles_the_held_task(
    make_store: Callable[..., Awaitable[RepoStore]],
) -> None:
    rstore = await make_store(grace_s=0.2)
    first = await claim(rstore, "a1", request_id="r-1")
    await asyncio.sleep(0.3)
    second = await claim(rstore, "a1", request_id="r-2")
    assert isinstance(first, Claimed) and isinstance(second, Claimed)
    assert second.issue.number != first.issue.number
    assert second.settled_issue == first.issue.number
    # The first request id's lease has ended: repeating it now settles nothing, gives nothing.
    replay = await claim(rstore, "a1", request_id="r-1")
    assert isinstance(replay, NoTask) and replay.reason == "replayed"
    assert (await rstore.candidate(second.issue.number, "a1") or {})["status"] == "assigned"


@pytest.mark.anyio
async def test_request_ids_hold_across_repositories(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(
        redis={"url": lua_redis_url}, repositories=["acme/widgets", "acme/gadgets"]
    )
    store = Store.from_settings(settings)
    try:
        rules = Rules(settings)
        for name in ("acme/widgets", "acme/gadgets"):
            await store.repo(name).upsert_issues(
                [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in (1, 2)]
            )
            await store.repo(name).save_sync_state({}, rebuilt=True)
        tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
        first = await tasks.request_task("a1", request_id="r-1")
        again = await tasks.request_task("a1", request_id="r-1")
        racing = await asyncio.gather(*(tasks.request_task("a1") for _ in range(3)))
        assert first is not None and again is not None
        handed = {(t.repository, t.issue_id, t.lease.token) for t in [first, again, *racing] if t}
        assert len(handed) == 1 and all(racing)
        leases = [lease for r in store.repos.values() for lease in await r.leases()]
        assert len(leases) == 1
    finally:
        await store.close()


@pytest.mark.anyio
async def test_concurrent_requests_naming_different_repositories_hold_one_task(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    # Found by a hostile client: one request per repository at once left the agent holding a
    # task in each, and its next request completed both.
    settings = make_settings(
        redis={"url": lua_redis_url},
        repositories=["acme/widgets", "acme/gadgets"],
        priority_mode="best_effort",
    )
    store = Store.from_settings(settings)
    try:
        rules = Rules(settings)
        for name in ("acme/widgets", "acme/gadgets"):
            await store.repo(name).upsert_issues(
                [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in (1, 2)]
            )
            await store.repo(name).save_sync_state({}, rebuilt=True)
        tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
        for agent in ("a1", "a2", "a3"):
            await asyncio.gather(
                tasks.request_task(agent, repositories=["acme/widgets"]),
                tasks.request_task(agent, repositories=["acme/gadgets"]),
                tasks.request_task(agent),
            )
            held = [lease for r in store.repos.values() for lease in await r.leases()]
            assert len([lease for lease in held if lease.agent_id == agent]) == 1, held
    finally:
        await store.close()


# --- one agent hammering a real serve process: ROUNDS rounds, 25 s at most ------------------------


@pytest.fixture
def sim() -> Iterator[Simulator]:
    issues = generate_issues(ISSUES, priorities=("P1",))
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": issues}]}) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    env = broker_env(
        redis_url,
        sim.base_url,
        REPO,
        # Generous: a loaded machine must not turn a burst into "held long enough to be done".
        GITHUB_BROKER_LEASES__SETTLE_GRACE_S="15",
        GITHUB_BROKER_FAILURES__COOLDOWN_S="0",
        GITHUB_BROKER_FAILURES__MAX_FAILURES="1000",
        # Its releases are the point here, not a broken agent.
        GITHUB_BROKER_FAILURES__BREAKER_STREAK="0",
    )
    proc = BrokerProcess(env, tmp_path, "broker").start()
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.zcard(KEYS.ready) >= ISSUES, 30, "the first sync")
    client.close()
    yield proc
    proc.stop()


def _ask(url: str, request_id: str | None, timeout_s: float = 15) -> int | None:
    body: dict[str, Any] = {"agent_id": "solo"}
    if request_id:
        body["request_id"] = request_id
    r = requests.post(f"{url}/request-task", json=body, timeout=timeout_s)
    assert r.status_code in (200, 204), r.text
    return int(r.json()["issue_id"]) if r.status_code == 200 else None


@pytest.mark.slow
def test_one_agent_retrying_and_racing_itself_never_gets_unfinished_work_reviewed(
    sim: Simulator, broker: BrokerProcess
) -> None:
    url = broker.url
    finished: set[int] = set()
    released: set[int] = set()
    rounds = 0
    rng = random.Random(9)
    deadline = time.monotonic() + 25
    with ThreadPoolExecutor(max_workers=6) as pool:
        # At most ROUNDS rounds: each takes at most one of the ISSUES, so the pool never runs dry.
        while time.monotonic() < deadline and rounds < ROUNDS:
            rounds += 1
            rid = f"round-{rounds}"
            # A burst: the same request id twice (a retry racing its original) and plain
            # concurrent requests; every answer must be the one task the agent now holds.
            ids = [rid, rid, None, None, rid][: rng.randint(2, 5)]
            got = list(pool.map(lambda r: _ask(url, r), ids))
            assert len(set(got)) == 1, f"round {rounds}: one agent got {got}"
            held = got[0]
            assert held is not None, f"round {rounds}: no task ({len(finished)} done)"
            # A late retry of the same request, after its answer: still the same task.
            assert _ask(url, rid) == held
            r_token = requests.post(
                f"{url}/request-task",
                json={"agent_id": "solo", "request_id": rid},
                timeout=15,
            ).json()["lease"]["token"]
            if rng.random() < 0.6:
                action, target = "complete", finished
                body = {"agent_id": "solo", "token": r_token}
            else:
                action, target = "release", released
                body = {"agent_id": "solo", "token": r_token, "reason": "failed"}
            r = requests.post(f"{url}/tasks/{REPO}/{held}/{action}", json=body, timeout=15)
            assert r.status_code == 200, r.text
            target.add(held)
    print(f"\nsolo agent: {rounds} rounds, {len(finished)} completed, {len(released)} released")
    assert rounds >= 10
    # Everything the broker wrote lands on the simulator; then compare.
    client = redis.Redis.from_url(broker.env["GITHUB_BROKER_REDIS__URL"])

    def landed() -> tuple[set[int]] | None:
        states = {
            n: set(sim.state.issue_labels("acme", "widgets", n)) for n in range(1, ISSUES + 1)
        }
        reviewed = {n for n, labels in states.items() if "needs-review" in labels}
        return (reviewed,) if client.zcard(KEYS.outbox) == 0 and reviewed >= finished else None

    (reviewed,) = wait_until(landed, 30, "the write queue drained and every completion reviewed")
    client.close()
    assert reviewed == finished, json.dumps(
        {"reviewed_not_finished": sorted(reviewed - finished), "rounds": rounds}
    )
