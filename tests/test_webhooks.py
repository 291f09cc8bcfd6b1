"""Webhooks: the endpoint, the queue (real Redis), targeted updates from the simulator's
deliveries, out-of-order and duplicate deliveries, and the payload shapes."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
import requests
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.keys import RepoKeys
from github_broker.leader.deliveries import WebhookWorker
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import Store
from github_broker.webhooks import receiver as receiver_module
from github_broker.webhooks.receiver import RefusalLog, WebhookReceiver, signature_ok
from tests.factories import body
from tests.world import REPO, World, running_world, simulated

SECRET = "It's a Secret to Everybody"
T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


def sign(data: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


class Capture:
    """A tiny HTTP endpoint that records the simulator's deliveries (headers and body)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[dict[str, str], bytes]] = []
        captured = self.deliveries

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                captured.append(({k.lower(): v for k, v in self.headers.items()}, data))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        return [(h["x-github-event"], json.loads(b)) for h, b in self.deliveries]


@pytest.fixture
def capture() -> Iterator[Capture]:
    c = Capture()
    yield c
    c.close()


def hooked(sim: Simulator, url: str, secret: str = SECRET) -> None:
    sim.webhooks.add_hook(sim.state, {"url": url, "secret": secret, "repository": REPO})
    assert sim.webhooks.wait_idle()


def at(sim: Simulator, seconds: int) -> None:
    """Freeze the simulator's clock: every change it makes is stamped T0 + seconds."""
    moment = T0 + timedelta(seconds=seconds)
    sim.state.clock = lambda: moment


async def deliver(world: World, capture: Capture, order: list[int] | None = None) -> list[str]:
    """Hand the captured deliveries (pings left out) to the broker's receiver, then apply."""
    assert world.sim.webhooks.wait_idle()
    receiver = WebhookReceiver(world.settings, world.store)
    items = [(h, b) for h, b in capture.deliveries if h["x-github-event"] != "ping"]
    statuses = []
    for i in order if order is not None else range(len(items)):
        headers, data = items[i]
        receiver.verify(data, headers["x-hub-signature-256"])
        receipt = await receiver.accept(
            headers["x-github-event"], headers["x-github-delivery"], data
        )
        statuses.append(receipt.status)
    repo = world.settings.repositories[0]
    await world.daemon.webhooks.drain(repo)
    return statuses


def list_calls(sim: Simulator) -> int:
    routes = sim.stats.snapshot()["by_route"]
    return sum(v for k, v in routes.items() if k.startswith("GET") and k.endswith("/issues"))


def unlabelled_issue() -> list[dict[str, Any]]:
    return [
        {
            "number": 1,
            "title": "Add CSV export",
            "body": body(),
            "labels": ["BACKENDCODER"],
            "created_at": "2026-10-01T00:00:00Z",
        }
    ]


# --- the endpoint ---------------------------------------------------------------------------


@pytest.fixture
def client(redis_url: str, make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    settings = make_settings(
        redis={"url": redis_url},
        server={"run_poller": False},
        webhooks={"secret": SECRET, "max_body_bytes": 4096},
    )
    with TestClient(create_app(settings)) as c:
        yield c


def post(client: TestClient, data: bytes, signature: str | None, delivery: str = "d-1") -> Any:
    headers = {"X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    return client.post("/github/webhook", content=data, headers=headers)


def queued(redis_url: str) -> int:
    keys = RepoKeys("gb", "acme", "widgets")
    return int(redis.Redis.from_url(redis_url).llen(keys.webhooks))


PAYLOAD = json.dumps(
    {
        "action": "labeled",
        "issue": {"number": 1, "updated_at": "2026-11-01T12:00:00Z"},
        "repository": {"full_name": REPO},
    }
).encode()


def test_mis_signed_and_unsigned_deliveries_get_401_and_change_nothing(
    client: TestClient, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_module, "SIGNATURE_REFUSALS", RefusalLog())
    assert post(client, PAYLOAD, sign(PAYLOAD, "wrong secret")).status_code == 401
    assert post(client, PAYLOAD, sign(PAYLOAD + b" ")).status_code == 401
    assert post(client, PAYLOAD, "sha1=" + "0" * 40).status_code == 401
    r = post(client, PAYLOAD, None)
    assert r.status_code == 401 and "X-Hub-Signature-256" in r.json()["detail"]
    assert queued(redis_url) == 0
    # Not even the delivery id: only the refusal, for the integrations' health (the first
    # of the minute; the other three are counted with the next report).
    assert redis.Redis.from_url(redis_url).keys() == [b"gb:webhooks:refused"]


def test_signed_delivery_is_queued_once(client: TestClient, redis_url: str) -> None:
    first = post(client, PAYLOAD, sign(PAYLOAD))
    assert first.status_code == 202 and first.json()["status"] == "queued"
    again = post(client, PAYLOAD, sign(PAYLOAD))
    assert again.status_code == 200 and again.json()["status"] == "duplicate"
    assert queued(redis_url) == 1


def test_oversized_unknown_and_foreign_deliveries_are_refused(
    client: TestClient, redis_url: str
) -> None:
    big = json.dumps({"repository": {"full_name": REPO}, "pad": "x" * 5000}).encode()
    r = post(client, big, sign(big))
    assert r.status_code == 413 and r.json()["reason"] == "too_large"
    foreign = json.dumps({"action": "opened", "repository": {"full_name": "x/y"}}).encode()
    r = post(client, foreign, sign(foreign), "d-2")
    assert r.status_code == 404 and "x/y" in r.json()["detail"]
    r = client.post(
        "/github/webhook",
        content=PAYLOAD,
        headers={
            "X-GitHub-Event": "star",
            "X-GitHub-Delivery": "d-3",
            "X-Hub-Signature-256": sign(PAYLOAD),
        },
    )
    assert r.status_code == 200 and r.json()["status"] == "ignored"
    shapeless = json.dumps({"action": "labeled", "repository": {"full_name": REPO}}).encode()
    r = post(client, shapeless, sign(shapeless), "d-4")
    assert r.status_code == 422 and "issue.number" in r.json()["detail"]
    assert queued(redis_url) == 0
    assert "/github/webhook" in client.get("/openapi.json").json()["paths"]


def test_signature_check_is_hmac_sha256_of_the_raw_body() -> None:
    # GitHub's documented example (docs.github.com, "Validating webhook deliveries").
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert signature_ok(SECRET.encode(), b"Hello, World!", expected)
    assert not signature_ok(SECRET.encode(), b"Hello, World?", expected)


@pytest.mark.anyio
async def test_queue_script_dedupes_and_survives_a_crashed_worker(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    store = Store.from_settings(make_settings(redis={"url": lua_redis_url}))
    rstore = store.repo(REPO)
    try:
        assert await rstore.enqueue_webhook("a", "d1", '{"n":1}', 60) == "queued"
        assert await rstore.enqueue_webhook("a", "d1", '{"n":1}', 60) == "duplicate"
        # The same signed body under a fresh id: a replay, and no proof of a live webhook.
        client = store.client
        await client.delete(rstore.keys.webhooks_seen)
        assert await rstore.enqueue_webhook("z", "d1", '{"n":1}', 60) == "replay"
        assert not await rstore.webhooks_seen_ms()
        assert await rstore.enqueue_webhook("b", "d2", '{"n":2}', 60) == "queued"
        assert await rstore.webhooks_seen_ms()
        assert await rstore.take_webhook(0.1) == '{"n":1}'  # oldest first
        # The worker dies here: a new leader puts the delivery back first in line.
        assert await rstore.requeue_inflight_webhooks() == 1
        assert await rstore.take_webhook(0) == '{"n":1}'
        await rstore.webhook_done('{"n":1}')
        assert await rstore.take_webhook(0) == '{"n":2}'
        await rstore.webhook_done('{"n":2}')
        assert await rstore.requeue_inflight_webhooks() == 0
        assert await rstore.take_webhook(0) is None
    finally:
        await store.close()


@pytest.mark.anyio
async def test_a_delivery_that_breaks_the_worker_does_not_stop_the_ones_after_it(
    redis_url: str, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(redis={"url": redis_url}, webhooks={"secret": SECRET})
    store = Store.from_settings(settings)
    rstore = store.repo(REPO)
    worker = WebhookWorker(settings, store, None, None, None, None)  # type: ignore[arg-type]
    applied: list[str] = []

    async def apply(repo: Any, rs: Any, envelope: str) -> str:
        if envelope == '{"n":1}':
            raise RuntimeError("a defect in applying this delivery")
        applied.append(envelope)
        return "applied"

    monkeypatch.setattr(worker, "apply", apply)
    try:
        assert await rstore.enqueue_webhook("a", "d1", '{"n":1}', 60) == "queued"
        assert await rstore.enqueue_webhook("b", "d2", '{"n":2}', 60) == "queued"
        worker.start(lambda: True)
        deadline = time.monotonic() + 10
        while not applied and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert applied == ['{"n":2}']
        await asyncio.sleep(0.2)  # the worker marks n:2 done right after applying it
        await worker.stop()
        # The broken one stays in flight, re-queued when a leader starts again.
        assert await rstore.requeue_inflight_webhooks() == 1
        assert await rstore.take_webhook(0) == '{"n":1}'
    finally:
        await worker.stop()
        await store.close()


# --- targeted updates from the simulator's deliveries ---------------------------------------


@pytest.mark.anyio
async def test_label_added_makes_issue_claimable_without_a_list_call(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(unlabelled_issue()) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            await w.tick()
            assert await w.ask("early") is None
            hooked(sim, capture.url)
            calls = sim.stats.snapshot()["total"]
            sim.state.add_labels("acme", "widgets", 1, ["P1"])
            assert await deliver(w, capture) == ["queued"]
            assert sim.stats.snapshot()["total"] == calls  # the payload was enough
            task = await w.ask("agent-1")
            assert task is not None and task.issue_id == 1


@pytest.mark.anyio
async def test_reordered_and_duplicated_deliveries_never_roll_back(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    issues = [{**unlabelled_issue()[0], "labels": ["P1", "BACKENDCODER"]}]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            await w.tick()
            hooked(sim, capture.url)
            at(sim, 1)
            sim.state.remove_label("acme", "widgets", 1, "P1")  # delivery 0 (older)
            at(sim, 2)
            sim.state.add_labels("acme", "widgets", 1, ["P2"])  # delivery 1 (newer)
            before = list_calls(sim)
            statuses = await deliver(w, capture, order=[1, 0, 1, 0])
            assert statuses == ["queued", "queued", "duplicate", "duplicate"]
            cached = await w.rstore.get_issue(1)
            assert cached is not None and cached.labels == ["BACKENDCODER", "P2"]
            assert await w.rstore.bucket() == 2
            assert list_calls(sim) == before
            task = await w.ask("agent-1")
            assert task is not None and task.issue_id == 1


@pytest.mark.anyio
async def test_changes_within_one_second_in_either_order_end_as_on_github(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(unlabelled_issue()) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            await w.tick()
            hooked(sim, capture.url)
            at(sim, 5)
            sim.state.add_labels("acme", "widgets", 1, ["P1"])
            sim.state.remove_label("acme", "widgets", 1, "P1")
            await deliver(w, capture, order=[1, 0])
            cached = await w.rstore.get_issue(1)
            assert cached is not None and cached.labels == ["BACKENDCODER"]
            assert await w.ask("agent-1") is None


@pytest.mark.anyio
async def test_a_late_delivery_does_not_bring_back_a_closed_issue(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(unlabelled_issue()) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            await w.tick()
            hooked(sim, capture.url)
            at(sim, 1)
            sim.state.add_labels("acme", "widgets", 1, ["P1"])
            at(sim, 2)
            sim.state.update_issue("acme", "widgets", 1, state="closed")
            await deliver(w, capture, order=[1, 0])
            assert await w.rstore.get_issue(1) is None
            assert await w.ask("agent-1") is None
            assert 1 not in await w.rstore.open_numbers()


@pytest.mark.anyio
async def test_lost_deliveries_are_recovered_by_the_poll(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(unlabelled_issue()) as sim:
        overrides: dict[str, Any] = {
            "webhooks": {"secret": SECRET},
            "poll": {"interval_with_webhooks_s": 0.2},
        }
        async with running_world(sim, redis_url, make_settings, **overrides) as w:
            await w.tick()
            hooked(sim, capture.url)
            sim.webhooks.add_fault({"kind": "lose"})
            sim.state.add_labels("acme", "widgets", 1, ["P1"])
            assert await deliver(w, capture) == []  # lost on the way
            assert await w.ask("agent-1") is None
            await asyncio.sleep(0.3)
            await w.tick()  # the safety net: the poll's incremental pass
            task = await w.ask("agent-1")
            assert task is not None and task.issue_id == 1


@pytest.mark.anyio
async def test_poll_stretches_while_webhooks_are_healthy(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    with simulated(unlabelled_issue()) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            await w.tick()
            first = list_calls(sim)
            await w.tick()  # no webhook seen yet: the poll runs as usual
            assert list_calls(sim) > first
            hooked(sim, capture.url)
            sim.state.add_labels("acme", "widgets", 1, ["P1"])
            await deliver(w, capture)  # proves the webhook alive
            calls = list_calls(sim)
            await w.tick()
            assert list_calls(sim) == calls  # within poll.interval_with_webhooks_s
            await w.rstore.save_sync_state({"full_at": "0"})  # a full pass is due
            await w.tick()
            assert list_calls(sim) > calls


# --- payload shapes -------------------------------------------------------------------------

SCHEMAS = json.loads(
    (Path(__file__).parent / "fixtures" / "webhook_schemas" / "schema.json").read_text()
)


def test_simulator_deliveries_match_githubs_published_schemas(capture: Capture) -> None:
    with simulated(unlabelled_issue()) as sim:
        hooked(sim, capture.url)
        st = sim.state
        st.update_issue("acme", "widgets", 1, title="Export CSV", body="new body")
        st.add_labels("acme", "widgets", 1, ["P1"])
        st.remove_label("acme", "widgets", 1, "P1")
        st.add_issue_comment("acme", "widgets", 1, user="maintainer", body="please hurry")
        st.update_issue("acme", "widgets", 1, state="closed")
        st.update_issue("acme", "widgets", 1, state="open")
        st.create_issue("acme", "widgets", title="Another", labels=["P2"])
        pr = st.create_pull(
            "acme", "widgets", title="CSV", head="feature/issue-1", body="Closes #1"
        )
        n = pr["number"]
        st.add_labels("acme", "widgets", n, ["needs-review"])
        st.remove_label("acme", "widgets", n, "needs-review")
        st.update_pull("acme", "widgets", n, title="CSV export")
        st.add_review("acme", "widgets", n, user="rev", body="change this", state="REQUEST_CHANGES")
        st.add_review_comment("acme", "widgets", n, user="rev", body="here", path="a.py", line=3)
        st.add_issue_comment("acme", "widgets", n, user="rev", body="and the docs")
        st.update_pull("acme", "widgets", n, state="closed")
        st.update_pull("acme", "widgets", n, state="open")
        st.delete_issue("acme", "widgets", 2)
        assert sim.webhooks.wait_idle()
    seen = set()
    for headers, data in capture.deliveries:
        assert headers["user-agent"].startswith("GitHub-Hookshot/")
        assert headers["x-hub-signature-256"] == sign(data)
        event, payload = headers["x-github-event"], json.loads(data)
        if event == "ping":
            continue
        name = f"{event}${payload['action']}"
        seen.add(name)
        validator = jsonschema.Draft7Validator({**SCHEMAS, "$ref": f"#/definitions/{name}"})
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(payload)]
        assert not errors, f"{name}: {errors[:5]}"
    wanted = (
        {
            f"issues${a}"
            for a in ("opened", "edited", "labeled", "unlabeled", "closed", "reopened", "deleted")
        }
        | {
            f"pull_request${a}"
            for a in ("opened", "edited", "labeled", "unlabeled", "closed", "reopened")
        }
        | {
            "pull_request_review$submitted",
            "pull_request_review_comment$created",
            "issue_comment$created",
        }
    )
    assert seen == wanted


@pytest.mark.anyio
async def test_pull_request_event_offers_the_review_without_listing_pulls(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    issues = [{**unlabelled_issue()[0], "labels": ["P1", "BACKENDCODER", "needs-review"]}]
    with simulated(issues) as sim:
        overrides: dict[str, Any] = {"webhooks": {"secret": SECRET}, "review": {"delay_s": 0}}
        async with running_world(sim, redis_url, make_settings, **overrides) as w:
            await w.tick()  # no PR yet: nothing to review
            assert await w.ask("reviewer") is None
            hooked(sim, capture.url)
            pulls_route = "GET /repos/{owner}/{repo}/pulls"
            listed = sim.stats.snapshot()["by_route"].get(pulls_route, 0)
            sim.state.create_pull(
                "acme", "widgets", title="CSV export", head="feature/issue-1", body="Closes #1"
            )
            assert await deliver(w, capture) == ["queued"]
            assert sim.stats.snapshot()["by_route"].get(pulls_route, 0) == listed
            task = await w.ask("reviewer")
            assert task is not None and task.task_type == "review" and task.issue_id == 1


def test_simulator_delivery_faults_through_the_control_api(capture: Capture) -> None:
    with simulated(unlabelled_issue()) as sim:
        control = f"{sim.base_url}/_sim/webhooks"
        spec = {"url": capture.url, "secret": SECRET, "repository": REPO}
        assert requests.post(control, json=spec, timeout=5).status_code == 201
        assert sim.webhooks.wait_idle()
        capture.deliveries.clear()  # the ping

        def change(label: str) -> None:
            sim.state.add_labels("acme", "widgets", 1, [label])
            assert sim.webhooks.wait_idle()

        def labels() -> list[str]:
            return [p["label"]["name"] for _, p in capture.events()]

        requests.post(f"{control}/faults", json={"kind": "lose", "count": 1}, timeout=5)
        change("a")
        change("b")
        assert labels() == ["b"]
        requests.post(f"{control}/faults", json={"kind": "duplicate", "count": 1}, timeout=5)
        change("c")
        guids = [h["x-github-delivery"] for h, _ in capture.deliveries]
        assert labels() == ["b", "c", "c"] and guids[-1] == guids[-2]
        requests.post(f"{control}/faults", json={"kind": "reorder", "window": 2}, timeout=5)
        change("d")
        assert labels() == ["b", "c", "c"]  # held until the window is full
        change("e")
        assert labels() == ["b", "c", "c", "e", "d"]
        requests.delete(f"{control}/faults", timeout=5)
        requests.post(f"{control}/faults", json={"kind": "delay", "delay_ms": 300}, timeout=5)
        started = time.monotonic()
        change("f")
        assert labels()[-1] == "f" and time.monotonic() - started >= 0.3
        shown = requests.get(control, timeout=5).json()
        assert shown["hooks"][0]["url"] == capture.url
        assert [d["status"] for d in shown["deliveries"]].count("lost") == 1
        bad = requests.post(f"{control}/faults", json={"kind": "explode"}, timeout=5)
        assert bad.status_code == 422


def test_ping_proves_the_webhook_alive_and_odd_bodies_get_4xx(
    client: TestClient, redis_url: str
) -> None:
    ping = json.dumps({"zen": "Keep it logically awesome.", "repository": {"full_name": REPO}})
    data = ping.encode()
    headers = {"X-GitHub-Event": "ping", "X-GitHub-Delivery": "p-1"}
    r = client.post(
        "/github/webhook", content=data, headers={**headers, "X-Hub-Signature-256": sign(data)}
    )
    assert r.status_code == 200 and r.json()["status"] == "pong"
    keys = RepoKeys("gb", "acme", "widgets")
    assert redis.Redis.from_url(redis_url).get(keys.webhooks_seen)
    assert queued(redis_url) == 0
    nested = b"[" * 1_500 + b"]" * 1_500  # deeper than Python's recursion limit, under the cap
    issue = {"number": 10**30, "updated_at": "2026-01-01T00:00:00Z", "labels": []}
    bad_number = json.dumps({"repository": {"full_name": REPO}, "issue": issue}).encode()
    bad_time = bad_number.replace(b"1000000000000000000000000000000", b"2").replace(
        b"2026-01-01T00:00:00Z", b"not a date"
    )
    bad_labels = bad_number.replace(b"1000000000000000000000000000000", b"2").replace(
        b'"labels": []', b'"labels": [null, 5]'
    )
    odd_bodies = (b"\xff\xfe{}", b"[1, 2]", json.dumps({"repository": "acme/widgets"}).encode())
    for odd in (*odd_bodies, nested, bad_number, bad_time, bad_labels):
        r = post(client, odd, sign(odd), "odd")
        assert r.status_code in (404, 422), (odd, r.status_code, r.text)


@pytest.mark.anyio
async def test_a_sync_page_read_before_a_delivered_close_does_not_reopen_the_issue(
    redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    """The sync reads GitHub in a worker thread while the webhook worker goes on: a page read
    just before the issue closed lands after the close's delivery removed the issue. Without
    a trace of the removal the stale page put the closed issue back in the pool, claimable
    until the next incremental pass (poll.interval_with_webhooks_s while webhooks are
    healthy)."""
    issues = [{**unlabelled_issue()[0], "labels": ["P1", "BACKENDCODER"]}]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            at(sim, 1)
            await w.tick()
            hooked(sim, capture.url)
            loop = asyncio.get_running_loop()
            gateway = w.daemon.syncer.gateway
            real = gateway.issues_page
            raced: list[int] = []

            def page_then_close(*args: Any, **kwargs: Any) -> Any:
                page = real(*args, **kwargs)
                if any(d["number"] == 1 for d in page.items):
                    raced.append(1)
                if len(raced) == 2:  # the pass's last request: the one it ends on
                    at(sim, 2)
                    sim.state.update_issue("acme", "widgets", 1, state="closed")
                    coro = deliver(w, capture)
                    statuses = asyncio.run_coroutine_threadsafe(coro, loop).result(10)
                    assert statuses == ["queued", "queued"]  # the edit, the close
                return page

            gateway.issues_page = page_then_close  # type: ignore[method-assign]
            sim.state.update_issue("acme", "widgets", 1, title="Add CSV export (v2)")
            await w.daemon.syncer.sync(w.settings.repositories[0], full=False)
            assert len(raced) == 2
            assert await w.rstore.get_issue(1) is None
            assert 1 not in await w.rstore.open_numbers()
            assert await w.ask("agent-1") is None


def test_every_event_the_receiver_queues_has_a_handler_in_the_leader() -> None:
    """The receiver's events (webhooks/payloads.py) and the worker's handler table agree: a
    queued delivery is never dropped as `ignored`."""
    from github_broker.leader.deliveries import HANDLERS
    from github_broker.webhooks.payloads import EVENTS

    assert set(EVENTS) == set(HANDLERS)
