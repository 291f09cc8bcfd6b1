"""Request-id replays across several repositories settle nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.models import Outcome
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.world import running_world


@pytest.mark.anyio
async def test_replay_of_an_old_request_settles_nothing_in_another_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Two repositories. a1's request r1 got issue X in acme/gadgets; a1 completed it, then
    request r2 got issue Y in acme/widgets. A late retry of r1 arrives (same request id,
    same body). A repeat settles nothing (claim.lua: 'replayed' when r1's lease ended while
    the agent holds another), as it does with one repository."""
    sim = Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": "widgets",
                    "issues": generate_issues(2, priorities=("P1",)),
                },
                {
                    "owner": "acme",
                    "name": "gadgets",
                    "issues": generate_issues(2, priorities=("P1",)),
                },
            ]
        }
    )
    with sim:
        async with running_world(
            sim, redis_url, make_settings, repositories=["acme/widgets", "acme/gadgets"]
        ) as w:
            await w.tick()
            x = await w.tasks.request_task("a1", repositories=["acme/gadgets"], request_id="r1")
            assert x is not None and x.repository == "acme/gadgets"
            await w.tasks.finish(x.repository, x.issue_id, "a1", x.lease.token, Outcome.COMPLETED)
            y = await w.tasks.request_task("a1", repositories=["acme/widgets"], request_id="r2")
            assert y is not None and y.repository == "acme/widgets"
            again = await w.tasks.request_task("a1", repositories=["acme/gadgets"], request_id="r1")
            assert again is None
            # Y is still a1's live lease.
            await w.tasks.heartbeat(y.repository, y.issue_id, "a1", y.lease.token)
