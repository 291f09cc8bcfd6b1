"""GitHub traffic per task: label changes in one GraphQL request, no call for a wish undone
before it was written, a small intent, paced writes and the write queue's lag."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import requests

from github_broker.claim.rules import Rules
from github_broker.gateway.pacing import TokenBucket, WritePacer
from github_broker.leader.sync import index_item
from github_broker.metrics import Metrics
from github_broker.models import Claimed, Outcome
from github_broker.reports.status import status
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import RepoStore, Store
from tests.factories import body, issue
from tests.world import REPO, World, running_world

pytestmark = pytest.mark.anyio
#: The broker's own labels exist once `github-broker labels init` ran.
BROKER_LABELS = ["in-progress", "needs-review"]


def issues(count: int) -> list[dict[str, Any]]:
    return [
        {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in range(1, count + 1)
    ]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    repo = {"owner": "acme", "name": "widgets", "labels": BROKER_LABELS, "issues": issues(6)}
    with Simulator({"repositories": [repo]}) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    # Agents here abandon one issue over and over: keep the failure budget out of the count.
    async with running_world(sim, redis_url, make_settings, failures={"max_failures": 100}) as w:
        await w.daemon.hold_leadership()
        yield w


async def drain(world: World) -> None:
    await world.daemon.drainer.drain(world.settings.repositories[0])


async def lifecycle(world: World, agent: str) -> int:
    """Claim, let the writes land, complete, let them land; returns the issue number."""
    task = await world.ask(agent)
    assert task is not None
    await drain(world)
    assert world.labels(task.issue_id) >= {"in-progress", agent}
    assert task.lease is not None
    await world.tasks.finish(REPO, task.issue_id, agent, task.lease.token, Outcome.COMPLETED)
    await drain(world)
    return task.issue_id


async def test_lifecycle_costs_three_counted_calls_and_no_404(world: World, sim: Simulator) -> None:
    await world.tick()
    await lifecycle(world, "dev-1")  # once per process: the label list, the base ref
    sim.stats.reset()

    n = await lifecycle(world, "dev-2")  # a new agent: its label does not exist yet

    stats = sim.stats.snapshot()
    assert stats["rate_limited_cost"] <= 3, stats
    assert stats["by_status"].get("404", 0) == 0, stats
    assert "DELETE" not in stats["by_method"], stats
    assert stats["by_route"].get("POST /graphql") == 1, stats
    assert world.labels(n) == {"P1", "BACKENDCODER", "needs-review"}
    assert "feature/issue-2" in sim.state.branches("acme", "widgets")

    sim.stats.reset()
    n = await lifecycle(world, "dev-1")  # a known agent
    stats = sim.stats.snapshot()
    assert stats["rate_limited_cost"] <= 3 and stats["by_route"]["POST /graphql"] == 1, stats
    assert world.labels(n) == {"P1", "BACKENDCODER", "needs-review"}


async def test_claim_released_before_the_drain_makes_no_label_call(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    sim.stats.reset()
    for i in range(5):
        task = await world.ask(f"bot-{i}")
        assert task is not None and task.lease is not None
        await world.tasks.finish(
            REPO, task.issue_id, f"bot-{i}", task.lease.token, Outcome.ABANDONED
        )
    await drain(world)
    # No label call, and no branch for leases that ended before it was made.
    assert sim.stats.snapshot()["total"] == 0, sim.stats.snapshot()
    assert await world.rstore.intent(1) is None
    assert not world.labels(1) & {"in-progress", "bot-0"}


async def test_graphql_label_mutation_refuses_bad_ids_like_github(sim: Simulator) -> None:
    auth = {"Authorization": "token t"}
    node = requests.get(f"{sim.base_url}/repos/acme/widgets/issues/1", headers=auth).json()
    labels = {
        lab["name"]: lab["node_id"]
        for lab in requests.get(f"{sim.base_url}/repos/acme/widgets/labels", headers=auth).json()
    }
    document = (
        "mutation($id: ID!, $add: [ID!]!, $remove: [ID!]!) {"
        " add: addLabelsToLabelable(input: {labelableId: $id, labelIds: $add}) {clientMutationId}"
        " remove: removeLabelsFromLabelable(input: {labelableId: $id, labelIds: $remove})"
        " {clientMutationId} }"
    )

    def post(variables: dict[str, Any], query: str = document, **kw: Any) -> requests.Response:
        return requests.post(
            f"{sim.base_url}/graphql", json={"query": query, "variables": variables}, **kw
        )

    core_before = requests.get(f"{sim.base_url}/rate_limit", headers=auth).json()
    ok = post(
        {"id": node["node_id"], "add": [labels["in-progress"]], "remove": [labels["needs-review"]]},
        headers=auth,
    )
    assert ok.status_code == 200 and ok.json() == {
        "data": {"add": {"clientMutationId": None}, "remove": {"clientMutationId": None}}
    }
    assert ok.headers["X-RateLimit-Resource"] == "graphql"
    assert sim.state.issue_labels("acme", "widgets", 1) == ["P1", "BACKENDCODER", "in-progress"]
    core_after = requests.get(f"{sim.base_url}/rate_limit", headers=auth).json()
    assert core_after["resources"]["core"]["used"] == core_before["resources"]["core"]["used"]
    graphql_used = core_after["resources"]["graphql"]["used"]
    assert graphql_used == core_before["resources"]["graphql"]["used"] + 1

    typed = post(
        {"id": node["node_id"], "add": [labels["P1"]]},
        query="mutation($id: ID!, $add: [ID!]!) { addLabelsToLabelable(input: "
        "{labelableId: $id, labelIds: $add}) { labelable { __typename } } }",
        headers=auth,
    ).json()
    assert typed == {"data": {"addLabelsToLabelable": {"labelable": {"__typename": "Issue"}}}}

    bad_issue = post({"id": "I_nope", "add": [labels["P1"]], "remove": []}, headers=auth).json()
    assert bad_issue["data"] == {"add": None, "remove": None}
    assert bad_issue["errors"][0]["type"] == "NOT_FOUND"
    assert "'I_nope'" in bad_issue["errors"][0]["message"]

    bad_label = post(
        {"id": node["node_id"], "add": ["LA_0"], "remove": [labels["in-progress"]]}, headers=auth
    ).json()
    # Mutation fields run one by one: the bad one is null, the next one still runs.
    assert bad_label["data"] == {"add": None, "remove": {"clientMutationId": None}}
    assert [e["type"] for e in bad_label["errors"]] == ["NOT_FOUND"]
    assert "in-progress" not in sim.state.issue_labels("acme", "widgets", 1)

    unknown = post(
        {},
        query='mutation { addLabelz(input: {labelableId: "x"}) { clientMutationId } }',
        headers=auth,
    ).json()
    assert "data" not in unknown and "addLabelz" in unknown["errors"][0]["message"]
    missing = post({"id": node["node_id"]}, headers=auth).json()
    assert "data" not in missing and "labelIds" in missing["errors"][0]["message"]
    assert post({}, headers={}).status_code == 401


async def test_intent_stays_small_over_100_claims_by_different_agents(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    # 100 abandons of one issue: keep the failure budget out of the count.
    settings = make_settings(redis={"url": lua_redis_url}, failures={"max_failures": 1000})
    store = Store.from_settings(settings)
    try:
        rstore = store.repo(REPO)
        await rstore.upsert_issues(
            [index_item(Rules(store.settings), issue(1, "P0", "BACKENDCODER"), "main")]
        )
        await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
        sizes = []
        for i in range(100):
            got = await rstore.claim(
                f"agent-{i}", previous="completed", mode="strict", base_branch="main", roles=None
            )
            assert isinstance(got, Claimed)
            if i % 3 == 0:  # now and then the drain writes the labels out before the release
                for job, payload, _ in await rstore.outbox_take(10, 60_000):
                    await rstore.outbox_done(job, payload)
            assert await rstore.finish(1, f"agent-{i}", got.token, "abandoned") == (
                True,
                "abandoned",
            )
            raw = await store.client.hget(rstore.keys.intent, "1")
            sizes.append(len(raw or b""))
        assert max(sizes) < 200, sizes
        assert await store.client.zcard(rstore.keys.outbox) <= 2  # labels:1, branch:1
        # What is left to write names only the last agent whose label went out.
        intent = await rstore.intent(1)
        assert intent is not None and intent["remove"] == ["agent-99", "in-progress"]
    finally:
        await store.close()


async def test_write_lag_is_the_oldest_due_wish_and_shows_in_status_and_metrics(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    store = Store.from_settings(make_settings(redis={"url": redis_url}))
    try:
        rstore: RepoStore = store.repo(REPO)
        assert await rstore.outbox_lag_s() == 0.0
        await rstore.want_labels(5, ["review-done"], [])
        await asyncio.sleep(0.3)
        await rstore.want_labels(5, ["P2"], [])  # merges into the same job, keeps its age
        lag = await rstore.outbox_lag_s()
        assert 0.25 <= lag < 30
        repo = (await status(store, store.settings))["repositories"][0]
        assert repo["github_write_lag_s"] >= 0.25 and repo["pending_github_writes"] == 1
        text = await Metrics().render(store)
        assert f'gb_github_write_queue_lag_seconds{{repository="{REPO}"}}' in text
        for job, payload, _ in await rstore.outbox_take(10, 60_000):
            await rstore.outbox_done(job, payload)
        assert await rstore.outbox_lag_s() == 0.0
    finally:
        await store.close()


def test_token_bucket_allows_a_burst_then_paces() -> None:
    now = [100.0]
    bucket = TokenBucket(2.0, 3, clock=lambda: now[0])

    def sleep(s: float) -> None:
        now[0] += s

    assert [bucket.take(sleep) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.wait_s() == pytest.approx(0.5, abs=1e-3)
    assert bucket.take(sleep) == pytest.approx(0.5, abs=1e-3)
    bucket.pause_until(now[0] + 10)
    assert bucket.wait_s() == pytest.approx(10, abs=1e-3)

    hourly = TokenBucket(500 / 3600, 500, clock=lambda: now[0])
    pacer = WritePacer(TokenBucket(80 / 60, 10, clock=lambda: now[0]), hourly)
    started = now[0]
    for _ in range(1000):
        pacer.take(sleep)
    # 80 a minute until the hour's 500 are spent, then one per 7.2 s: 1000 take an hour.
    assert now[0] - started == pytest.approx(3600, rel=0.02)
    assert pacer.wait_s() == pytest.approx(3600 / 500, rel=0.05)


@pytest.mark.slow
async def test_writes_are_paced_and_a_secondary_limit_pauses_the_queue(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with running_world(
        sim, redis_url, make_settings, github={"seconds_between_writes": 0.25, "write_burst": 2}
    ) as world:
        await world.daemon.hold_leadership()
        await world.tick()
        for i in range(4):
            assert await world.ask(f"bot-{i}") is not None  # 4 label + 4 branch writes
        started = time.monotonic()
        await drain(world)
        elapsed = time.monotonic() - started
        assert await world.rstore.outbox_size() == 0
        # 2 at once, then one every 0.25 s: 8 writes take at least 6 * 0.25 s.
        assert elapsed >= 1.4, elapsed

        sim.faults.add_secondary_rate_limit(count=1, retry_after=2, method="POST")
        await world.ask("bot-9")
        sim.stats.reset()
        report = await world.daemon.drainer.drain(world.settings.repositories[0])
        assert report.paused_until_s > time.time() + 1
        refused = sim.stats.snapshot()
        assert refused["by_method"].get("POST") == 1 and refused["by_status"].get("403") == 1
        assert await world.rstore.outbox_size() == 2
        await drain(world)  # still paused: nothing goes out before Retry-After
        assert sim.stats.snapshot()["total"] == refused["total"]
        await asyncio.sleep(2.2)
        await drain(world)
        assert await world.rstore.outbox_size() == 0
        assert "bot-9" in world.labels(5)
