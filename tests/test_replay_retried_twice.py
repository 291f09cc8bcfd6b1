"""A request id retried twice, with several repositories, gets its live hand-out."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.models import Outcome
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.world import running_world


def _two(widgets: int = 1, gadgets: int = 2) -> Simulator:
    return Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": "widgets",
                    "issues": generate_issues(widgets, priorities=("P1",)),
                },
                {
                    "owner": "acme",
                    "name": "gadgets",
                    "issues": generate_issues(gadgets, priorities=("P1",)),
                },
            ]
        }
    )


@pytest.mark.anyio
async def test_replay_after_a_fresh_claim_elsewhere_gets_that_claim(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Request r1 got X in acme/widgets; X's lease ended (here: released; in the field a
    revocation by the sync) while r1's handout record lives. A retry of r1 finds the agent
    holding nothing and asks afresh (docs/api.md): it gets Y in acme/gadgets, which now also
    remembers r1. Its answer is lost too; the next retry of r1 must get Y again, with Y's
    token (as with one repository, where the record is overwritten). `_replayed_elsewhere`
    asks only the first repository that knows r1 (widgets, whose lease ended) and answers
    'replayed'/None because the agent holds a lease in gadgets: Y's own hand-out."""
    with _two() as sim:
        async with running_world(
            sim, redis_url, make_settings, repositories=["acme/widgets", "acme/gadgets"]
        ) as w:
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
