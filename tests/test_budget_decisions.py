"""A maintainer's budget decision holds: a retry that raises the budget keeps the usage so far
and sets the task aside again only past the new budget (shown and audited), and a task the
broker set aside at its budget is waiting on a person, never accused of a stall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from github_broker.models import Actor, TaskState
from github_broker.settings import Settings
from github_broker.steering.actions import BudgetRaise, Steering
from tests.factories import body
from tests.world import REPO, running_world, simulated

pytestmark = pytest.mark.anyio
ONE = [{"number": 1, "title": "t", "body": body(), "labels": ["P1", "BACKENDCODER"]}]


async def test_a_retry_that_raises_the_budget_keeps_the_usage_and_pauses_past_the_new_one(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(ONE) as sim:
        async with running_world(sim, redis_url, make_settings, budgets={"tokens": 1000}) as world:
            await world.tick()
            task = await world.ask("spender")
            assert task is not None
            token = task.lease.token
            beat = await world.tasks.heartbeat(REPO, 1, "spender", token, tokens=1100)
            assert beat.state == TaskState.WAITING_FOR_USER
            result = await Steering(world.settings, world.store).retry(
                REPO, 1, Actor.admin("alice"), "worth it", raise_budget=BudgetRaise(tokens=3000)
            )
            assert "3000" in result.outcome, result.outcome
            # The usage so far is kept: 1,100 + what follows counts against 3,000.
            assert (await world.rstore.usage(1))["tokens"] == 1100
            for total in (1500, 2000, 2900):
                beat = await world.tasks.heartbeat(REPO, 1, "spender", token, tokens=total)
                assert beat.state == TaskState.IN_PROGRESS and beat.paused is None, total
            beat = await world.tasks.heartbeat(REPO, 1, "spender", token, tokens=3100)
            assert beat.state == TaskState.WAITING_FOR_USER and beat.paused is not None
            assert "3100 tokens reported, budget 3000" in beat.paused.detail
            retries = [e for e in await world.rstore.audit_log(50) if e.action == "retry"]
            assert len(retries) == 1 and retries[0].actor == "alice"
            assert "3000" in retries[0].outcome


async def test_a_task_set_aside_at_its_budget_is_waiting_for_a_person_and_never_stalled(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The broker paused it: the stall check, running past its stall time, must not flag the
    agent for the quiet the broker imposed."""
    progress = {"stall_after_s": 1.0, "branch_check_interval_s": 0.1, "check_interval_s": 0.1}
    with simulated(ONE) as sim:
        async with running_world(
            sim, redis_url, make_settings, budgets={"tokens": 1000}, progress=progress
        ) as world:
            await world.tick()
            task = await world.ask("spender")
            assert task is not None
            beat = await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=1100)
            assert beat.state == TaskState.WAITING_FOR_USER
            paused_at = time.monotonic()
            checks = 0
            # Three stall times of quiet, the agent still beating (its runner is suspended).
            while time.monotonic() - paused_at < 3.0:
                await world.tasks.heartbeat(REPO, 1, "spender", task.lease.token, tokens=1100)
                await world.daemon.progress_all()
                checks += 1
                await asyncio.sleep(0.1)
            assert checks >= 10
            lease = await world.rstore.lease(1)
            assert lease is not None and not lease.stalled
            assert lease.state == TaskState.WAITING_FOR_USER
            assert not [e for e in await world.rstore.timeline(200) if e.kind == "stalled"]
