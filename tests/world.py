"""An in-process broker (store, daemon jobs, task service) on the simulator, for scenario tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.service import TaskService
from github_broker.gateway import GitHubGateway
from github_broker.leader.poller import Daemon
from github_broker.models import Task
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from github_broker.store import Store
from tests.factories import body

REPO = "acme/widgets"
#: One assignable P1 issue, the subject of most scenario tests.
ONE_ISSUE: list[dict[str, Any]] = [
    {"number": 1, "title": "Add CSV export", "body": body(), "labels": ["P1", "BACKENDCODER"]}
]


def simulated(issues: list[dict[str, Any]]) -> Simulator:
    """A simulator (use it as a context manager) whose acme/widgets holds `issues`."""
    return Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": issues}]})


#: The two repositories of `two_repositories`, in the order the settings list them.
TWO_REPOS = ["acme/widgets", "acme/gadgets"]


def two_repositories(widgets: int, gadgets: int) -> Simulator:
    """A simulator with acme/widgets and acme/gadgets holding that many P1 issues each (run
    a World on it with `repositories=TWO_REPOS`)."""
    return Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": name,
                    "issues": generate_issues(count, priorities=("P1",)),
                }
                for name, count in (("widgets", widgets), ("gadgets", gadgets))
            ]
        }
    )


@asynccontextmanager
async def running_world(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], **overrides: Any
) -> AsyncIterator[World]:
    """A World on `sim` and `redis_url`, with settings overrides per section."""
    github = {"base_url": sim.base_url, **overrides.pop("github", {})}
    # Scenario agents ask again at once to say "done": no settle grace.
    leases = {"settle_grace_s": 0, **overrides.pop("leases", {})}
    settings = make_settings(redis={"url": redis_url}, github=github, leases=leases, **overrides)
    async with World.running(settings, sim) as world:
        yield world


class World:
    def __init__(self, settings: Settings, sim: Simulator) -> None:
        self.settings = settings
        self.sim = sim
        self.store = Store.from_settings(settings)
        self.gateway = GitHubGateway(settings.github)
        self.daemon = Daemon(settings, self.store, self.gateway)
        self.tasks = TaskService(settings, self.store, Prompts.load(None), ReadyWaker(1.0))
        self.rstore = self.store.repo(REPO)

    async def tick(self) -> None:
        """What the poller leader does each interval: writes out, then sync and reviews."""
        await self.daemon.hold_leadership()
        await self.daemon.drain_all()
        await self.daemon.sync_all()
        await self.daemon.drain_all()

    async def ask(self, agent: str) -> Task | None:
        return await self.tasks.request_task(agent)

    def labels(self, n: int) -> set[str]:
        return set(self.sim.state.issue_labels("acme", "widgets", n))

    async def lose_lease_keys(self, n: int, repository: str = REPO) -> None:
        """What an eviction of issue n's lease keys alone does: lock, lease hash, leases entry."""
        keys, client = self.store.repo(repository).keys, self.store.client
        await client.delete(keys.issue_lock(n), keys.lease(n))
        await client.zrem(keys.leases, str(n))

    async def live_leases(self, agent: str, repository: str = REPO) -> list[int]:
        """The issues of `repository` on which `agent` holds a live lease."""
        keys, client = self.store.repo(repository).keys, self.store.client
        held = []
        for raw in await client.zrange(keys.leases, 0, -1):
            n = int(raw)
            owner = (await client.hget(keys.lease(n), "agent") or b"").decode()
            if owner == agent and await client.exists(keys.issue_lock(n)):
                held.append(n)
        return sorted(held)

    async def full_sync(self) -> None:
        """A full sync pass of every repository, as the poller leader runs it on its interval."""
        await self.daemon.hold_leadership()
        for repo in self.settings.repositories:
            await self.daemon.syncer.sync(repo, full=True)

    @classmethod
    @asynccontextmanager
    async def running(cls, settings: Settings, sim: Simulator) -> AsyncIterator[World]:
        world = cls(settings, sim)
        try:
            yield world
        finally:
            await world.daemon.stop()
            await world.store.close()
            world.gateway.close()
