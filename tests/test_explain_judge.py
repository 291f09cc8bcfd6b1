"""`explain` is the claim's own judgement: its `next` is exactly what the next request-task of
that agent hands out, for any agent history, and every other issue names why it waits."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import pytest
import redis as sync_redis

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.rules import Rules
from github_broker.claim.service import TaskService
from github_broker.claim.walk import FRESH_AGENT
from github_broker.errors import AgentPaused
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, Outcome
from github_broker.reports.explain import explain
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store
from github_broker.store.graph import GraphUpdate
from tests.factories import issue

pytestmark = pytest.mark.anyio
REPOS = ["acme/widgets", "acme/gadgets"]
ROLES = ["BACKENDCODER", "FRONTENDCODER"]


@pytest.fixture
async def store(redis_url: str, make_settings: Callable[..., Settings]) -> AsyncIterator[Store]:
    settings = make_settings(
        redis={"url": redis_url},
        repositories=REPOS,
        leases={"settle_grace_s": 0},
        failures={"cooldown_s": 600, "max_failures": 1000, "breaker_streak": 0},
        review={"author_fallback_s": 600},
    )
    s = Store.from_settings(settings)
    yield s
    await s.close()


async def load(store: Store, name: str, issues: list[tuple[int, str, str]]) -> RepoStore:
    rstore = store.repo(name)
    rules = Rules(store.settings)
    await rstore.upsert_issues(
        [index_item(rules, issue(n, prio, role), "main") for n, prio, role in issues]
    )
    await rstore.save_sync_state({}, rebuilt=True)
    return rstore


async def random_links(rng: random.Random, rstore: RepoStore, numbers: list[int]) -> None:
    """Blockers on some issues (another issue here, or of elsewhere in any state), written
    as the leader writes them but left out of the indexes: the claim and explain judge them
    on their own (blocker_of)."""
    links: dict[int, list[str]] = {}
    states = {}
    for n in numbers:
        if rng.random() < 0.3:
            if numbers and rng.random() < 0.5:
                links[n] = [f"{rstore.repository}#{rng.choice(numbers)}"]
            else:
                ref = f"acme/elsewhere#{rng.randint(1, 5)}"
                links[n] = [ref]
                states[ref] = rng.choice(["open", "completed", "not_planned", "unserved"])
    await rstore.save_graph(GraphUpdate(links=links, states=states))


def the_next(verdicts: dict[str, list]) -> tuple[str, int] | None:
    found = [
        (repo, v.issue) for repo, rows in verdicts.items() for v in rows if v.verdict == "next"
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.fixture
def tasks(store: Store) -> TaskService:
    """The real request-task (as the API runs it, its index read from Redis on each request)."""
    return TaskService(store.settings, store, Prompts.load(None), ReadyWaker(1.0))


async def claim_next(
    tasks: TaskService, agent: str, roles: list[str] | None, repositories: list[str] | None
) -> tuple[str, int] | None:
    """What the real request-task hands out (TaskService.request_task: the agent's mutex, the
    settle pass, the claim's order of repositories from the index, the claim script); the
    task is given back at once (no budget spent), so that the next probe sees the same pool."""
    try:
        task = await tasks.request_task(agent, roles=roles, repositories=repositories)
    except AgentPaused:
        return None
    if task is None:
        return None
    await tasks.finish(
        task.repository, task.issue_id, agent, task.lease.token, Outcome.ABANDONED, counted=False
    )
    return task.repository, task.issue_id


async def test_explains_next_is_the_claims_pick_for_fresh_cooled_down_and_limited_agents(
    store: Store, tasks: TaskService
) -> None:
    w = await load(store, REPOS[0], [(n, "P1", ROLES[n % 2]) for n in range(1, 9)])
    await load(store, REPOS[1], [(n, "P1", ROLES[0]) for n in range(20, 24)])
    # a1 failed the first five tasks of acme/widgets: they are in its cool-down.
    for _ in range(5):
        got = await w.claim(
            "a1", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(got, Claimed)
        ok, _ = await w.finish(got.issue.number, "a1", got.token, "failed")
        assert ok
    cases = [
        (None, None, None),  # a fresh agent
        ("a1", None, None),  # cool-downs at the head of the queue
        ("a1", ["FRONTENDCODER"], None),
        ("a2", ["BACKENDCODER"], [REPOS[1]]),
    ]
    for agent, roles, repositories in cases:
        verdicts = await explain(
            store,
            store.settings,
            agent_id=agent,
            roles=roles,
            repositories=repositories,
            share=tasks.walk.share,  # the serving process's turns, as the API's explain
        )
        predicted = the_next(verdicts)
        if agent == "a1" and roles is None:
            cooled = {v.issue for v in verdicts[REPOS[0]] if v.verdict == "cooldown"}
            assert cooled == {1, 2, 3, 4, 5}, verdicts[REPOS[0]]
        assert predicted == await claim_next(tasks, agent or "fresh", roles, repositories), (
            agent,
            roles,
            repositories,
        )


async def test_explain_names_the_review_author_hold_and_a_paused_agent(store: Store) -> None:
    w = await load(store, REPOS[0], [(1, "P1", ROLES[0])])
    rstore = store.repo(REPOS[0])
    # a1 did the development work of #1; its review is now in the pool.
    await rstore.client.sadd(rstore.keys.reviewing, "1")
    assert await rstore.put_task(
        "review:1", score=0, role=ROLES[0], pr=5, author="a1", branch="b", payload={}
    )
    mine = await explain(store, store.settings, agent_id="a1", repositories=[REPOS[0]])
    rows = {v.verdict for v in mine[REPOS[0]]}
    assert "review_author" in rows and the_next(mine) is None
    other = await explain(store, store.settings, agent_id="a2", repositories=[REPOS[0]])
    assert the_next(other) == (REPOS[0], 1)
    await store.pause_agent("a2", "4:alice", "too many tokens")
    paused = await explain(store, store.settings, agent_id="a2", repositories=[REPOS[0]])
    assert the_next(paused) is None
    assert any(
        v.verdict == "paused" and "alice: too many tokens" in v.detail for v in paused[REPOS[0]]
    )
    del w


async def test_explain_runs_read_only_under_eval_ro(store: Store, redis_url: str) -> None:
    """explain.lua writes nothing: Redis runs it with EVALSHA_RO, which refuses any write."""
    await load(store, REPOS[0], [(n, "P1", ROLES[0]) for n in range(1, 4)])
    rstore = store.repo(REPOS[0])
    script = rstore.scripts.repo["explain"]
    text = script.script
    client = sync_redis.Redis.from_url(redis_url)
    try:
        keys = [k.decode() for k in rstore._fixed]
        res = client.eval_ro(text, len(keys), *keys, REPOS[0], FRESH_AGENT, "strict", 16, 50)
    finally:
        client.close()
    assert res[5] == b"development:1"


async def test_explain_and_the_claim_never_disagree_over_random_backlogs_and_histories(
    store: Store, tasks: TaskService
) -> None:
    """explain's `next` against the real request-task's pick, on the same random backlogs,
    blockers and agent histories (built by request-task too: held tasks, failures in
    cool-down, completions, paused agents)."""
    rng = random.Random(26)
    seen = {"a task": 0, "none": 0, "across both": 0}
    for _ in range(60):
        await store.client.flushall()
        for name in REPOS:
            issues = [
                (n, rng.choice(["P0", "P1", "P2"]), rng.choice(ROLES))
                for n in rng.sample(range(1, 60), rng.randint(0, 12))
            ]
            rstore = await load(store, name, issues)
            await random_links(rng, rstore, [n for n, *_ in issues])
        agents = [f"a{i}" for i in range(4)]
        await random_history(rng, tasks, agents)
        if rng.random() < 0.3:
            await store.pause_agent(rng.choice(agents), "4:t", "")
        agent = rng.choice(agents)
        roles = rng.choice([None, [ROLES[0]], [ROLES[1]], ROLES])
        repositories = rng.choice([None, None, [REPOS[0]], [REPOS[1]]])
        verdicts = await explain(
            store,
            store.settings,
            agent_id=agent,
            roles=roles,
            repositories=repositories,
            share=tasks.walk.share,  # the serving process's turns, as the API's explain
        )
        predicted = the_next(verdicts)
        actual = await claim_next(tasks, agent, roles, repositories)
        assert predicted == actual, (agent, roles, repositories, verdicts)
        seen["none" if actual is None else "a task"] += 1
        seen["across both"] += actual is not None and repositories is None
    # Both answers came up often enough for the comparison to mean something, and so did a
    # pick across both repositories (the claim's order of repositories).
    assert min(seen.values()) >= 10, seen


async def random_history(rng: random.Random, tasks: TaskService, agents: list[str]) -> None:
    """Claims by request-task, some ended at once (failed: a cool-down; completed;
    abandoned), the others held."""
    for _ in range(rng.randint(0, 15)):
        agent = rng.choice(agents)
        task = await tasks.request_task(agent, repositories=[rng.choice(REPOS)])
        if task is not None and rng.random() < 0.6:
            outcome = rng.choice([Outcome.FAILED, Outcome.COMPLETED, Outcome.ABANDONED])
            await tasks.finish(task.repository, task.issue_id, agent, task.lease.token, outcome)
