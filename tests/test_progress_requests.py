"""Progress without webhooks: one pass reads every repository's held branches and pull
requests in one GitHub request, however many repositories hold tasks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import sync_client
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
