"""One issue's whole life: development, PR, review, requested changes, fix, review-done."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.models import TaskType
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.world import ONE_ISSUE, World, running_world, simulated

#: Wide enough that a tick on a loaded machine does not outlast the delay (1 s once did).
REVIEW_DELAY_S = 2.0
#: PR age for review-done: after the fix round, which follows the delay.
REVIEW_TIMEOUT_S = 5.0

pytestmark = pytest.mark.anyio


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(
        sim,
        lua_redis_url,
        make_settings,
        review={"delay_s": REVIEW_DELAY_S, "timeout_s": REVIEW_TIMEOUT_S, "fix_debounce_s": 0.5},
    ) as w:
        yield w


async def test_issue_walks_development_review_fix_review_done(world: World, sim: Simulator) -> None:
    await world.tick()

    # Development: claimed, labelled, branch created.
    dev = await world.ask("dev-1")
    assert dev is not None and dev.task_type == TaskType.DEVELOPMENT and dev.issue_id == 1
    await world.tick()
    assert world.labels(1) >= {"in-progress", "dev-1"}
    assert "feature/issue-1" in sim.state.branches("acme", "widgets")

    # The agent opens its PR and asks again: the development task is completed.
    pr_made = time.monotonic()
    pr = sim.state.create_pull(
        "acme",
        "widgets",
        title="CSV export",
        head="feature/issue-1",
        body="Closes #1",
        user="broker-bot",
    )
    sim.state.add_issue_comment(
        "acme", "widgets", pr["number"], user="alice", body="Please keep the column order stable."
    )
    assert await world.ask("dev-1") is None
    await world.tick()
    assert "needs-review" in world.labels(1)
    assert not world.labels(1) & {"in-progress", "dev-1"}
    detected = await world.store.client.get(world.rstore.keys.review_detected(1))
    assert detected is not None and detected.decode().endswith("Z")
    assert (
        json.loads(await world.store.client.get(world.rstore.keys.task_candidate(1, "dev-1")))[
            "status"
        ]
        == "needs_review"
    )

    # Before the review delay nothing is handed out; after it, a review task.
    assert await world.ask("rev-1") is None
    await asyncio.sleep(REVIEW_DELAY_S + 0.1)
    await world.tick()
    assert await world.ask("dev-1") is None  # the author waits while others could review
    review = await world.ask("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW
    assert review.pr_url and review.pr_url.endswith(f"/pull/{pr['number']}")
    assert [c.body for c in review.review_comments] == ["Please keep the column order stable."]
    assert "column order" in review.prompt and pr["html_url"] in review.prompt
    assert await world.ask("rev-1") is None  # completes the review
    await world.tick()
    assert await world.ask("rev-2") is None  # a finished review is not handed out again

    # A maintainer requests changes; a bot's noise is ignored.
    sim.state.add_review(
        "acme",
        "widgets",
        pr["number"],
        user="alice",
        state="CHANGES_REQUESTED",
        body="Add a test for empty exports.",
    )
    sim.state.add_review_comment(
        "acme",
        "widgets",
        pr["number"],
        user="alice",
        body="Name this export_csv.",
        path="export.py",
        line=3,
    )
    sim.state.add_issue_comment(
        "acme", "widgets", pr["number"], user="ci[bot]", body="Build passed"
    )
    await world.tick()
    await asyncio.sleep(0.6)  # comments settle
    await world.tick()
    fix = await world.ask("fix-1")
    assert fix is not None and fix.task_type == TaskType.FIX and fix.issue_id == 1
    assert sorted(c.body for c in fix.review_comments) == [
        "Add a test for empty exports.",
        "Name this export_csv.",
    ]
    stored = json.loads(await world.store.client.get(world.rstore.keys.fix_task(pr["number"])))
    assert stored["round"] == 1 and len(stored["comment_ids"]) == 2
    assert await world.ask("fix-1") is None  # completes the fix
    await world.tick()
    await asyncio.sleep(0.6)
    await world.tick()
    assert await world.ask("fix-2") is None  # the same feedback never makes a second fix

    # The PR is older than the review timeout: review-done, once.
    await asyncio.sleep(max(0.0, pr_made + REVIEW_TIMEOUT_S + 0.1 - time.monotonic()))
    await world.tick()
    pr_labels = set(sim.state.issue_labels("acme", "widgets", pr["number"]))
    assert "review-done" in pr_labels
    sim.state.remove_label("acme", "widgets", pr["number"], "review-done")
    await world.tick()
    assert "review-done" not in sim.state.issue_labels("acme", "widgets", pr["number"])
    assert "needs-review" in world.labels(1) and "needs-human" not in world.labels(1)


@pytest.fixture
async def strict_world(
    sim: Simulator, lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(
        sim,
        lua_redis_url,
        make_settings,
        review={"delay_s": 0, "timeout_s": 3600, "fix_debounce_s": 0, "max_fix_rounds": 1},
    ) as w:
        yield w


async def test_feedback_after_the_last_fix_round_asks_for_a_human(
    strict_world: World, sim: Simulator
) -> None:
    world = strict_world
    await world.tick()
    assert await world.ask("dev-1") is not None
    pr = sim.state.create_pull("acme", "widgets", title="x", head="feature/issue-1", body="")
    assert await world.ask("dev-1") is None
    await world.tick()
    await world.tick()
    assert (await world.ask("rev-1")) is not None and await world.ask("rev-1") is None
    sim.state.add_review(
        "acme", "widgets", pr["number"], user="alice", state="CHANGES_REQUESTED", body="Round one."
    )
    await world.tick()
    fix = await world.ask("fix-1")
    assert fix is not None and fix.task_type == TaskType.FIX
    assert await world.ask("fix-1") is None
    sim.state.add_review(
        "acme", "widgets", pr["number"], user="alice", state="CHANGES_REQUESTED", body="Round two."
    )
    await world.tick()
    await world.tick()
    assert await world.ask("fix-2") is None
    assert "needs-human" in world.labels(1)
