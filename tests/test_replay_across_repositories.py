"""Request-id replays with several repositories: a repeat settles nothing anywhere, and gets
its live hand-out from whichever repository holds it (`TaskService._replayed_elsewhere`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.models import Outcome
from github_broker.settings import Settings
from tests.world import TWO_REPOS, running_world, two_repositories


@pytest.mark.anyio
async def test_replay_of_an_old_request_settles_nothing_in_another_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """a1's request r1 got issue X in acme/gadgets; a1 completed it, then request r2 got
    issue Y in acme/widgets. A late retry of r1 arrives (same request id, same body). A
    repeat settles nothing (claim.lua: 'replayed' when r1's lease ended while the agent holds
    another), as it does with one repository: widgets, which knows no hand-out of r1, must
    not settle Y as if r1 were a new request."""
    with two_repositories(widgets=2, gadgets=2) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=TWO_REPOS) as w:
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


@pytest.mark.anyio
async def test_replay_after_a_fresh_claim_elsewhere_gets_that_claim(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Request r1 got X in acme/widgets; X's lease ended (here: released; in the field a
    revocation by the sync) while r1's handout record lives. A retry of r1 finds the agent
    holding nothing and asks afresh (docs/api.md): it gets Y in acme/gadgets, which now also
    remembers r1. Its answer is lost too; the next retry of r1 must get Y again, with Y's
    token (as with one repository, where the record is overwritten), not 'replayed' because
    the first repository that knows r1 has no live lease for it."""
    with two_repositories(widgets=1, gadgets=2) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=TWO_REPOS) as w:
            await w.tick()
            x = await w.tasks.request_task("a1", request_id="r1")
            assert x is not None and x.repository == "acme/widgets"
            await w.tasks.finish(x.repository, x.issue_id, "a1", x.lease.token, Outcome.ABANDONED)
            y = await w.tasks.request_task("a1", request_id="r1")
            assert y is not None and y.repository == "acme/gadgets"
            again = await w.tasks.request_task("a1", request_id="r1")
            assert again is not None, "the retry of r1 got no task while r1's lease on Y lives"
            assert (again.repository, again.issue_id, again.lease.token) == (
                y.repository,
                y.issue_id,
                y.lease.token,
            )
