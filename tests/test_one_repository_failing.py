"""Several repositories, one of which GitHub will not serve (renamed, removed, no access):
the others keep handing out work, and the leader does not re-sync them on every drain."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from github_broker.errors import (
    GitHubError,
    GitHubNotFound,
    GitHubUnavailable,
    MirrorRebuilding,
    RateLimited,
)
from github_broker.reports.health import SYNC_ADVICE, failure_kind, health
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.conftest import free_port
from tests.world import World, running_world, two_repositories

#: acme/renamed does not exist on the simulator: every sync of it is a 404.
REPOS = ["acme/widgets", "acme/renamed"]


def list_calls(sim: Simulator) -> int:
    routes = sim.stats.snapshot()["by_route"]
    return sum(v for k, v in routes.items() if k.startswith("GET") and k.endswith("/issues"))


@pytest.mark.anyio
async def test_a_repository_github_refuses_does_not_stop_claims_in_the_others(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Its mirror is never rebuilt, and claim.lua answers REBUILDING for it. The settle pass
    of every request spans all repositories, so that error used to fail every request (503)
    for as long as the repository stayed broken, even requests naming only acme/widgets."""
    with two_repositories(widgets=2, gadgets=0) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=REPOS) as w:
            await w.tick()
            only = await w.tasks.request_task("a1", repositories=["acme/widgets"])
            assert only is not None and only.repository == "acme/widgets"
            anywhere = await w.tasks.request_task("a2")
            assert anywhere is not None and anywhere.repository == "acme/widgets"
            with pytest.raises(MirrorRebuilding, match="acme/renamed"):
                await w.tasks.request_task("a3", repositories=["acme/renamed"])
            assert "404" in (await w.store.repo("acme/renamed").sync_failing() or "")


@pytest.mark.anyio
async def test_a_mirror_being_rebuilt_makes_only_agents_that_may_hold_a_task_there_retry(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """acme/gadgets is being rebuilt (its data lost) and no sync failed yet: an agent that may
    hold a task there (it claimed there) is told to retry, its task there unknown; an agent
    that never claimed there gets work from the mirrored acme/widgets."""
    with two_repositories(widgets=2, gadgets=2) as sim:
        repos = ["acme/widgets", "acme/gadgets"]
        async with running_world(sim, redis_url, make_settings, repositories=repos) as w:
            await w.tick()
            held = await w.tasks.request_task("a1", repositories=["acme/gadgets"])
            assert held is not None and held.repository == "acme/gadgets"
            await w.store.client.delete(w.store.repo("acme/gadgets").keys.mirror)
            with pytest.raises(MirrorRebuilding):
                await w.tasks.request_task("a1", repositories=["acme/widgets"])
            fresh = await w.tasks.request_task("a2")
            assert fresh is not None and fresh.repository == "acme/widgets"


@pytest.mark.anyio
async def test_a_broken_repository_does_not_make_the_others_sync_every_drain(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The drain's loss check (rebuild_if_lost) saw the broken repository's mirror missing on
    every pass and ran a whole sync of every repository: one listing a second for the
    healthy ones, for as long as the other stayed broken."""
    with two_repositories(widgets=2, gadgets=0) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=REPOS) as w:
            await w.tick()
            before = list_calls(sim)
            for _ in range(5):
                await w.daemon.drain_all()
            assert list_calls(sim) == before


@pytest.mark.anyio
async def test_a_sync_failing_because_github_is_unreachable_says_so_not_check_the_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """GitHub refuses the connection: the problem `status` and the dashboard show says GitHub
    cannot be reached (and where), not that the repository may not exist."""
    dead = f"http://127.0.0.1:{free_port()}"
    settings = make_settings(redis={"url": redis_url}, github={"base_url": dead})
    async with World.running(settings, Simulator({"repositories": []})) as w:
        await w.daemon.hold_leadership()
        for _ in range(2):  # an unreachable GitHub is marked after two failed passes
            w.daemon._not_before.clear()  # no waiting out the backoff between them
            await w.daemon.sync_all()
        found = await health(w.store, settings)
    problem = next(p for p in found.problems if "its sync keeps failing" in p)
    assert "GitHub cannot be reached from the broker" in problem and dead in problem
    assert "check that the repository exists" not in problem
    assert found.repositories[0].sync_advice is not None


def test_each_kind_of_sync_failure_gets_its_own_advice() -> None:
    """What the dashboard and `status` tell a maintainer to do, by what GitHub answered."""
    cases = {
        GitHubUnavailable("GET /repos/acme/widgets: GitHub cannot be reached"): "unreachable",
        RateLimited("rate limit", retry_at_s=0): "rate_limited",
        GitHubError("401 Bad credentials", status=401): "credentials",
        GitHubError("403 Resource not accessible", status=403): "no_access",
        GitHubNotFound("404 Not Found", status=404): "no_access",
        GitHubError("451 Unavailable For Legal Reasons", status=451): "github",
    }
    for error, kind in cases.items():
        assert failure_kind(error) == kind, error
    advice = set(SYNC_ADVICE.values())
    assert len(advice) == len(SYNC_ADVICE)  # each kind says something of its own
