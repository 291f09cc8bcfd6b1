"""The review and fix loop as GitHub behaves: fresh feedback, needs-human, authors, waits."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from github_broker import status
from github_broker.models import Outcome, TaskType
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.factories import body
from tests.world import ONE_ISSUE, REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio
ROLE = "BACKENDCODER"
REVIEW = {"delay_s": 0, "timeout_s": 3600, "fix_debounce_s": 0}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(sim, redis_url, make_settings, review=REVIEW) as w:
        yield w


async def developed(world: World, sim: Simulator, *, pr_author: str = "dev-bot") -> int:
    """Issue 1 developed by dev-1, its PR opened by `pr_author`; returns the PR number."""
    await world.tick()
    dev = await world.ask("dev-1")
    assert dev is not None and dev.task_type == TaskType.DEVELOPMENT
    pr = sim.state.create_pull(
        "acme", "widgets", title="CSV export", head="feature/issue-1", body="", user=pr_author
    )
    await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
    await world.tick()
    await world.tick()
    return int(pr["number"])


async def test_feedback_posted_after_the_review_is_queued_reaches_the_reviewer(
    world: World, sim: Simulator
) -> None:
    pr = await developed(world, sim)
    assert await world.rstore.existing_tasks(["review:1"]) == {"review:1"}  # queued, empty
    sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="Cover empty files.")
    await world.tick()
    review = await world.ask("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW
    assert [c.body for c in review.review_comments] == ["Cover empty files."]
    await world.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
    await world.tick()
    assert await world.ask("fix-1") is None  # the reviewer had it: it is no fix round


async def test_needs_human_issue_is_not_handed_out_for_review(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issue = {**ONE_ISSUE[0], "labels": ["P1", "BACKENDCODER", "needs-review", "needs-human"]}
    with simulated([issue]) as sim:
        sim.state.create_pull(
            "acme", "widgets", title="x", head="other-branch", body="Closes #1", user="dev-bot"
        )
        async with running_world(sim, redis_url, make_settings, review=REVIEW) as world:
            await world.tick()
            await world.tick()
            assert await world.ask("rev-1") is None
            reviews = (await status.repo_status(world.rstore, world.settings)).waiting_reviews
            assert [(r.issue, r.step) for r in reviews] == [(1, "needs_human")]


async def test_review_queued_before_needs_human_is_not_handed_out(
    world: World, sim: Simulator
) -> None:
    await developed(world, sim)
    assert await world.rstore.existing_tasks(["review:1"]) == {"review:1"}
    sim.state.add_labels("acme", "widgets", 1, ["needs-human"])
    await world.tick()
    assert await world.ask("rev-1") is None


async def test_pr_authors_own_comments_do_not_start_a_fix_round(
    world: World, sim: Simulator
) -> None:
    pr = await developed(world, sim)
    review = await world.ask("rev-1")
    assert review is not None
    await world.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
    await world.tick()
    sim.state.add_issue_comment("acme", "widgets", pr, user="dev-bot", body="Done, ready.")
    sim.state.add_issue_comment("acme", "widgets", pr, user="broker-bot", body="Review done.")
    await world.tick()
    await world.tick()
    assert await world.ask("fix-1") is None
    _, state = (await world.rstore.review_states([1]))[1]
    assert state.get("fix_rounds", "0") == "0"
    assert "needs-human" not in world.labels(1)
    sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="Rename the flag.")
    await world.tick()
    fix = await world.ask("fix-1")
    assert fix is not None and [c.body for c in fix.review_comments] == ["Rename the flag."]


async def test_status_and_explain_tell_review_waits_apart(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues: list[dict[str, Any]] = [
        {"number": 1, "title": "a", "body": body(), "labels": ["P1", "BACKENDCODER"]},
        {"number": 2, "title": "b", "body": body(), "labels": ["P1", "BACKENDCODER"]},
    ]
    with simulated(issues) as sim:
        sim.state.add_labels("acme", "widgets", 1, ["needs-review"])
        sim.state.add_labels("acme", "widgets", 2, ["needs-review"])
        sim.state.create_pull(
            "acme", "widgets", title="a", head="feature/issue-1", body="", user="dev-bot"
        )
        review = {**REVIEW, "delay_s": 3600}
        async with running_world(sim, redis_url, make_settings, review=review) as world:
            await world.tick()
            await world.tick()
            waiting = (await status.repo_status(world.rstore, world.settings)).waiting_reviews
            by_issue = {r.issue: r for r in waiting}
            assert by_issue[1].step == "waiting_delay" and by_issue[1].pr is not None
            assert by_issue[1].due_at is not None and by_issue[1].pr_url.endswith("/pull/3")
            assert by_issue[2].step == "no_linked_pr" and by_issue[2].pr is None
            verdicts = {v.issue: v for v in await status.explain(world.rstore, world.settings, [])}
            assert verdicts[1].detail.startswith("waiting_delay: review waits until ")
            assert verdicts[2].detail.startswith("no_linked_pr: needs-review but no open PR")
            assert verdicts[1].url.endswith("/acme/widgets/issues/1")
            assert len(verdicts) == 2


@pytest.mark.parametrize("counts", [False, True])
async def test_issue_skipped_for_its_body_does_not_pin_the_bucket(
    redis_url: str, make_settings: Callable[..., Settings], counts: bool
) -> None:
    issues: list[dict[str, Any]] = [
        {"number": 1, "title": "no branch", "body": "## Deliverables\n- x\n", "labels": ["P1"]},
        {"number": 2, "title": "fine", "body": body(), "labels": ["P2", "BACKENDCODER"]},
    ]
    issues[0]["labels"].append("BACKENDCODER")
    with simulated(issues) as sim:
        async with running_world(
            sim, redis_url, make_settings, bucket_counts_unassignable=counts
        ) as world:
            await world.tick()
            verdicts = {v.issue: v for v in await status.explain(world.rstore, world.settings, [])}
            task = await world.ask("dev-1")
    if counts:
        assert task is None
        assert verdicts[2].verdict == "outside_bucket"
        assert [(b.issue, b.url.rsplit("/", 3)[-3:]) for b in verdicts[2].blocking] == [
            (1, ["widgets", "issues", "1"])
        ]
    else:
        assert task is not None and task.issue_id == 2
        assert verdicts[2].verdict == "next"
    assert verdicts[1].verdict == "skipped" and "no_branch" in verdicts[1].detail


async def test_rules_refuse_nested_branches_accept_any_deliverables_heading_name_roles(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues: list[dict[str, Any]] = [
        {"number": 1, "title": "a", "body": body("develop/next/x"), "labels": ["P1", ROLE]},
        {"number": 2, "title": "b", "body": body("develop"), "labels": ["P1", "BACKENDCODER"]},
        {"number": 3, "title": "c", "body": body(), "labels": ["P1", "FRONTENDWIZARD"]},
        {
            "number": 4,
            "title": "d",
            "body": "### Deliverables\n- x\n\nBranch: feature/four\n",
            "labels": ["P1", "BACKENDCODER"],
        },
    ]
    with simulated(issues) as sim:
        repo = {"owner": "acme", "name": "widgets", "base_branch": "develop/next"}
        async with running_world(sim, redis_url, make_settings, repositories=[repo]) as world:
            await world.tick()
            skipped = await world.rstore.skipped()
            task = await world.ask("dev-1")
    assert skipped[1].code == "bad_branch" and "under the base branch" in skipped[1].reason
    assert skipped[2].code == "bad_branch" and "lies under branch 'develop'" in skipped[2].reason
    assert skipped[3].code == "unknown_role" and "'FRONTENDWIZARD'" in skipped[3].reason
    assert 4 not in skipped
    assert task is not None and task.issue_id == 4


async def test_review_prompt_asks_for_a_review_not_a_fix(world: World, sim: Simulator) -> None:
    await developed(world, sim)
    review = await world.ask("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW
    assert "request" in review.prompt and "approve" in review.prompt
    assert "push" not in review.prompt
