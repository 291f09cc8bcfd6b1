"""The Python SDK: against a scripted HTTP stub (retries, timeouts) and a real `serve` process."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from github_broker.agent.client import (
    MAX_NOTE_CHARS,
    AgentPaused,
    BrokerClient,
    BrokerClientError,
    BrokerUnavailable,
    LeaseLost,
    RequestRejected,
    Unauthorized,
    Usage,
)
from github_broker.api.schemas import MAX_NOTE_CHARS as BROKER_MAX_NOTE_CHARS
from github_broker.models import Task
from tests.conftest import free_port
from tests.processes import LiveStack

TOKENS = {a: f"tok-{a}-0123456789" for a in ("agent-a", "agent-b", "agent-c")}
#: The broker of the live tests knows each agent by its bearer token.
pytestmark = pytest.mark.live_stack(
    issues=2,
    env={"GITHUB_BROKER_SERVER__AGENT_TOKENS": json.dumps(TOKENS)},
)

TASK_JSON = {
    "issue_id": 7,
    "issue_url": "https://github.com/acme/widgets/issues/7",
    "title": "t",
    "body": "b",
    "labels": ["P1"],
    "branch_name": "feature/issue-7",
    "prompt": "p",
    "required_role": "BACKENDCODER",
    "task_type": "development",
    "repository": "acme/widgets",
    "base_branch": "main",
    "lease": {
        "token": "lease-1",
        "expires_at": "2026-01-01T00:00:00Z",
        "heartbeat_interval_s": 200,
    },
}


# --- a scripted stub: what the client does with each kind of answer ------------------------


@dataclass
class Reply:
    status: int
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class _StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, replies: list[Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _StubHandler)
        self.replies = replies
        self.seen: list[dict[str, Any]] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hung up on a delayed answer: that is the point of the test


class _StubHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server: _StubServer = self.server  # type: ignore[assignment]
        length = int(self.headers.get("Content-Length") or 0)
        server.seen.append(json.loads(self.rfile.read(length) or b"{}"))
        reply = server.replies.pop(0)
        time.sleep(reply.delay_s)
        payload = json.dumps(reply.body).encode() if reply.body is not None else b""
        self.send_response(reply.status)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def stub() -> Iterator[Callable[..., tuple[BrokerClient, _StubServer]]]:
    servers: list[_StubServer] = []
    clients: list[BrokerClient] = []

    def start(*replies: Reply, **client_options: Any) -> tuple[BrokerClient, _StubServer]:
        server = _StubServer(list(replies))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        options = {"retries": 3, "backoff_s": 0.01, "timeout_s": 2.0, **client_options}
        client = BrokerClient(f"http://127.0.0.1:{server.server_address[1]}", "agent-a", **options)
        clients.append(client)
        return client, server

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.shutdown()
        server.server_close()


def test_503_is_retried_honouring_retry_after_then_the_answer_counts(stub: Any) -> None:
    client, server = stub(Reply(503, {"detail": "redis down"}, {"Retry-After": "0.3"}), Reply(204))
    started = time.monotonic()
    assert client.request_task() is None
    assert time.monotonic() - started >= 0.3
    assert len(server.seen) == 2


def test_503_until_retries_run_out_raises_unavailable_not_none(stub: Any) -> None:
    client, server = stub(
        *[Reply(503, {"detail": "redis down"}, {"Retry-After": "0"})] * 3, retries=2
    )
    with pytest.raises(BrokerUnavailable) as err:
        client.request_task()
    assert err.value.status == 503
    assert len(server.seen) == 3


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, Unauthorized), (403, Unauthorized), (409, LeaseLost), (422, RequestRejected)],
)
def test_4xx_is_raised_at_once_without_retry(
    stub: Any, status: int, error: type[BrokerClientError]
) -> None:
    client, server = stub(Reply(status, {"detail": "no", "reason": "revoked"}))
    with pytest.raises(error) as err:
        client.heartbeat(Task.model_validate(TASK_JSON))
    assert err.value.status == status
    assert len(server.seen) == 1
    if status == 409:
        assert err.value.reason == "revoked"


STEERED_BEAT = {
    "expires_at": "2026-11-20T12:20:00Z",
    "state": "waiting_for_user",
    "notes": [{"by": "alice", "text": "Use the new parser.", "at": "2026-11-20T12:11:00Z"}],
    "paused": {"code": "budget", "detail": "1200 tokens, budget 1000", "at": "2026-11-20T12:12Z"},
    "agent_paused": {"kind": "pause", "by": "bob", "reason": "rota", "at": "2026-11-20T12:13Z"},
}


def test_heartbeat_sends_note_and_usage_and_returns_the_whole_answer(stub: Any) -> None:
    client, server = stub(Reply(200, STEERED_BEAT))
    answer = client.heartbeat(
        Task.model_validate(TASK_JSON), note="x" * 600, usage=Usage(tokens=1200, cost=0.5)
    )
    sent = server.seen[0]
    assert sent["usage"] == {"tokens": 1200, "cost": 0.5}
    # Cut to the broker's limit: a long note never costs a heartbeat its lease.
    assert len(sent["note"]) == MAX_NOTE_CHARS == BROKER_MAX_NOTE_CHARS
    assert answer.state == "waiting_for_user"
    assert [(n.by, n.text) for n in answer.notes] == [("alice", "Use the new parser.")]
    assert answer.paused is not None and answer.paused.code == "budget"
    assert answer.agent_paused is not None and answer.agent_paused.by == "bob"


def test_a_revoke_raises_lease_lost_with_the_maintainers_words(stub: Any) -> None:
    words = "lease on acme/widgets#7 not extended: revoked (revoked by alice: wrong approach)"
    client, _ = stub(Reply(409, {"detail": words, "reason": "revoked"}))
    with pytest.raises(LeaseLost) as err:
        client.heartbeat(Task.model_validate(TASK_JSON))
    assert (err.value.reason, err.value.detail) == ("revoked", words)


def test_a_paused_agents_task_request_raises_agent_paused_not_lease_lost(stub: Any) -> None:
    words = "agent agent-a is paused by alice: rota. A maintainer resumes it with …"
    client, server = stub(Reply(409, {"detail": words, "reason": "agent_paused"}))
    with pytest.raises(AgentPaused) as err:
        client.request_task()
    assert not isinstance(err.value, LeaseLost)
    assert (err.value.status, err.value.reason, err.value.detail) == (409, "agent_paused", words)
    assert len(server.seen) == 1


def test_retry_after_a_lost_answer_repeats_the_same_request_id(stub: Any) -> None:
    client, server = stub(Reply(200, TASK_JSON, delay_s=1.0), Reply(200, TASK_JSON), timeout_s=0.3)
    task = client.request_task(previous="completed")
    assert task is not None and task.issue_id == 7
    # The broker answers a repeated request id with the first attempt's hand-out.
    first, retry = server.seen
    assert first == retry and first["request_id"] and first["previous"] == "completed"
    client, server = stub(Reply(204), Reply(204))
    client.request_task()
    client.request_task()
    assert server.seen[0]["request_id"] != server.seen[1]["request_id"]


def test_complete_retried_after_a_lost_answer_accepts_its_own_tombstone(stub: Any) -> None:
    client, server = stub(
        Reply(200, {"status": "completed"}, delay_s=1.0),
        Reply(409, {"detail": "gone", "reason": "completed"}),
        timeout_s=0.3,
    )
    client.complete(Task.model_validate(TASK_JSON))
    assert len(server.seen) == 2


def test_unreachable_broker_raises_unavailable() -> None:
    with (
        BrokerClient(
            f"http://127.0.0.1:{free_port()}", "agent-a", retries=2, backoff_s=0.01
        ) as client,
        pytest.raises(BrokerUnavailable),
    ):
        client.request_task()


# --- against a real broker process ---------------------------------------------------------


@pytest.fixture
def agent(stack: LiveStack) -> Iterator[Callable[..., BrokerClient]]:
    clients: list[BrokerClient] = []

    def make(agent_id: str, **options: Any) -> BrokerClient:
        options = {"token": TOKENS.get(agent_id), "backoff_s": 0.1, **options}
        client = BrokerClient(stack.broker.url, agent_id, **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.mark.slow
def test_task_lifecycle_and_lease_lost_reasons(agent: Callable[..., BrokerClient]) -> None:
    a, b = agent("agent-a"), agent("agent-b")
    task = a.request_task()
    assert task is not None and task.repository == "acme/widgets"
    assert task.branch_name == f"feature/issue-{task.issue_id}"

    assert datetime.fromisoformat(a.heartbeat(task).expires_at.replace("Z", "+00:00"))
    with pytest.raises(LeaseLost) as err:
        b.heartbeat(task)
    assert err.value.reason == "not_owner"

    a.complete(task)
    with pytest.raises(LeaseLost) as err:
        a.heartbeat(task)
    assert err.value.reason == "completed"


@pytest.mark.slow
def test_release_wakes_a_long_poll_and_no_task_is_none(agent: Callable[..., BrokerClient]) -> None:
    a, b, c = agent("agent-a"), agent("agent-b"), agent("agent-c")
    held = [a.request_task(), b.request_task()]
    assert all(t is not None for t in held)
    assert c.request_task() is None
    assert c.request_task(roles=["TESTER"]) is None

    got: list[Task | None] = []
    waiter = threading.Thread(target=lambda: got.append(c.request_task(wait_seconds=20)))
    waiter.start()
    time.sleep(0.5)
    released = time.monotonic()
    first = held[0]
    assert first is not None
    a.release(first, "failed")
    waiter.join(timeout=25)
    assert got and got[0] is not None and got[0].issue_id == first.issue_id
    assert time.monotonic() - released < 5


@pytest.mark.slow
def test_errors_from_the_broker_are_raised(agent: Callable[..., BrokerClient]) -> None:
    with pytest.raises(Unauthorized) as err:
        agent("agent-a", token="wrong").request_task()
    assert err.value.status == 401
    with pytest.raises(Unauthorized) as err:
        agent("agent-a", token=TOKENS["agent-b"]).request_task()
    assert err.value.status == 403
    with pytest.raises(RequestRejected) as rejected:
        agent("agent-a").request_task(roles=["NO_SUCH_ROLE"])
    assert rejected.value.status == 422
    with pytest.raises(RequestRejected):
        agent("agent-a").request_task(wait_seconds=600)


@pytest.mark.slow
def test_long_poll_survives_a_broker_killed_and_restarted_mid_call(
    stack: LiveStack, agent: Callable[..., BrokerClient], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="github_broker.agent.client")
    a, b = agent("agent-a"), agent("agent-b")
    first, second = a.request_task(), b.request_task()
    assert first is not None and second is not None
    c = agent("agent-c", retries=20, backoff_s=0.2)
    got: list[Task | None] = []
    errors: list[Exception] = []

    def wait_for_task() -> None:
        try:
            got.append(c.request_task(wait_seconds=15))
        except Exception as e:  # surfaced by the assertions below
            errors.append(e)

    waiter = threading.Thread(target=wait_for_task)
    waiter.start()
    time.sleep(1.0)
    stack.broker.kill()
    stack.broker.start()  # same port: a crash and a restart
    a.release(first)
    waiter.join(timeout=40)
    assert not errors
    assert got and got[0] is not None and got[0].issue_id == first.issue_id
    assert any("agent-c retries" in r.getMessage() for r in caplog.records)
