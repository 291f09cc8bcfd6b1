"""Sync passes racing changes on GitHub: pages that shift under a pass, cursors, stale reads."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.world import REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(generate_issues(30, priorities=("P1",))) as s:
        yield s


@pytest.fixture
async def world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[World]:
    async with running_world(sim, redis_url, make_settings, github={"per_page": 10}) as w:
        yield w


def after_page(world: World, state: str, page_no: int, action: Callable[[], None]) -> Any:
    """Run `action` on GitHub right after the sync has read page `page_no` of a listing."""
    original = world.gateway.issues_page

    def issues_page(
        full_name: str, params: dict[str, Any], *, page: int, etag: str | None = None
    ) -> Any:
        result = original(full_name, params, page=page, etag=etag)
        if params.get("state") == state and page == page_no:
            action()
        return result

    world.gateway.issues_page = issues_page  # type: ignore[method-assign]
    return original


async def test_issue_closing_mid_full_pass_does_not_remove_the_next_one(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    held = {}
    for i in range(1, 12):
        task = await world.ask(f"a{i}")
        assert task is not None
        held[task.issue_id] = task
    await world.tick()
    # A PR merge closes #1 just after page 1 was read: #11 slides onto page 1, unseen.
    original = after_page(
        world, "open", 1, lambda: sim.state.update_issue("acme", "widgets", 1, state="closed")
    )
    report = await world.daemon.syncer.sync(world.settings.repositories[0], full=True)
    world.gateway.issues_page = original  # type: ignore[method-assign]
    assert report.removed == 0 and report.revoked == 0
    assert 11 in await world.rstore.open_numbers()
    await world.tasks.heartbeat(REPO, 11, "a11", held[11].lease.token)
    incremental = await world.daemon.syncer.sync(world.settings.repositories[0], full=False)
    assert incremental.removed == 1 and 1 not in await world.rstore.open_numbers()


async def test_change_on_a_page_already_read_is_not_skipped_by_the_cursor(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    time.sleep(1.1)

    def meanwhile() -> None:
        sim.state.add_labels("acme", "widgets", 3, ["needs-human"])  # page 1, already read
        time.sleep(1.1)
        sim.state.add_labels("acme", "widgets", 25, ["in-progress"])  # page 3, read later

    original = after_page(world, "open", 1, meanwhile)
    await world.daemon.syncer.sync(world.settings.repositories[0], full=True)
    world.gateway.issues_page = original  # type: ignore[method-assign]
    await world.daemon.syncer.sync(world.settings.repositories[0], full=False)
    assert "development:3" not in dict(await world.rstore.ready_tasks())


async def test_update_during_a_multi_page_incremental_pass_is_not_skipped(
    world: World, sim: Simulator
) -> None:
    await world.tick()
    time.sleep(1.1)
    for n in range(1, 16):
        sim.state.add_labels("acme", "widgets", n, ["needs-human"])
    time.sleep(1.1)
    original = after_page(
        world, "all", 1, lambda: sim.state.add_labels("acme", "widgets", 2, ["touched"])
    )
    await world.daemon.syncer.sync(world.settings.repositories[0], full=False)
    world.gateway.issues_page = original  # type: ignore[method-assign]
    ready = dict(await world.rstore.ready_tasks())
    assert [n for n in range(1, 16) if f"development:{n}" in ready] == []
