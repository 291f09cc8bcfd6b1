"""The health and stall gauges as `/metrics` shows them (the mirror, the sync, the webhook
queue, stalled leases, work waiting on people), and the automatic revoke of a stalled lease
when `progress.revoke_stalled_after_s` is set."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from github_broker.api.app import create_app
from github_broker.errors import LeaseError
from github_broker.models import Task
from github_broker.settings import Settings
from github_broker.webhooks.receiver import WebhookReceiver
from tests.factories import body
from tests.test_webhooks import SECRET, Capture, hooked
from tests.waiting import await_until
from tests.world import REPO, World, running_world, simulated

pytestmark = pytest.mark.anyio
HEALTH = (
    "gb_mirror_rebuilding",
    "gb_sync_failing",
    "gb_webhook_queue",
    "gb_webhook_inflight",
    "gb_stalled_leases",
    "gb_waiting_on_people",
)
AGE = "gb_webhook_last_delivery_age_seconds"


def issues() -> list[dict[str, Any]]:
    return [
        {"number": 1, "title": "work", "body": body(), "labels": ["P1", "BACKENDCODER"]},
        {"number": 2, "title": "given up", "body": body(), "labels": ["P1", "needs-human"]},
    ]


def gauges(api: TestClient) -> dict[str, float]:
    """acme/widgets's value of each per-repository gauge on /metrics."""
    answer = api.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.labels.get("repository") == REPO
    }


def health(api: TestClient) -> dict[str, float]:
    seen = gauges(api)
    missing = [name for name in HEALTH if name not in seen]
    assert not missing, f"gauges missing from /metrics: {missing}"
    return {name: seen[name] for name in HEALTH}


@pytest.fixture
def capture() -> Iterator[Capture]:
    c = Capture()
    yield c
    c.close()


async def test_metrics_show_the_mirror_the_sync_the_webhook_queue_stalls_and_waiting_work(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(issues()) as sim:
        async with running_world(
            sim,
            redis_url,
            make_settings,
            server={"run_poller": False},
            webhooks={"secret": SECRET},
            progress={"stall_after_s": 0.3},
        ) as world:
            with TestClient(create_app(world.settings)) as api:
                await _gauges_through_a_day(world, sim, api, capture)


async def _gauges_through_a_day(world: World, sim: Any, api: TestClient, capture: Capture) -> None:
    quiet = {name: 0.0 for name in HEALTH}
    before = gauges(api)
    assert before["gb_mirror_rebuilding"] == 1 and AGE not in before  # no sync, no delivery
    await world.tick()
    assert health(api) == {**quiet, "gb_waiting_on_people": 1}  # #2 is labelled needs-human
    # A held task with no progress is flagged stalled by the next look past stall_after_s.
    task = await world.ask("quiet-agent")
    assert task is not None and task.issue_id == 1

    async def stalled() -> float:
        await world.daemon.progress_all()
        return health(api)["gb_stalled_leases"]

    await await_until(stalled, 5, "the quiet lease flagged stalled")
    # GitHub's issue listing fails: the sync is marked failing (webhooks not proven healthy
    # yet: the pass syncs).
    sim.faults.add_error(404, method="GET", path=r"/issues$")
    await world.tick()
    assert health(api)["gb_sync_failing"] == 1
    # A delivery verified and queued, not yet applied; then taken by the worker.
    hooked(sim, capture.url)
    sim.state.add_labels("acme", "widgets", 1, ["P2"])
    assert sim.webhooks.wait_idle()
    headers, data = next((h, b) for h, b in capture.deliveries if h["x-github-event"] != "ping")
    receipt = await WebhookReceiver(world.settings, world.store).accept(
        headers["x-github-event"], headers["x-github-delivery"], data
    )
    assert receipt.status == "queued"
    seen = gauges(api)
    assert seen["gb_webhook_queue"] == 1 and seen["gb_webhook_inflight"] == 0
    assert 0 <= seen[AGE] < 60
    assert await world.rstore.take_webhook(1.0) is not None
    seen = gauges(api)
    assert seen["gb_webhook_queue"] == 0 and seen["gb_webhook_inflight"] == 1
    # Redis loses the mirror: it is being rebuilt until a sync succeeds.
    await world.store.client.delete(world.rstore.keys.mirror)
    assert gauges(api)["gb_mirror_rebuilding"] == 1


async def claimed_and_stalled(world: World, agent: str) -> Task:
    await world.tick()
    task = await world.ask(agent)
    assert task is not None and task.issue_id == 1

    async def flagged() -> bool:
        await world.daemon.progress_all()
        return any(lease.stalled for lease in await world.rstore.leases())

    await await_until(flagged, 5, "the lease flagged stalled")
    return task


@pytest.mark.parametrize("revoke_after_s", [0.8, 0.0], ids=["revoke-set", "revoke-off"])
async def test_a_stalled_lease_is_revoked_after_revoke_stalled_after_s_and_never_without_it(
    redis_url: str, make_settings: Callable[..., Settings], revoke_after_s: float
) -> None:
    progress = {"stall_after_s": 0.3, "revoke_stalled_after_s": revoke_after_s}
    with simulated(issues()) as sim:
        async with running_world(sim, redis_url, make_settings, progress=progress) as world:
            task = await claimed_and_stalled(world, "quiet-agent")
            token = task.lease.token

            async def revoked() -> str:
                await world.daemon.progress_all()
                try:
                    await world.tasks.heartbeat(REPO, 1, "quiet-agent", token)
                except LeaseError as e:
                    return str(e.reason)
                return ""

            if revoke_after_s:
                reason = await await_until(revoked, 5, "the stalled lease revoked")
                assert reason == "revoked", reason
                again = await world.ask("other-agent")  # back in the pool
                assert again is not None and again.issue_id == 1
            else:
                # Looked at for as long as the revoke would take when set, and then some.
                watched = time.monotonic() + 1.2
                while time.monotonic() < watched:
                    assert await revoked() == "", "revoked with revoke_stalled_after_s 0"
                    await asyncio.sleep(0.1)
                assert await world.ask("other-agent") is None
