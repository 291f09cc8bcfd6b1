"""Done means green, on the simulator: a failing required check becomes a fix task for the PR's
author, a newer push withdraws it, rounds are capped, a conflict becomes a rebase task, the
review waits for green, a failure the base branch shares spends no round, overlapping PRs are
reported with a merge order, and a failure delivered by webhook is claimable within a second."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from github_broker.models import Outcome, Task, TaskType
from github_broker.reports.explain import explain_repo
from github_broker.reports.status import repo_status
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.webhooks.receiver import WebhookReceiver
from tests.factories import body
from tests.test_webhooks import SECRET, Capture, hooked
from tests.world import REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio
OWNER, NAME = "acme", "widgets"
REVIEW = {"delay_s": 0, "timeout_s": 3600, "fix_debounce_s": 0}
CHECKS = {"author_first_s": 60}


@pytest.fixture
def capture() -> Iterator[Capture]:
    c = Capture()
    yield c
    c.close()


def issues(*numbers: int) -> list[dict[str, Any]]:
    return [
        {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in numbers
    ]


def fail(sim: Simulator, sha: str, name: str = "ci/test", *, note: str = "boom") -> None:
    """A completed failing check run on `sha`, with one annotation."""
    output = {
        "title": "1 test failed",
        "summary": f"test_export failed: {note}",
        "annotations": [
            {
                "path": "src/export.py",
                "start_line": 7,
                "annotation_level": "failure",
                "message": note,
            }
        ],
    }
    sim.state.create_check_run(
        OWNER,
        NAME,
        {"name": name, "head_sha": sha, "conclusion": "failure", "output": output},
        app="ci-bot",
    )


def passes(sim: Simulator, sha: str, name: str = "ci/test") -> None:
    sim.state.create_check_run(
        OWNER, NAME, {"name": name, "head_sha": sha, "conclusion": "success"}, app="ci-bot"
    )


def head(sim: Simulator, n: int) -> str:
    return str(sim.state.get_ref(OWNER, NAME, f"heads/feature/issue-{n}")["object"]["sha"])


async def developed(
    world: World, n: int, agent: str, files: dict[str, str | None] | None = None
) -> int:
    """Issue n developed by `agent`: pushed, a PR that closes it, completed; its PR number."""
    await world.tick()
    task = await world.ask(agent)
    assert task is not None and task.issue_id == n and task.task_type == TaskType.DEVELOPMENT
    pr = await opened(world, n, agent, files)
    await world.tasks.finish(REPO, n, agent, task.lease.token, Outcome.COMPLETED)
    await world.tick()
    return pr


async def opened(
    world: World, n: int, agent: str, files: dict[str, str | None] | None = None
) -> int:
    branch = f"feature/issue-{n}"
    await world.tick()  # the branch the claim asked for
    world.sim.state.push(OWNER, NAME, branch, files=files or {f"src/f{n}.py": "x\n"}, author=agent)
    pull = world.sim.state.create_pull(
        OWNER, NAME, title=f"Task {n}", head=branch, body=f"Closes #{n}", user="dev-bot"
    )
    return int(pull["number"])


@asynccontextmanager
async def in_review(
    redis_url: str,
    make_settings: Callable[..., Settings],
    numbers: list[int],
    *,
    protect: bool,
    **overrides: Any,
) -> AsyncIterator[tuple[Simulator, World]]:
    """A world on the simulator holding issues `numbers` (`protect`: main requires ci/test)."""
    with simulated(issues(*numbers)) as sim:
        if protect:
            sim.state.protect(OWNER, NAME, "main", ["ci/test"])
        async with running_world(sim, redis_url, make_settings, review=REVIEW, **overrides) as w:
            yield sim, w


async def ci_rounds(world: World, n: int) -> str:
    return (await world.rstore.review_states([n]))[n][1].get("ci_rounds", "0")


async def kinds(world: World) -> list[str]:
    return [e.kind for e in await world.rstore.timeline(50)]


async def ready_ids(world: World) -> set[str]:
    return {task_id for task_id, _ in await world.rstore.ready_tasks()}


async def verdicts(world: World) -> dict[int, Any]:
    return {v.issue: v for v in await explain_repo(world.rstore, world.settings, None)}


async def test_a_failing_required_check_offers_one_fix_task_to_the_prs_author_with_the_failure(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1], protect=True, checks=CHECKS) as (
        sim,
        world,
    ):
        pr = await developed(world, 1, "dev-1")
        sha = head(sim, 1)
        fail(sim, sha)
        await world.tick()  # without webhooks: one poll
        assert await ready_ids(world) == {"fix:1"}
        assert await world.ask("dev-2") is None  # the author's alone for author_first_s
        fix = await world.ask("dev-1")
        assert isinstance(fix, Task) and fix.task_type == TaskType.FIX and fix.issue_id == 1
        assert fix.pr_url and fix.pr_url.endswith(f"/pull/{pr}")
        [comment] = fix.review_comments
        assert comment.author == "ci/test" and comment.kind == "check"
        assert "test_export failed: boom" in comment.body
        assert "src/export.py:7: boom" in comment.body
        assert sha in fix.prompt and "Checks failed" in fix.prompt
        payload = await world.rstore.fix_task(pr)
        assert payload is not None and payload["head_sha"] == sha
        assert payload["source"] == "checks" and payload["round"] == 1
        assert payload["checks"][0]["annotations"][0]["line"] == 7
        await world.tick()  # the same failure again: no second task
        state = (await world.rstore.review_states([1]))[1][1]
        assert state["ci_rounds"] == "1"
        kinds = [e.kind for e in await world.rstore.timeline(50)]
        assert "checks_fix" in kinds and "checks_failed" in kinds


async def test_a_new_push_before_the_fix_task_is_claimed_withdraws_it(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1], protect=True, checks=CHECKS) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        fail(sim, head(sim, 1))
        await world.tick()
        assert "fix:1" in await ready_ids(world)
        sim.state.push(OWNER, NAME, "feature/issue-1", files={"src/f1.py": "y\n"})
        await world.tick()
        assert "fix:1" not in await ready_ids(world)
        assert await world.ask("dev-1") is None
        state = (await world.rstore.review_states([1]))[1][1]
        assert state["ci_rounds"] == "0"  # a withdrawn round is given back
        kinds = [e.kind for e in await world.rstore.timeline(50)]
        assert "fix_withdrawn" in kinds
        record = (await world.rstore.checks_records([1]))[1]
        assert record["verdict"]["status"] == "running"  # the new head's checks


async def test_past_the_round_cap_the_issue_waits_for_a_person_until_a_retry(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    checks = {"max_rounds": 2, "author_first_s": 0}
    async with in_review(redis_url, make_settings, [1], protect=True, checks=checks) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        shas = []
        for attempt in range(2):
            shas.append(head(sim, 1))
            fail(sim, shas[-1], note=f"attempt {attempt}")
            await world.tick()
            fix = await world.ask("fixer")
            assert fix is not None and fix.task_type == TaskType.FIX, attempt
            sim.state.push(OWNER, NAME, "feature/issue-1", files={"src/f1.py": f"{attempt}"})
            await world.tasks.finish(REPO, 1, "fixer", fix.lease.token, Outcome.COMPLETED)
            await world.tick()
        fail(sim, head(sim, 1), note="still")
        await world.tick()
        assert "fix:1" not in await ready_ids(world)
        waiting = await world.rstore.waiting()
        assert waiting[1].code == "checks_failed"
        assert "2 of 2 fix rounds used" in waiting[1].detail
        assert f"round 1 (checks {shas[0][:7]}: ci/test)" in waiting[1].detail
        assert f"round 2 (checks {shas[1][:7]}: ci/test)" in waiting[1].detail
        verdict = (await verdicts(world))[1]
        assert verdict.verdict == "waiting_on_person" and "checks_failed" in verdict.detail
        # A maintainer's retry ends the wait: the rounds start again.
        await world.rstore.control("retry", "alice", "1", "CI fixed by hand")
        await world.tick()
        assert "fix:1" in await ready_ids(world)
        state = (await world.rstore.review_states([1]))[1][1]
        assert state["ci_rounds"] == "1"


async def test_a_conflict_offers_a_rebase_task_naming_the_base_and_the_head(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1], protect=False, checks=CHECKS) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1", files={"src/app.py": "ours\n"})
        sim.state.push(OWNER, NAME, "main", files={"src/app.py": "theirs\n"})
        await asyncio.sleep(sim.state.merge_compute_s + 0.1)  # GitHub works it out
        await world.tick()
        assert "fix:1" in await ready_ids(world)
        task = await world.ask("dev-1")
        assert task is not None and task.task_type == TaskType.FIX
        sha = head(sim, 1)
        assert "conflicts with its\nbase branch `main`" in task.prompt
        assert sha in task.prompt and "feature/issue-1" in task.prompt
        payload = await world.rstore.fix_task(int(task.pr_url.rsplit("/", 1)[1]))
        assert payload is not None and payload["source"] == "conflict"
        assert payload["base"] == "main" and payload["head_sha"] == sha
        kinds = [e.kind for e in await world.rstore.timeline(50)]
        assert "conflict" in kinds and "checks_rebase" in kinds


async def test_a_pr_with_pending_checks_is_not_offered_for_review_while_the_option_is_on(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1], protect=True, checks=CHECKS) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        sha = head(sim, 1)
        sim.state.create_check_run(
            OWNER, NAME, {"name": "ci/test", "head_sha": sha, "status": "in_progress"}, app="ci"
        )
        await world.tick()
        await world.tick()
        assert await world.ask("rev-1") is None
        verdict = (await verdicts(world))[1]
        assert "waiting for checks: ci/test" in verdict.detail
        passes(sim, sha)
        await world.tick()
        review = await world.ask("rev-1")
        assert review is not None and review.task_type == TaskType.REVIEW


async def test_with_the_option_off_a_pending_pr_goes_to_review_at_once(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    checks = {**CHECKS, "review_when_green": "off"}
    async with in_review(redis_url, make_settings, [1], protect=True, checks=checks) as (
        _sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        await world.tick()
        review = await world.ask("rev-1")
        assert review is not None and review.task_type == TaskType.REVIEW


async def test_a_failure_also_present_on_the_base_branch_spends_no_round(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1], protect=True, checks=CHECKS) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        main = sim.state.get_ref(OWNER, NAME, "heads/main")["object"]["sha"]
        fail(sim, main, note="flaky on main")
        fail(sim, head(sim, 1), note="flaky on main")
        await world.tick()
        await world.tick()
        assert "fix:1" not in await ready_ids(world)
        state = (await world.rstore.review_states([1]))[1][1]
        assert state.get("ci_rounds", "0") == "0"
        record = (await world.rstore.checks_records([1]))[1]
        assert "fails on main too" in record["verdict"]["detail"]
        review = await world.ask("rev-1")  # not the PR's doing: review goes on
        assert review is not None and review.task_type == TaskType.REVIEW


async def test_two_prs_touching_the_same_file_are_reported_with_a_merge_order(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    async with in_review(redis_url, make_settings, [1, 2], protect=False, checks=CHECKS) as (
        _sim,
        world,
    ):
        await world.tick()
        first, task = await world.ask("dev-1"), await world.ask("dev-2")
        assert first is not None and task is not None and task.issue_id == 2
        small = await opened(world, 1, "dev-1", files={"src/shared.py": "a\n"})
        await world.tasks.finish(REPO, 1, "dev-1", first.lease.token, Outcome.COMPLETED)
        big = await opened(world, 2, "dev-2", files={"src/shared.py": "b\nc\nd\n", "x": "y"})
        await world.tick()
        status = await repo_status(world.rstore, world.settings)
        by_issue = {o.issue: o for o in status.overlapping_prs}
        assert set(by_issue) == {1, 2}
        assert by_issue[2].files == ["src/shared.py"] and by_issue[2].merge_order == [
            small,
            big,
        ]
        answer = await world.tasks.heartbeat(REPO, 2, "dev-2", task.lease.token)
        notes = [n.text for n in answer.notes]
        assert any("src/shared.py" in t and f"#{small} then #{big}" in t for t in notes)
        again = await world.tasks.heartbeat(REPO, 2, "dev-2", task.lease.token)
        assert not again.notes  # said once


async def test_with_webhooks_a_failing_check_is_a_claimable_fix_task_within_a_second(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with in_review(
        redis_url, make_settings, [1], protect=True, checks=CHECKS, webhooks={"secret": SECRET}
    ) as (sim, world):
        await developed(world, 1, "dev-1")
        await world.tick()  # the PR's first read (webhooks not proven healthy yet)
        hooked(sim, capture.url)
        capture.deliveries.clear()
        receiver = WebhookReceiver(world.settings, world.store)
        world.daemon.webhooks.start(lambda: True)
        calls = sim.stats.snapshot()["total"]
        fail(sim, head(sim, 1))
        assert sim.webhooks.wait_idle()
        started = time.monotonic()
        for headers, data in list(capture.deliveries):
            await receiver.accept(headers["x-github-event"], headers["x-github-delivery"], data)
        while "fix:1" not in await ready_ids(world):
            assert time.monotonic() - started < 1.0, "no fix task within 1 s of delivery"
            await asyncio.sleep(0.01)
        fix = await world.ask("dev-1")
        assert fix is not None and fix.task_type == TaskType.FIX
        assert "src/export.py:7: boom" in fix.review_comments[0].body
        # The delivery said what failed; its annotations took one request.
        by_route = sim.stats.snapshot()["by_route"]
        assert sim.stats.snapshot()["total"] - calls <= 1, json.dumps(by_route)


async def test_a_workflow_waiting_for_approval_and_stale_checks_wait_on_a_person(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    checks = {**CHECKS, "pending_stale_s": 0.5}
    async with in_review(redis_url, make_settings, [1], protect=True, checks=checks) as (
        sim,
        world,
    ):
        await developed(world, 1, "dev-1")
        sha = head(sim, 1)
        run = sim.state.request_approval(OWNER, NAME, sha, workflow="CI", actor="newcomer")
        await world.tick()
        waiting = await world.rstore.waiting()
        assert waiting[1].code == "checks_approval"
        assert "Approve and run" in waiting[1].detail and f"/runs/{run['id']}" in waiting[1].detail
        status = await repo_status(world.rstore, world.settings)
        [row] = status.waiting_reviews
        assert row.step == "approval_required" and row.state == "waiting_for_user"
        sim.state.approve_workflow_run(OWNER, NAME, run["id"], login="alice")
        sim.state.create_check_run(
            OWNER, NAME, {"name": "ci/test", "head_sha": sha, "status": "in_progress"}, app="ci"
        )
        await world.tick()
        assert 1 not in await world.rstore.waiting()  # approved: the checks run
        await asyncio.sleep(0.6)
        await world.tick()
        waiting = await world.rstore.waiting()
        assert waiting[1].code == "checks_stale" and "ci/test" in waiting[1].detail
        assert await world.ask("rev-1") is None
