"""After the hand-out: work that waits on a person leaves the strict bucket, a development task
completed with no PR goes back to the pool, stalls are flagged from what GitHub shows, budgets
set a task aside for a person, and feedback a held review missed reaches its agent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from github_broker.models import Actor, Outcome, Task, TaskState, TaskType
from github_broker.reports.explain import explain_repo
from github_broker.settings import Settings
from github_broker.steering.actions import Steering
from tests.factories import body
from tests.test_webhooks import SECRET, Capture, deliver, hooked, list_calls
from tests.waiting import await_until
from tests.world import REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio
REVIEW = {"delay_s": 0, "timeout_s": 3600, "fix_debounce_s": 0}


def two_priorities() -> list[dict[str, Any]]:
    return [
        {"number": 1, "title": "urgent", "body": body(), "labels": ["P0", "BACKENDCODER"]},
        {"number": 2, "title": "next", "body": body(), "labels": ["P1", "BACKENDCODER"]},
    ]


async def reviewed(world: World, sim: Any) -> None:
    """Issue 1 developed (its PR opened) and reviewed: it now waits for a maintainer."""
    await world.tick()
    dev = await world.ask("dev-1")
    assert dev is not None and dev.issue_id == 1
    sim.state.create_pull("acme", "widgets", title="x", head="feature/issue-1", body="", user="bot")
    await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
    await world.tick()
    await world.tick()
    review = await world.tasks.request_task("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW and review.issue_id == 1
    await world.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
    await world.tick()


async def test_a_reviewed_issue_awaiting_merge_does_not_hold_lower_priorities(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(sim, redis_url, make_settings, review=REVIEW) as world:
            await reviewed(world, sim)
            verdicts = {v.issue: v for v in await explain_repo(world.rstore, world.settings, None)}
            assert verdicts[1].verdict == "waiting_on_person"
            assert "awaiting_feedback" in verdicts[1].detail
            assert verdicts[2].verdict == "next"
            task = await world.ask("dev-2")
            assert task is not None and task.issue_id == 2


async def test_with_bucket_holds_for_people_the_reviewed_issue_still_holds_the_bucket(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(
            sim, redis_url, make_settings, review=REVIEW, bucket_holds_for_people=True
        ) as world:
            await reviewed(world, sim)
            verdicts = {v.issue: v for v in await explain_repo(world.rstore, world.settings, None)}
            assert verdicts[2].verdict == "outside_bucket"
            assert await world.ask("dev-2") is None


async def test_new_feedback_after_the_review_brings_the_issue_back_into_the_bucket(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(sim, redis_url, make_settings, review=REVIEW) as world:
            await reviewed(world, sim)
            assert 1 in await world.rstore.waiting()
            sim.state.add_issue_comment("acme", "widgets", 3, user="alice", body="Rename it.")
            await world.tick()
            assert 1 not in await world.rstore.waiting()
            fix = await world.ask("fix-1")
            assert fix is not None and fix.task_type == TaskType.FIX and fix.issue_id == 1


async def test_a_development_task_completed_without_a_pr_goes_back_to_the_pool_and_counts(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(
            sim, redis_url, make_settings, review=REVIEW, progress={"no_pr_grace_s": 2.0}
        ) as world:
            await world.tick()
            dev = await world.ask("dev-1")
            assert dev is not None and dev.issue_id == 1
            await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
            # The grace outlasts one tick on a machine loaded by the whole suite (0.5 s did not).
            await world.tick()
            assert "needs-review" in world.labels(1)
            await asyncio.sleep(2.1)
            await world.tick()
            await world.tick()
            assert "needs-review" not in world.labels(1)
            failures = await world.rstore.client.hget(world.rstore.keys.task_failures, "1")
            assert failures is not None and int(failures) == 1
            again = await world.ask("dev-2")
            assert again is not None and again.issue_id == 1
            assert again.task_type == TaskType.DEVELOPMENT


async def test_a_merged_pr_never_sends_its_still_open_issue_back_to_development(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Between a PR's merge and its issue's close (or when the PR closes nothing), the PR is no
    longer open and its branch is in main: that is work done, not work missing. Before, the
    review upkeep took it for "no PR and no commit" and handed the issue out again."""
    with simulated(two_priorities()) as sim:
        async with running_world(
            sim, redis_url, make_settings, review=REVIEW, progress={"no_pr_grace_s": 0.0}
        ) as world:
            await reviewed(world, sim)
            (pull,), _ = sim.state.list_pulls("acme", "widgets", head="acme:feature/issue-1")
            sim.state.merge_pull("acme", "widgets", pull["number"], user="maintainer")
            for _ in range(3):
                await world.tick()
            handed = [await world.ask(f"dev-{i}") for i in (2, 3)]
            assert [(t.issue_id, t.task_type.value) for t in handed if t is not None] == [
                (2, "development")
            ], world.labels(1)
            assert "needs-review" in world.labels(1)


async def test_a_quiet_lease_is_flagged_stalled_once_with_evidence_and_clears_on_a_push(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    progress = {"stall_after_s": 1.5, "branch_check_interval_s": 0.2, "check_interval_s": 0.2}
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, progress=progress) as world:
            await world.tick()
            # Quiet since the claim: the stall is counted from it, not from the tick below.
            started = time.monotonic()
            task = await world.ask("quiet")
            assert task is not None
            await world.tick()  # the branch is created
            flagged_at = None
            while time.monotonic() - started < 4:
                await world.tasks.heartbeat(REPO, 1, "quiet", task.lease.token)
                await world.daemon.progress_all()
                lease = await world.rstore.lease(1)
                assert lease is not None
                if lease.stalled and flagged_at is None:
                    flagged_at = time.monotonic() - started
                await asyncio.sleep(0.2)
            # Within the stall time plus a check interval and the tick (0.8 s on a loaded machine).
            assert flagged_at is not None and 1.5 <= flagged_at <= 1.5 + 0.8, flagged_at
            lease = await world.rstore.lease(1)
            assert lease is not None and lease.state == TaskState.IDLE
            assert "no push, PR or review reply seen" in lease.stalled
            assert "heartbeats" in lease.stalled and "no progress note" in lease.stalled
            events = [e for e in await world.rstore.timeline(100) if e.kind == "stalled"]
            assert len(events) == 1  # once, not at every check
            sim.state.push("acme", "widgets", "feature/issue-1", message="Parse the header")
            await asyncio.sleep(0.25)
            await world.daemon.progress_all()
            lease = await world.rstore.lease(1)
            assert lease is not None and not lease.stalled and lease.progress.startswith("push")
            beat = await world.tasks.heartbeat(REPO, 1, "quiet", task.lease.token)
            assert beat.state == TaskState.IN_PROGRESS


async def test_an_agent_that_pushes_every_so_often_is_never_flagged(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Scaled down: stall after 1.5 s, a push every 0.5 s for 6 s (as pushes every few minutes
    for two hours against a 30-minute stall time)."""
    issues = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    progress = {"stall_after_s": 1.5, "branch_check_interval_s": 0.1, "check_interval_s": 0.1}
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, progress=progress) as world:
            await world.tick()
            task = await world.ask("busy")
            assert task is not None
            await world.tick()
            started = time.monotonic()
            pushes = 0
            while time.monotonic() - started < 6:
                pushes += 1
                sim.state.push("acme", "widgets", "feature/issue-1", message=f"Step {pushes}")
                for _ in range(5):
                    await world.tasks.heartbeat(REPO, 1, "busy", task.lease.token)
                    await world.daemon.progress_all()
                    await asyncio.sleep(0.1)
            lease = await world.rstore.lease(1)
            assert lease is not None and not lease.stalled and lease.progress_ms is not None
            assert not [e for e in await world.rstore.timeline(200) if e.kind == "stalled"]


async def test_a_reported_usage_budget_sets_the_task_aside_until_a_retry(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(sim, redis_url, make_settings, budgets={"tokens": 1000}) as world:
            await world.tick()
            task = await world.ask("spender")
            assert task is not None and task.issue_id == 1
            beat = await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=600)
            assert beat.state == TaskState.IN_PROGRESS and beat.paused is None
            # A retried report of the same running total counts once.
            beat = await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=600)
            assert beat.paused is None
            beat = await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=1100)
            assert beat.state == TaskState.WAITING_FOR_USER and beat.paused is not None
            assert "1100 tokens reported, budget 1000" in beat.paused.detail
            assert (await world.rstore.waiting())[1].code == "budget"
            # Waiting on a person: the P0 no longer holds the bucket.
            other = await world.ask("other")
            assert other is not None and other.issue_id == 2
            usage = await world.rstore.usage(1)
            assert usage["tokens"] == 1100
            await Steering(world.settings, world.store).retry(REPO, 1, Actor.admin("maintainer"))
            beat = await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=1200)
            assert beat.state == TaskState.IN_PROGRESS and beat.paused is None
            assert 1 not in await world.rstore.waiting()


async def test_feedback_given_just_before_a_reviews_hand_out_reaches_it_and_is_no_fix_round(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, review=REVIEW) as world:
            await world.tick()
            dev = await world.ask("dev-1")
            assert dev is not None
            pr = sim.state.create_pull(
                "acme", "widgets", title="x", head="feature/issue-1", body="", user="bot"
            )
            await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
            await world.tick()
            await world.tick()
            # The comment lands a second before the hand-out, after the last upkeep pass.
            sim.state.add_issue_comment("acme", "widgets", pr["number"], user="alice", body="Nit.")
            await asyncio.sleep(1)
            review = await world.ask("rev-1")
            assert review is not None and review.task_type == TaskType.REVIEW
            await world.tick()  # the upkeep reads the comment while the review is held
            beat = await world.tasks.heartbeat(REPO, 1, "rev-1", review.lease.token)
            assert [n.by for n in beat.notes] == ["broker"]
            assert "Nit." in beat.notes[0].text
            await world.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
            await world.tick()
            assert await world.ask("fix-1") is None
            _, state = (await world.rstore.review_states([1]))[1]
            assert state.get("fix_rounds", "0") == "0"


async def test_after_a_pass_a_review_and_a_fix_become_claimable_when_due_not_at_the_next_poll(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Without webhooks, the upkeep pass that sees a review waiting (or feedback settling)
    arms a timer: the task is offered within a second of its delay or debounce ending, with
    no further pass. (With webhooks, the deliveries alone do: the test after this one.)"""
    issues = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    review = {"delay_s": 1.5, "timeout_s": 3600, "fix_debounce_s": 1.5}
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, review=review) as world:
            await world.tick()
            dev = await world.ask("dev-1")
            assert dev is not None
            sim.state.create_pull(
                "acme", "widgets", title="x", head="feature/issue-1", body="", user="bot"
            )
            await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
            await world.tick()
            await world.tick()  # sees needs-review: the review is due in 1.5 s
            _, state = (await world.rstore.review_states([1]))[1]
            due_s = json.loads(state["link"])["due_ms"] / 1000
            assert await world.ask("rev-1") is None
            while time.time() < due_s + 1.0:
                got = await world.tasks.request_task("rev-1")
                if got is not None:
                    break
                await asyncio.sleep(0.05)
            assert got is not None and got.task_type == TaskType.REVIEW
            offered_after_s = time.time() - due_s
            assert 0 <= offered_after_s < 1.0, offered_after_s
            await world.tasks.finish(REPO, 1, "rev-1", got.lease.token, Outcome.COMPLETED)
            await world.tick()
            sim.state.add_issue_comment("acme", "widgets", 2, user="alice", body="Rename it.")
            commented_s = time.time()
            await world.tick()  # a pass sees the comment: it settles in 1.5 s
            fix = None
            while time.time() < commented_s + 1.5 + 1.0:
                fix = await world.tasks.request_task("fix-1")
                if fix is not None:
                    break
                await asyncio.sleep(0.05)
            assert fix is not None and fix.task_type == TaskType.FIX
            assert time.time() - commented_s < 1.5 + 1.0


@pytest.fixture
def capture() -> Iterator[Capture]:
    """Where the simulator delivers its webhooks; the test hands them to the broker."""
    c = Capture()
    yield c
    c.close()


async def offered_when_due(world: World, agent: str, due_s: float, what: str) -> Task:
    """The task `agent` is offered within a second of `due_s` (time.time()), not before."""
    if time.time() < due_s - 0.2:
        assert await world.ask(agent) is None, f"{what} offered before it was due"

    async def ask() -> Task | None:
        return await world.tasks.request_task(agent)

    got = await await_until(ask, max(0.0, due_s - time.time()) + 1.0, f"{what} when due")
    offered_after_s = time.time() - due_s
    assert -0.2 <= offered_after_s < 1.0, offered_after_s
    return got


async def due_s(world: World, n: int) -> float:
    """When issue n's review is due (time.time()), as its review state says."""
    _, state = (await world.rstore.review_states([n]))[n]
    return float(json.loads(state["link"])["due_ms"]) / 1000


async def delivered(world: World, capture: Capture) -> list[str]:
    """The deliveries captured since the last call, applied by the leader's worker (no pass)."""
    statuses = await deliver(world, capture)
    capture.deliveries.clear()
    return statuses


async def test_by_webhooks_alone_a_review_and_a_fix_become_claimable_when_due(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    """After the first sync, no poll pass at all: the `needs-review` label's delivery arms the
    review's timer and the PR comment's delivery the fix's debounce; each task is offered
    within a second of being due, and no issue was listed meanwhile."""
    issues = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]
    # GitHub's times are whole seconds: 2 s puts the due time past the delivery's upkeep.
    review = {"delay_s": 2.0, "timeout_s": 3600, "fix_debounce_s": 2.0}
    with simulated(issues) as sim:
        async with running_world(
            sim, redis_url, make_settings, review=review, webhooks={"secret": SECRET}
        ) as world:
            await world.tick()  # the first sync: the only pass of this test
            hooked(sim, capture.url)
            capture.deliveries.clear()
            listed = list_calls(sim)
            dev = await world.ask("dev-1")
            assert dev is not None
            sim.state.create_pull(
                "acme", "widgets", title="x", head="feature/issue-1", body="", user="bot"
            )
            await delivered(world, capture)  # the PR opened: nothing waits for review yet
            await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
            await world.daemon.drain_all()  # the outbox writes needs-review to GitHub
            assert "needs-review" in world.labels(1)
            assert "queued" in await delivered(world, capture)
            got = await offered_when_due(world, "rev-1", await due_s(world, 1), "the review")
            assert got.task_type == TaskType.REVIEW and got.issue_id == 1
            await world.tasks.finish(REPO, 1, "rev-1", got.lease.token, Outcome.COMPLETED)
            await world.daemon.drain_all()
            await delivered(world, capture)  # the review's own label changes
            sim.state.add_issue_comment("acme", "widgets", 2, user="alice", body="Rename it.")
            commented_s = time.time()
            assert "queued" in await delivered(world, capture)
            fix = await offered_when_due(world, "fix-1", commented_s + 2.0, "the fix")
            assert fix.task_type == TaskType.FIX and fix.issue_id == 1
            assert list_calls(sim) == listed  # no pass listed the issues


async def test_the_wall_clock_budget_sets_a_task_aside_and_a_retry_restarts_its_clock(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(two_priorities()) as sim:
        async with running_world(
            sim, redis_url, make_settings, budgets={"wall_clock_s": 1}
        ) as world:
            await world.tick()
            task = await world.ask("slow")
            assert task is not None and task.issue_id == 1
            await asyncio.sleep(1.1)
            await world.daemon.progress_all()
            beat = await world.tasks.heartbeat(REPO, 1, "slow", task.lease.token)
            assert beat.state == TaskState.WAITING_FOR_USER and beat.paused is not None
            await Steering(world.settings, world.store).retry(REPO, 1, Actor.admin("maintainer"))
            await world.daemon.progress_all()
            beat = await world.tasks.heartbeat(REPO, 1, "slow", task.lease.token)
            assert beat.state == TaskState.IN_PROGRESS  # not set aside again at once
            await asyncio.sleep(1.1)
            await world.daemon.progress_all()
            beat = await world.tasks.heartbeat(REPO, 1, "slow", task.lease.token)
            assert beat.state == TaskState.WAITING_FOR_USER
