"""Review and fix tasks, and label wishes, across lease ends, stale reads and expiry."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from github_broker.errors import LeaseError
from github_broker.leader import reviews
from github_broker.leader.sync import index_item
from github_broker.models import Issue, Outcome, ReviewComment, TaskType
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.world import ONE_ISSUE, REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio
COMMENT = [ReviewComment(id=1, kind="direct", author="alice", body="Handle empty input.")]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(
        sim,
        redis_url,
        make_settings,
        leases={"lease_ttl_s": 1, "agent_task_ttl_s": 60},
        review={"delay_s": 0, "timeout_s": 3600, "fix_debounce_s": 0},
    ) as w:
        yield w


async def post_fix(world: World) -> str:
    return await reviews.post_fix(
        world.rstore,
        world.tasks.rules,
        issue_number=1,
        pr=9,
        pr_url="",
        branch=None,
        comments=COMMENT,
    )


async def test_fix_posted_while_the_issue_is_held_goes_out_when_the_lease_ends(
    world: World,
) -> None:
    await world.tick()
    dev = await world.ask("dev-1")
    assert dev is not None and dev.task_type == TaskType.DEVELOPMENT
    await post_fix(world)
    await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
    fix = await world.ask("fix-1")
    assert fix is not None and fix.task_type == TaskType.FIX
    assert [c.body for c in fix.review_comments] == ["Handle empty input."]


async def test_review_whose_lease_was_revoked_goes_back_to_the_pool(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    assert await world.ask("dev-1") is not None
    sim.state.create_pull("acme", "widgets", title="x", head="feature/issue-1", body="")
    assert await world.ask("dev-1") is None  # completes the development work
    await world.tick()
    await world.tick()
    review = await world.ask("rev-1")
    assert review is not None and review.task_type == TaskType.REVIEW
    await world.tasks.heartbeat(REPO, 1, "rev-1", review.lease.token)
    await world.tick()
    await world.tick()  # our in-progress label is on GitHub and seen
    sim.state.remove_label("acme", "widgets", 1, "in-progress")  # a maintainer
    await world.tick()
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, 1, "rev-1", review.lease.token)
    assert refused.value.reason == "label_removed"
    again = await world.ask("rev-2")
    assert again is not None and again.task_type == TaskType.REVIEW


async def test_page_read_before_a_write_does_not_cancel_a_newer_label_wish(
    world: World,
) -> None:
    await world.tick()
    # The sync reads its page (no labels yet) ...
    page = world.gateway.issues_page(REPO, {"state": "all"}, page=1)
    # ... meanwhile an agent claims, the write lands, and the agent gives up at once ...
    task = await world.ask("a1")
    assert task is not None
    await world.daemon.drain_all()
    await world.tasks.finish(REPO, 1, "a1", task.lease.token, Outcome.ABANDONED)
    # ... and only then is the old page written to Redis.
    stale = [Issue.from_github(d) for d in page.items]
    await world.rstore.upsert_issues(
        [index_item(world.daemon.syncer.rules, i, "main") for i in stale]
    )
    await world.daemon.drain_all()
    assert not world.labels(1) & {"in-progress", "a1"}
    await world.tick()
    assert await world.rstore.leases() == []  # no phantom lease re-adopted for a1
    other = await world.ask("a2")
    assert other is not None and other.issue_id == 1


async def test_expired_fix_lease_is_not_readopted_before_the_reaper_runs(
    world: World,
) -> None:
    await world.tick()
    dev = await world.ask("dev-1")
    assert dev is not None
    await world.tasks.finish(REPO, 1, "dev-1", dev.lease.token, Outcome.COMPLETED)
    await world.tick()
    await world.tick()
    await post_fix(world)
    fix = await world.ask("fix-1")
    assert fix is not None and fix.task_type == TaskType.FIX
    await world.tick()
    await world.tick()
    await asyncio.sleep(1.2)  # the lock times out; no reaper has run
    on_github = Issue.from_github(
        world.gateway.issues_page(REPO, {"state": "open"}, page=1).items[0]
    )
    *_, adopted = await world.rstore.upsert_issues(
        [index_item(world.daemon.syncer.rules, on_github, "main")]
    )
    assert adopted == 0
    candidate = await world.rstore.candidate(1, "fix-1")
    assert candidate is not None and candidate["status"] == "expired"
    with pytest.raises(LeaseError) as refused:
        await world.tasks.heartbeat(REPO, 1, "fix-1", fix.lease.token)
    assert refused.value.reason == "expired"
    again = await world.ask("fix-2")
    assert again is not None and again.task_type == TaskType.FIX
