"""The sync pass against the GitHub simulator (real HTTP, PyGithub) and a real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from github_broker.errors import GitHubUnavailable, RateLimited
from github_broker.gateway import GitHubGateway
from github_broker.leader.poller import Daemon
from github_broker.leader.sync import Syncer
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from github_broker.store import Store

pytestmark = pytest.mark.anyio
BODY = "## Deliverables\n- a change\n\nBranch: feature/issue-xx\n"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(1000)},
            {"owner": "acme", "name": "gadgets", "issues": generate_issues(30)},
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.fixture
def settings(sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        repositories=["acme/widgets", "acme/gadgets"],
        redis={"url": redis_url},
        github={"base_url": sim.base_url, "timeout_s": 2},
    )


@pytest.fixture
async def syncer(settings: Settings) -> AsyncIterator[Syncer]:
    store = Store.from_settings(settings)
    gateway = GitHubGateway(settings.github)
    yield Syncer(settings, store, gateway)
    await store.close()
    gateway.close()


def repo(settings: Settings, name: str = "acme/widgets") -> Any:
    found = settings.repository(name)
    assert found is not None
    return found


def mirrored(
    redis_url: str, syncer: Syncer, name: str = "acme/widgets"
) -> dict[int, dict[str, Any]]:
    keys = syncer.store.repo(name).keys
    client = redis.Redis.from_url(redis_url)
    found = {}
    for key in client.scan_iter(
        match=keys.issue_prefix.replace("{", "\\{").replace("}", "\\}") + "*"
    ):
        number = int(key.decode().rsplit(":", 1)[1])
        found[number] = json.loads(client.get(key))
    client.close()
    return found


def write_calls(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    stats = client.info("commandstats")
    client.close()
    writes = (
        "cmdstat_evalsha",
        "cmdstat_eval",
        "cmdstat_set",
        "cmdstat_hset",
        "cmdstat_zadd",
        "cmdstat_sadd",
        "cmdstat_del",
        "cmdstat_hdel",
    )
    return sum(int(stats[k]["calls"]) for k in writes if k in stats)


async def test_first_sync_mirrors_1000_issues_across_pages(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    report = await syncer.sync(repo(settings))
    assert report.full and report.pages >= 10
    cached = mirrored(redis_url, syncer)
    assert len(cached) == 1000
    sample = sim.state.get_issue("acme", "widgets", 437)
    assert cached[437]["title"] == sample["title"]
    assert cached[437]["body"] == sample["body"]
    assert cached[437]["labels"] == sorted(lab["name"] for lab in sample["labels"])
    ready = await syncer.store.repo("acme/widgets").ready_tasks()
    assert len(ready) == 1000


async def test_unchanged_second_pass_writes_nothing_and_costs_only_304s(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    await syncer.sync(repo(settings))
    sim.stats.reset()
    before = write_calls(redis_url)
    report = await syncer.sync(repo(settings))
    assert not report.full and report.written == 0
    stats = sim.stats.snapshot()
    assert stats["total"] >= 1 and stats["by_status"] == {"304": stats["total"]}
    assert write_calls(redis_url) == before


async def test_unchanged_full_pass_costs_only_304s(
    sim: Simulator, settings: Settings, syncer: Syncer
) -> None:
    await syncer.sync(repo(settings))
    sim.stats.reset()
    report = await syncer.sync(repo(settings), full=True)
    assert report.written == 0 and report.removed == 0
    stats = sim.stats.snapshot()
    assert stats["by_status"] == {"304": stats["total"]} and stats["total"] == report.pages


async def test_close_relabel_edit_are_reflected_next_pass(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    await syncer.sync(repo(settings))
    sim.state.update_issue("acme", "widgets", 10, state="closed")
    sim.state.update_issue("acme", "widgets", 11, labels=["P0", "TESTER"])
    sim.state.update_issue("acme", "widgets", 12, title="Renamed", body="no deliverables here")
    created = sim.state.create_issue(
        "acme", "widgets", title="Brand new", body=BODY, labels=["P1", "BACKENDCODER"]
    )
    report = await syncer.sync(repo(settings))
    assert not report.full and report.written == 3 and report.removed == 1
    cached = mirrored(redis_url, syncer)
    assert 10 not in cached
    assert cached[11]["labels"] == ["P0", "TESTER"]
    assert cached[12]["title"] == "Renamed"
    assert created["number"] in cached
    rstore = syncer.store.repo("acme/widgets")
    skipped = await rstore.skipped()
    assert skipped[12].code == "no_deliverables"
    ready_ids = {task for task, _ in await rstore.ready_tasks()}
    assert "development:10" not in ready_ids and "development:12" not in ready_ids
    assert await rstore.bucket() == 0  # issue 11 is now P0


async def test_pull_requests_are_not_mirrored(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    pr = sim.state.create_pull("acme", "gadgets", title="A PR", head="feature/x")
    await syncer.sync(repo(settings, "acme/gadgets"))
    cached = mirrored(redis_url, syncer, "acme/gadgets")
    assert pr["number"] not in cached and len(cached) == 30


async def test_two_repositories_stay_separate(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    await syncer.sync(repo(settings))
    await syncer.sync(repo(settings, "acme/gadgets"))
    sim.state.update_issue("acme", "gadgets", 3, state="closed")
    await syncer.sync(repo(settings, "acme/gadgets"))
    widgets = mirrored(redis_url, syncer)
    gadgets = mirrored(redis_url, syncer, "acme/gadgets")
    assert len(widgets) == 1000 and 3 in widgets
    assert len(gadgets) == 29 and 3 not in gadgets


async def test_full_pass_drops_deleted_issue(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str
) -> None:
    await syncer.sync(repo(settings, "acme/gadgets"))
    sim.state.delete_issue("acme", "gadgets", 5)
    await syncer.sync(repo(settings, "acme/gadgets"), full=True)
    assert 5 not in mirrored(redis_url, syncer, "acme/gadgets")


@pytest.mark.parametrize("fault", ["5xx", "timeout", "rate_limit", "secondary"])
async def test_faults_never_corrupt_mirror_and_next_pass_catches_up(
    sim: Simulator, settings: Settings, syncer: Syncer, redis_url: str, fault: str
) -> None:
    await syncer.sync(repo(settings, "acme/gadgets"))
    before = mirrored(redis_url, syncer, "acme/gadgets")
    sim.state.update_issue("acme", "gadgets", 7, title="Changed during outage")
    if fault == "5xx":
        sim.faults.add_error(502)
    elif fault == "timeout":
        sim.faults.add_timeout(4)
    elif fault == "rate_limit":
        sim.faults.add_primary_rate_limit(reset_in=2)
    else:
        sim.faults.add_secondary_rate_limit(count=None, retry_after=17)
    expected = RateLimited if fault in {"rate_limit", "secondary"} else GitHubUnavailable
    with pytest.raises(expected) as caught:
        await syncer.sync(repo(settings, "acme/gadgets"))
    if fault == "secondary":
        assert isinstance(caught.value, RateLimited)
        assert 10 < caught.value.retry_at_s - time.time() <= 17
    assert mirrored(redis_url, syncer, "acme/gadgets") == before
    sim.faults.clear()
    if fault == "rate_limit":
        # The gateway itself holds back until the reset GitHub announced.
        with pytest.raises(RateLimited):
            await syncer.sync(repo(settings, "acme/gadgets"))
        await asyncio.sleep(max(0.0, caught.value.retry_at_s - time.time()) + 0.2)
    await syncer.sync(repo(settings, "acme/gadgets"))
    assert mirrored(redis_url, syncer, "acme/gadgets")[7]["title"] == "Changed during outage"


async def test_daemon_survives_failing_pass_and_backs_off(
    sim: Simulator, settings: Settings
) -> None:
    store = Store.from_settings(settings)
    gateway = GitHubGateway(settings.github)
    daemon = Daemon(settings, store, gateway)
    try:
        assert await daemon.hold_leadership()
        sim.faults.add_error(503)
        await daemon.sync_all()  # must not raise
        calls = sim.stats.snapshot()["total"]
        await daemon.sync_all()  # backing off: GitHub is not asked again yet
        assert sim.stats.snapshot()["total"] == calls
        sim.faults.clear()
        daemon._not_before.clear()
        await daemon.sync_all()
        assert len(await store.repo("acme/widgets").open_numbers()) == 1000
    finally:
        await daemon.stop()
        await store.close()
        gateway.close()


def test_branches_after_the_first_cost_no_quota_for_the_base_ref(
    settings: Settings, sim: Simulator
) -> None:
    gateway = GitHubGateway(settings.github)
    try:
        assert gateway.create_branch("acme/widgets", "feature/a", "main") is True
        sim.stats.reset()
        assert gateway.create_branch("acme/widgets", "feature/b", "main") is True
        assert gateway.create_branch("acme/widgets", "feature/b", "main") is False
    finally:
        gateway.close()
    stats = sim.stats.snapshot()
    assert stats["by_route"]["GET /repos/{owner}/{repo}/git/ref/{ref}"] == 2
    assert stats["rate_limited_cost"] == 2  # the two POSTs; both base-ref reads were 304s
    assert {"feature/a", "feature/b"} <= set(sim.state.branches("acme", "widgets"))


async def test_failing_review_upkeep_does_not_stop_the_sync(
    sim: Simulator, settings: Settings
) -> None:
    sim.state.add_labels("acme", "widgets", 1, ["needs-review"])
    sim.faults.add_error(403, path=r"/pulls")  # a token that cannot read pull requests
    store = Store.from_settings(settings)
    gateway = GitHubGateway(settings.github)
    daemon = Daemon(settings, store, gateway)
    try:
        assert await daemon.hold_leadership()
        await daemon.sync_all()
        assert 1 in await store.repo("acme/widgets").reviewing()
        created = sim.state.create_issue(
            "acme", "widgets", title="Later", body=BODY, labels=["P1", "BACKENDCODER"]
        )
        await daemon.sync_all()
        assert created["number"] in await store.repo("acme/widgets").open_numbers()
    finally:
        await daemon.stop()
        await store.close()
        gateway.close()
