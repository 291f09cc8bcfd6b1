"""The asyncio client: retries against a scripted transport, the task calls against `serve`."""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import httpx
import pytest

from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import (
    AgentPaused,
    BrokerUnavailable,
    LeaseLost,
    RequestRejected,
    Unauthorized,
    Usage,
)
from github_broker.models import Task
from tests.conftest import free_port
from tests.processes import LiveStack, wait_for

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.live_stack(issues=2, env={"GITHUB_BROKER_LEASES__LEASE_TTL_S": "3"}),
]

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
    "lease": {"token": "lease-1", "expires_at": "2026-01-01T00:00:00Z", "heartbeat_interval_s": 9},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def scripted(replies: list[httpx.Response], seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append({"at": time.monotonic(), "body": json.loads(request.content or b"{}")})
        return replies.pop(0)

    return httpx.MockTransport(handle)


async def test_503_with_retry_after_is_retried_with_the_same_request_id() -> None:
    seen: list[dict[str, Any]] = []
    replies = [
        httpx.Response(503, headers={"Retry-After": "0.3"}, json={"detail": "restarting"}),
        httpx.Response(504, json={"detail": "gateway timeout"}),
        httpx.Response(200, json=TASK_JSON),
    ]
    async with AsyncBrokerClient(
        "http://broker", "agent-a", backoff_s=0.01, transport=scripted(replies, seen)
    ) as client:
        task = await client.request_task(wait_seconds=1)
    assert task is not None and task.issue_id == 7
    assert seen[1]["at"] - seen[0]["at"] >= 0.3  # Retry-After honoured
    assert len({s["body"]["request_id"] for s in seen}) == 1
    # Even after a 504 (the request may have been claimed) every attempt is the same request:
    # the broker answers a repeat of the request id with that claim and settles nothing.
    assert [s["body"]["previous"] for s in seen] == ["completed"] * 3


async def test_heartbeat_answer_note_usage_and_the_two_409s_as_in_the_sync_client() -> None:
    seen: list[dict[str, Any]] = []
    beat = {
        "expires_at": "2026-11-20T12:20:00Z",
        "state": "in_progress",
        "notes": [{"by": "alice", "text": "Rebase first.", "at": "2026-11-20T12:11:00Z"}],
        "paused": None,
        "agent_paused": {"kind": "stop", "by": "bob", "reason": "", "at": "2026-11-20T12:13Z"},
    }
    replies = [
        httpx.Response(200, json=beat),
        httpx.Response(409, json={"detail": "revoked by bob: stop", "reason": "revoked"}),
        httpx.Response(409, json={"detail": "agent agent-a is paused", "reason": "agent_paused"}),
    ]
    task = Task.model_validate(TASK_JSON)
    async with AsyncBrokerClient(
        "http://broker", "agent-a", transport=scripted(replies, seen)
    ) as client:
        answer = await client.heartbeat(task, note="  running the tests \n", usage=Usage(tokens=5))
        with pytest.raises(LeaseLost) as lost:
            await client.heartbeat(task)
        with pytest.raises(AgentPaused) as paused:
            await client.request_task()
    assert (seen[0]["body"]["note"], seen[0]["body"]["usage"]) == (
        "running the tests",
        {"tokens": 5},
    )
    assert "note" not in seen[1]["body"] and "usage" not in seen[1]["body"]
    assert answer.notes[0].text == "Rebase first." and answer.agent_paused is not None
    assert (lost.value.reason, lost.value.detail) == ("revoked", "revoked by bob: stop")
    assert paused.value.detail == "agent agent-a is paused"


async def test_4xx_is_not_retried_and_maps_to_the_sync_clients_errors() -> None:
    seen: list[dict[str, Any]] = []
    replies = [
        httpx.Response(422, json={"detail": "agent_id: bad"}),
        httpx.Response(401, json={"detail": "unknown token"}),
        httpx.Response(409, json={"detail": "gone", "reason": "revoked"}),
    ]

    task = Task.model_validate(TASK_JSON)
    async with AsyncBrokerClient(
        "http://broker", "agent-a", backoff_s=0.01, transport=scripted(replies, seen)
    ) as client:
        with pytest.raises(RequestRejected, match="agent_id: bad"):
            await client.request_task()
        with pytest.raises(Unauthorized, match="unknown token"):
            await client.heartbeat(task)
        with pytest.raises(LeaseLost) as lost:
            await client.complete(task)
    assert lost.value.reason == "revoked"
    assert len(seen) == 3


async def test_an_unreachable_broker_raises_broker_unavailable_after_the_retries() -> None:
    async with AsyncBrokerClient(
        f"http://127.0.0.1:{free_port()}", "agent-a", retries=2, backoff_s=0.01
    ) as client:
        with pytest.raises(BrokerUnavailable, match="unreachable"):
            await client.request_task()


# --- against a real broker -------------------------------------------------------------------


@pytest.mark.slow
async def test_request_heartbeat_complete_and_a_lost_lease_against_serve(
    stack: LiveStack,
) -> None:
    sim = stack.sim
    async with AsyncBrokerClient(stack.broker.url, "agent-a") as client:
        first = await client.request_task(wait_seconds=5)
        assert first is not None
        await anyio.sleep(1.1)
        assert (await client.heartbeat(first)).expires_at > first.lease.expires_at
        await client.complete(first)
        second = await client.request_task(wait_seconds=5)
        assert second is not None and second.issue_id != first.issue_id
        sim.state.update_issue("acme", "widgets", second.issue_id, state="closed")
        with anyio.fail_after(15):
            while True:
                try:
                    await client.heartbeat(second)
                except LeaseLost as e:
                    assert e.reason == "issue_closed"
                    break
                await anyio.sleep(0.3)
        verdicts = await client.explain(["BACKENDCODER"])
        assert set(verdicts) == {"acme/widgets"}
    labels = lambda: set(sim.state.issue_labels("acme", "widgets", first.issue_id))  # noqa: E731
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: "needs-review" in labels(), 15, "review")
    )
