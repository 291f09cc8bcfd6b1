"""Progress without webhooks: one pass reads every repository's held branches and pull
requests in one GitHub request, however many repositories hold tasks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import sync_client
from tests.waiting import wait_until
from tests.world import running_world

pytestmark = pytest.mark.anyio


def names(count: int) -> list[str]:
    """acme/widgets (tests/world.py's own) and `count - 1` more."""
    return ["acme/widgets"] + [f"acme/repo-{i:03d}" for i in range(1, count)]


def one_issue_each(count: int) -> Simulator:
    return Simulator(
        {
            "repositories": [
                {
                    "owner": full.split("/")[0],
                    "name": full.split("/")[1],
                    "issues": generate_issues(1, priorities=("P1",)),
                }
                for full in names(count)
            ]
        }
    )


async def progress_pass_requests(
    count: int, redis_url: str, make_settings: Callable[..., Settings]
) -> tuple[dict[str, Any], int]:
    """`count` repositories each holding one task whose branch has a PR opened after the
    claim: the GitHub requests of one progress pass, and how many tasks it saw progress on."""
    client = sync_client(redis_url)
    client.flushall()  # the other count's run used the same Redis
    client.close()
    with one_issue_each(count) as sim:
        async with running_world(
            sim, redis_url, make_settings, repositories=names(count), priority_mode="best_effort"
        ) as world:
            await world.tick()
            held = [await world.ask(f"agent-{i}") for i in range(count)]
            assert all(t is not None for t in held) and len({t.repository for t in held}) == count
            await world.tick()  # the branches are created
            for task in held:
                owner, name = task.repository.split("/")
                sim.state.create_pull(
                    owner, name, title="wip", head=task.branch_name, body="", user="bot"
                )
            sim.stats.reset()
            await world.daemon.progress_all()
            requests = sim.stats.snapshot()
            progressed = 0
            for task in held:
                lease = await world.store.repo(task.repository).lease(task.issue_id)
                assert lease is not None
                progressed += int(lease.progress.startswith("pull_request"))
    return requests, progressed


async def test_a_progress_pass_makes_as_many_github_requests_for_50_repositories_as_for_1(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    one, one_seen = await progress_pass_requests(1, redis_url, make_settings)
    fifty, fifty_seen = await progress_pass_requests(50, redis_url, make_settings)
    assert (one_seen, fifty_seen) == (1, 50)  # every held task's PR was seen
    assert fifty["total"] == one["total"] == 1, (one["by_route"], fifty["by_route"])
    assert fifty["by_route"] == one["by_route"] == {"POST /graphql": 1}


async def test_a_failed_graphql_read_falls_back_to_rest_for_that_pass_only(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """GitHub refuses the GraphQL read once: that pass reads the branch and the PR listing
    over REST and still sees the PR; the next due pass is one GraphQL request again."""
    with one_issue_each(1) as sim:
        async with running_world(
            sim, redis_url, make_settings, progress={"branch_check_interval_s": 0.01}
        ) as world:
            await world.tick()
            task = await world.ask("agent-0")
            assert task is not None
            await world.tick()
            sim.state.create_pull(
                "acme", "widgets", title="wip", head=task.branch_name, body="", user="bot"
            )
            sim.faults.add_error(422, method="POST", path=r"/graphql$", count=1)
            sim.stats.reset()
            await world.daemon.progress_all()
            read_at = time.monotonic()
            fallback = sim.stats.snapshot()["by_route"]
            lease = await world.rstore.lease(task.issue_id)
            assert lease is not None and lease.progress.startswith("pull_request")
            assert fallback == {
                "POST /graphql": 1,
                "GET /repos/{owner}/{repo}/git/ref/{ref}": 1,
                "GET /repos/{owner}/{repo}/pulls": 1,
            }
            sim.stats.reset()
            wait_until(lambda: time.monotonic() - read_at > 0.02, 1, "the branch interval")
            await world.daemon.progress_all()
            assert sim.stats.snapshot()["by_route"] == {"POST /graphql": 1}
