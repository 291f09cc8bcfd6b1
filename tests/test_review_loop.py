"""The review and fix loop as GitHub behaves: fresh feedback, needs-human, authors, waits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import requests

from github_broker.leader import reviews
from github_broker.models import Outcome, ReviewComment, TaskType
from github_broker.reports import status
from github_broker.reports.explain import explain_repo
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
    sim: Simulator, lua_redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    """On redis-server, fakeredis and a cluster: task_put.lua and sync_upsert.lua run alike."""
    async with running_world(sim, lua_redis_url, make_settings, review=REVIEW) as w:
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
            verdicts = {v.issue: v for v in await explain_repo(world.rstore, world.settings, [])}
            assert verdicts[1].detail.startswith("waiting_delay: review waits until ")
            assert verdicts[2].detail.startswith("no_linked_pr: needs-review but no open PR")
            assert verdicts[1].url.endswith("/acme/widgets/issues/1")
            assert len(verdicts) == 2


async def test_explain_lists_an_issue_with_a_review_and_a_fix_once(
    world: World, sim: Simulator
) -> None:
    pr = await developed(world, sim)
    comment = ReviewComment(id=1, kind="direct", author="alice", body="Handle empty input.")
    await reviews.post_fix(
        world.rstore,
        world.tasks.rules,
        issue_number=1,
        pr=pr,
        pr_url="",
        branch=None,
        comments=[comment],
    )
    verdicts = await explain_repo(world.rstore, world.settings, [])
    assert [(v.issue, v.verdict) for v in verdicts] == [(1, "next")]
    assert verdicts[0].detail == "fix task you would get now"


async def test_explain_names_the_issue_a_queued_one_waits_behind(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues: list[dict[str, Any]] = [
        {"number": n, "title": "t", "body": body(), "labels": ["P1", ROLE]} for n in (1, 2)
    ]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()
            verdicts = await explain_repo(world.rstore, world.settings, [])
    assert [(v.issue, v.verdict) for v in verdicts] == [(1, "next"), (2, "queued")]
    assert [b.issue for b in verdicts[1].blocking] == [1]
    assert verdicts[1].blocking[0].url.endswith("/acme/widgets/issues/1")


@pytest.mark.parametrize("counts", [False, True])
async def test_issue_skipped_for_its_body_does_not_pin_the_bucket(
    lua_redis_url: str, make_settings: Callable[..., Settings], counts: bool
) -> None:
    issues: list[dict[str, Any]] = [
        {"number": 1, "title": "no branch", "body": "## Deliverables\n- x\n", "labels": ["P1"]},
        {"number": 2, "title": "fine", "body": body(), "labels": ["P2", "BACKENDCODER"]},
    ]
    issues[0]["labels"].append("BACKENDCODER")
    with simulated(issues) as sim:
        async with running_world(
            sim, lua_redis_url, make_settings, bucket_counts_unassignable=counts
        ) as world:
            await world.tick()
            verdicts = {v.issue: v for v in await explain_repo(world.rstore, world.settings, [])}
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


# --- the whole loop, two agents --------------------------------------------------------------

TOKENS = {"t-broker": "broker-bot", "t-alice": "alice", "t-dev": "dev-bot", "t-rev": "rev-bot"}


def gh(sim: Simulator, token: str, verb: str, path: str, payload: dict[str, Any]) -> Any:
    """An agent or a maintainer acting on GitHub over HTTP with its own token."""
    answer = requests.request(
        verb,
        f"{sim.base_url}/repos/acme/widgets{path}",
        json=payload,
        headers={"Authorization": f"token {token}", "User-Agent": "lifecycle-test"},
        timeout=5,
    )
    assert answer.status_code < 300, answer.text
    return answer.json()


async def steps(world: World) -> list[tuple[int, str]]:
    repos = (await status.status(world.store, world.settings))["repositories"]
    return [(r["issue"], r["step"]) for r in repos[0]["waiting_reviews"]]


@pytest.mark.slow
async def test_two_agents_take_an_issue_through_review_fix_and_review_done(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "issues": ONE_ISSUE}]}
    review = {"delay_s": 1.5, "timeout_s": 6, "fix_debounce_s": 0}
    with Simulator(seed, tokens=TOKENS) as sim:
        github = {"token": "t-broker"}
        async with running_world(sim, redis_url, make_settings, review=review, github=github) as w:
            # Development by agent A, who opens the PR and says so on it.
            await w.tick()
            dev = await w.ask("agent-a")
            assert dev is not None and dev.task_type == TaskType.DEVELOPMENT
            pr = gh(sim, "t-dev", "POST", "/pulls", {
                "title": "CSV export", "head": "feature/issue-1", "base": "main",
                "body": "Closes #1",
            })["number"]  # fmt: skip
            gh(sim, "t-dev", "POST", f"/issues/{pr}/comments", {"body": "Done, please review."})
            assert await w.ask("agent-a") is None  # reports the development work done
            await w.tick()
            await w.tick()
            assert await steps(w) == [(1, "waiting_delay")]
            # A maintainer comments while the review waits out its delay ...
            gh(sim, "t-alice", "POST", f"/issues/{pr}/comments", {"body": "Handle empty input."})
            await asyncio.sleep(1.6)
            await w.tick()
            assert await steps(w) == [(1, "review_ready")]
            # ... and once more after it was queued: the reviewer gets both.
            gh(sim, "t-alice", "POST", f"/issues/{pr}/comments", {"body": "Update the docs."})
            await w.tick()
            assert await w.ask("agent-a") is None  # wrote the code: not its review while B can
            rev = await w.ask("agent-b")
            assert rev is not None and rev.task_type == TaskType.REVIEW
            asked = ["Handle empty input.", "Update the docs."]
            assert [c.body for c in rev.review_comments] == asked
            assert await steps(w) == [(1, "review_held")]
            # Agent B reviews under the broker's login: its own words are no feedback.
            gh(sim, "t-broker", "POST", f"/pulls/{pr}/reviews", {
                "body": "Checked against the issue; docs missing.", "event": "COMMENT",
            })  # fmt: skip
            assert await w.ask("agent-b") is None  # reports the review done
            await w.tick()
            await w.tick()
            assert await steps(w) == [(1, "awaiting_feedback")]
            # The maintainer requests changes: one fix round.
            gh(sim, "t-alice", "POST", f"/pulls/{pr}/reviews", {
                "body": "Rename the --csv flag.", "event": "REQUEST_CHANGES",
            })  # fmt: skip
            await w.tick()
            assert await steps(w) == [(1, "fix_ready")]
            fix = await w.ask("agent-a")
            assert fix is not None and fix.task_type == TaskType.FIX
            assert [c.body for c in fix.review_comments] == ["Rename the --csv flag."]
            assert await steps(w) == [(1, "fix_held")]
            gh(sim, "t-dev", "POST", f"/issues/{pr}/comments", {"body": "Renamed, pushed."})
            assert await w.ask("agent-a") is None  # reports the fix done
            await w.tick()
            await w.tick()
            gh(sim, "t-alice", "POST", f"/pulls/{pr}/reviews", {"event": "APPROVE"})
            await w.tick()
            assert await steps(w) == [(1, "awaiting_feedback")]
            assert await w.ask("agent-b") is None and await w.ask("agent-a") is None
            _, state = (await w.rstore.review_states([1]))[1]
            assert state["fix_rounds"] == "1"
            # The reviewing window closes: review-done on the PR.
            await asyncio.sleep(max(0.0, 6.2 - (time.time() - created_s(sim, pr))))
            await w.tick()
            assert "review-done" in set(sim.state.issue_labels("acme", "widgets", pr))
            assert "needs-human" not in w.labels(1)


def created_s(sim: Simulator, pr: int) -> float:
    created = sim.state.get_pull("acme", "widgets", pr)["created_at"]
    return datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()


async def test_review_pass_that_stalled_does_not_hand_out_handled_feedback_again(
    world: World, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review upkeep is not fenced. A pass that read the review state, then stalled (a slow
    GitHub call, a SIGSTOP'd leader) while another pass queued a fix round for the same
    comment and an agent completed it, put that comment out as a second fix round."""
    pr = await developed(world, sim)
    review = await world.ask("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW
    await world.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
    await world.tick()
    sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="Cover empty files.")
    # The stalled pass: it has read the state (no fix pending, nothing handled) and waits in
    # its GitHub call for the feedback.
    stalled = reviews.ReviewKeeper(
        world.settings, world.store, world.gateway, world.daemon.syncer.reindex
    )
    entered, resume = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    read_feedback = stalled._feedback

    def slow_feedback(*args: Any) -> list[reviews.Feedback]:
        loop.call_soon_threadsafe(entered.set)
        asyncio.run_coroutine_threadsafe(resume.wait(), loop).result(timeout=10)
        return read_feedback(*args)

    monkeypatch.setattr(stalled, "_feedback", slow_feedback)
    late = asyncio.create_task(stalled.run(world.settings.repositories[0]))
    await asyncio.wait_for(entered.wait(), 10)
    # Meanwhile the live pass queues the fix round, and an agent does it.
    await world.tick()
    fix = await world.ask("fix-1")
    assert fix is not None and fix.task_type == TaskType.FIX
    await world.tasks.finish(REPO, 1, "fix-1", fix.lease.token, Outcome.COMPLETED)
    resume.set()
    report = await asyncio.wait_for(late, 10)
    assert report.fixes_offered == 0
    assert await world.ask("fix-2") is None
    _, state = (await world.rstore.review_states([1]))[1]
    assert state["fix_rounds"] == "1"
