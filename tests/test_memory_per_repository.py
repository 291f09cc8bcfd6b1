"""What a process holds per configured repository (issue 38: at most 0.05 MB each): an API
worker near nothing beyond its name until a claim, heartbeat or read reaches the repository;
the poller a store per repository (the Lua scripts compiled once for all of them)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.claim.rules import Rules
from github_broker.gateway import GitHubGateway
from github_broker.leader.poller import Daemon
from github_broker.leader.sync import index_item
from github_broker.settings import Settings
from github_broker.store import Store
from tests.conftest import sync_client
from tests.factories import issue

#: Most bytes a process may hold per configured repository (0.05 MB: 50 MB at 1,000).
MAX_BYTES_PER_REPOSITORY = 50_000
#: Repositories the larger deployment configures beyond the smaller one's.
MORE_REPOSITORIES = 300


def names(count: int) -> list[str]:
    return [f"acme/repo-{i:04d}" for i in range(count)]


def mirrored(settings: Settings) -> None:
    """Redis emptied, then every repository mirrored (a complete sync pass) and one issue in
    the last one."""
    client = sync_client(settings.redis.url)
    client.flushall()
    client.close()

    async def run() -> None:
        store = Store.from_settings(settings)
        try:
            for name in store.repos:
                await store.repo(name).save_sync_state({}, rebuilt=True)
            last = store.repo(list(store.repos)[-1])
            item = index_item(Rules(settings), issue(1, "P1", "BACKENDCODER"), "main")
            await last.upsert_issues([item])
        finally:
            await store.close()

    asyncio.run(run())


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def held_by_a_serving_worker(settings: Settings) -> int:
    """Bytes an API worker (no poller) holds once started and after serving a claim, a
    heartbeat and an empty claim: traced memory while it runs, less before it was made."""
    mirrored(settings)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    with TestClient(create_app(settings)) as client:
        got = client.post("/request-task", json={"agent_id": "a1"})
        assert got.status_code == 200, got.text
        task = got.json()
        beat = client.post(
            f"/tasks/{task['repository']}/{task['issue_id']}/heartbeat",
            json={"agent_id": "a1", "token": task["lease"]["token"]},
        )
        assert beat.status_code == 200, beat.text
        assert client.post("/request-task", json={"agent_id": "a2"}).status_code == 204
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    return held


def test_an_api_worker_holds_at_most_50_kb_per_configured_repository(
    traced: None, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    def settings(count: int) -> Settings:
        return make_settings(
            redis={"url": redis_url},
            repositories=names(count),
            server={"run_poller": False},
            leases={"settle_grace_s": 0},
        )

    few, many = settings(1), settings(1 + MORE_REPOSITORIES)
    held_by_a_serving_worker(few)  # imports, caches and the scripts' first load
    small = held_by_a_serving_worker(few)
    large = held_by_a_serving_worker(many)
    per_repository = (large - small) / MORE_REPOSITORIES
    assert per_repository <= MAX_BYTES_PER_REPOSITORY, (
        f"{per_repository / 1e6:.3f} MB per configured repository "
        f"({small / 1e6:.1f} MB at 1, {large / 1e6:.1f} MB at {1 + MORE_REPOSITORIES})"
    )


def held_by_an_idle_poller(settings: Settings) -> int:
    """Bytes the poller's daemon holds once it leads and has run each idle pass once."""
    mirrored(settings)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]

    async def run() -> int:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        daemon = Daemon(settings, store, gateway)
        try:
            assert await daemon.hold_leadership()
            for job in (daemon.drain_all, daemon.reap_all, daemon.progress_all):
                await job()
            await daemon.sample_history()
            gc.collect()
            return tracemalloc.get_traced_memory()[0] - before
        finally:
            await daemon.stop()
            await store.close()
            gateway.close()

    return asyncio.run(run())


def test_the_poller_holds_at_most_50_kb_per_configured_repository(
    traced: None, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    def settings(count: int) -> Settings:
        return make_settings(redis={"url": redis_url}, repositories=names(count))

    few, many = settings(1), settings(1 + MORE_REPOSITORIES)
    held_by_an_idle_poller(few)  # imports, caches and the scripts' first load
    small = held_by_an_idle_poller(few)
    large = held_by_an_idle_poller(many)
    per_repository = (large - small) / MORE_REPOSITORIES
    assert per_repository <= MAX_BYTES_PER_REPOSITORY, (
        f"{per_repository / 1e6:.3f} MB per configured repository "
        f"({small / 1e6:.1f} MB at 1, {large / 1e6:.1f} MB at {1 + MORE_REPOSITORIES})"
    )
