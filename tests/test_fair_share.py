"""Fair share across repositories: within one priority a busy repository cannot starve the
others; weights set the shares; the order by priority is never crossed (real redis-server,
the real claim walk and scripts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.rules import Rules
from github_broker.claim.service import TaskService
from github_broker.errors import ConfigError
from github_broker.leader.sync import index_item
from github_broker.reports.explain import explain
from github_broker.settings import Settings
from github_broker.store import Store
from tests.factories import issue

pytestmark = pytest.mark.anyio

BIG, SMALL = "acme/big", "acme/small"


async def mirrored(store: Store, name: str, numbers: list[int], priority: str = "P1") -> None:
    rstore = store.repo(name)
    rules = Rules(store.settings)
    await rstore.upsert_issues(
        [index_item(rules, issue(n, priority, "BACKENDCODER"), "main") for n in numbers]
    )
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would


@pytest.fixture
async def deployment(
    redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[Callable[..., Any]]:
    """A factory: a store and a TaskService over `repositories` (the big one first, so the
    configured order favours it), the index kept by a listening waker."""
    opened: list[tuple[Store, ReadyWaker]] = []

    async def make(repositories: list[Any]) -> tuple[Store, TaskService]:
        settings = make_settings(
            redis={"url": redis_url}, repositories=repositories, leases={"settle_grace_s": 0}
        )
        store = Store.from_settings(settings)
        waker = ReadyWaker(1.0)
        opened.append((store, waker))
        return store, TaskService(settings, store, Prompts.load(None), waker)

    yield make
    for store, waker in opened:
        await waker.stop()
        await store.close()


async def start(store: Store, tasks: TaskService) -> None:
    tasks.waker.start(store)
    await tasks.waker.index.reload(store)


async def rounds(tasks: TaskService, agents: int, count: int) -> list[tuple[str, int]]:
    """`count` rounds of `agents` agents asking at once (each settling its previous task as
    completed): the hand-outs, round after round."""
    handed: list[tuple[str, int]] = []
    for _ in range(count):
        got = await asyncio.gather(*(tasks.request_task(f"a{i}") for i in range(agents)))
        for task in got:
            assert task is not None
            handed.append((task.repository, task.issue_id))
    return handed


async def test_a_small_repository_is_drained_within_its_share_while_a_busy_one_has_200(
    deployment: Callable[..., Any],
) -> None:
    store, tasks = await deployment([BIG, SMALL])
    await mirrored(store, BIG, list(range(1, 201)))
    await mirrored(store, SMALL, list(range(1, 6)))
    await start(store, tasks)
    handed = await rounds(tasks, agents=10, count=3)
    assert len(handed) == len(set(handed)) == 30  # 30 hand-outs, none twice
    small = [n for repo, n in handed[:10] if repo == SMALL]
    # Equal weights: the small repository's five issues are all among the first ten hand-outs
    # (its half), not after the 200 of the big one.
    assert sorted(small) == [1, 2, 3, 4, 5], handed[:10]
    # Then the big one has the agents to itself.
    assert {repo for repo, _ in handed[10:]} == {BIG}


async def test_weights_set_the_shares_of_repositories_at_the_same_priority(
    deployment: Callable[..., Any],
) -> None:
    store, tasks = await deployment(
        [
            {"owner": "acme", "name": "big", "weight": 1},
            {"owner": "acme", "name": "small", "weight": 3},
        ]
    )
    await mirrored(store, BIG, list(range(1, 51)))
    await mirrored(store, SMALL, list(range(1, 51)))
    await start(store, tasks)
    handed = await rounds(tasks, agents=4, count=5)
    from_small = sum(1 for repo, _ in handed if repo == SMALL)
    assert len(handed) == 20
    assert from_small == 15, handed  # three for every one of the weight-1 repository


async def test_fair_share_never_crosses_priorities(deployment: Callable[..., Any]) -> None:
    store, tasks = await deployment([BIG, SMALL])
    await mirrored(store, BIG, list(range(1, 41)), priority="P1")
    await mirrored(store, SMALL, list(range(1, 9)), priority="P0")
    await start(store, tasks)
    handed = await rounds(tasks, agents=4, count=3)
    # The urgent repository's work goes first, whatever share the other repository has had.
    assert [repo for repo, _ in handed[:8]] == [SMALL] * 8, handed
    assert {repo for repo, _ in handed[8:]} == {BIG}


async def test_explain_names_the_share_and_takes_the_same_turn_as_the_claim(
    deployment: Callable[..., Any],
) -> None:
    store, tasks = await deployment([BIG, SMALL])
    await mirrored(store, BIG, list(range(1, 21)))
    await mirrored(store, SMALL, list(range(1, 21)))
    await start(store, tasks)
    order = []
    for i in range(6):
        verdicts = await explain(store, store.settings, agent_id=f"b{i}", share=tasks.walk.share)
        (predicted,) = [
            (repo, v.issue) for repo, rows in verdicts.items() for v in rows if v.verdict == "next"
        ]
        nxt = next(v for v in verdicts[predicted[0]] if v.verdict == "next")
        assert "fair share: weight 1 of 2 among the 2 repositories with P1 work: 50%" in (
            nxt.detail
        )
        task = await tasks.request_task(f"b{i}")
        assert task is not None and (task.repository, task.issue_id) == predicted
        order.append(task.repository)
    # The repositories took turns, and explain followed them.
    assert order == [BIG, SMALL] * 3


def test_a_weight_below_one_is_refused_at_start_naming_the_field(
    make_settings: Callable[..., Settings],
) -> None:
    with pytest.raises(ConfigError) as e:
        make_settings(repositories=[{"owner": "acme", "name": "big", "weight": 0}])
    assert "weight" in str(e.value)
