"""`github-broker mcp` driven by the MCP SDK's own client over stdio, against a real broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CallToolResult,
    LoggingMessageNotificationParams,
    TextContent,
    TextResourceContents,
)
from pydantic import AnyUrl

from github_broker.agent.client import BrokerClient
from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import free_port
from tests.processes import BrokerProcess, broker_env, live_broker, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEYS = RepoKeys("gb", "acme", "widgets")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(1, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    # A 3 s lease: the MCP server heartbeats every second.
    with live_broker(sim, redis_url, tmp_path, 1, GITHUB_BROKER_LEASES__LEASE_TTL_S="3") as proc:
        yield proc


def labels(sim: Simulator) -> set[str]:
    return set(sim.state.issue_labels("acme", "widgets", 1))


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


@asynccontextmanager
async def mcp_session(
    broker: BrokerProcess, tmp_path: Path, logs: list[str], *extra: str
) -> AsyncIterator[ClientSession]:
    args = ["-m", "github_broker", "mcp", "--broker-url", broker.url, "--agent-id", "agent-a"]
    params = StdioServerParameters(
        command=sys.executable,
        args=[*args, *extra],
        env=dict(os.environ),
    )

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(str(params.data))

    with (tmp_path / "mcp.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write, logging_callback=on_log) as session,
        ):
            await session.initialize()
            yield session


async def test_agent_takes_heartbeats_and_completes_a_task_over_mcp(
    sim: Simulator, broker: BrokerProcess, tmp_path: Path
) -> None:
    logs: list[str] = []
    async with mcp_session(broker, tmp_path, logs) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert set(tools) == {"request_task", "heartbeat", "complete", "release", "explain"}
        assert tools["request_task"].inputSchema["properties"]["wait_seconds"]["maximum"] == 60

        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert not claimed.isError, text(claimed)
        assert "You now hold acme/widgets#1" in text(claimed)
        assert "Branch: feature/issue-1 (from main)" in text(claimed)
        current = (await mcp.read_resource(AnyUrl("task://current"))).contents[0]
        assert isinstance(current, TextResourceContents)
        assert '"issue_id":1' in current.text and "token" not in current.text
        prompt = (await mcp.read_resource(AnyUrl("task://current/prompt"))).contents[0]
        assert isinstance(prompt, TextResourceContents) and prompt.text in text(claimed)

        # Longer than the 3 s lease: only the server's own heartbeats keep it.
        await anyio.sleep(4.5)
        beat = await mcp.call_tool("heartbeat", {})
        assert not beat.isError, text(beat)
        assert "renewed until" in text(beat)
        assert "agent-a" in labels(sim)

        done = await mcp.call_tool("complete", {"summary": "exported CSV"})
        assert not done.isError, text(done)
        assert "Completed acme/widgets#1" in text(done)

        again = await mcp.call_tool("complete", {})
        assert again.isError and "you hold no task" in text(again)
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: "needs-review" in labels(sim), 15, "needs-review")
    )
    assert not labels(sim) & {"in-progress", "agent-a"}


async def test_a_revoked_lease_is_reported_to_the_mcp_client(
    sim: Simulator, broker: BrokerProcess, tmp_path: Path
) -> None:
    logs: list[str] = []
    async with mcp_session(broker, tmp_path, logs) as mcp:
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)

        sim.state.update_issue("acme", "widgets", 1, state="closed")
        with anyio.fail_after(20):
            while not any("took acme/widgets#1 back" in line for line in logs):
                await anyio.sleep(0.1)
        assert any("issue_closed" in line for line in logs)

        beat = await mcp.call_tool("heartbeat", {})
        assert beat.isError
        assert "took acme/widgets#1 back" in text(beat) and "issue_closed" in text(beat)
        none = await mcp.call_tool("request_task", {"wait_seconds": 0})
        assert not none.isError and "No task for you right now" in text(none)


async def test_bad_tool_input_is_a_tool_error_before_any_broker_call(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    logs: list[str] = []
    async with mcp_session(broker, tmp_path, logs) as mcp:
        bad = await mcp.call_tool("request_task", {"wait_seconds": 600})
        assert bad.isError and "wait_seconds" in text(bad)
        bad = await mcp.call_tool("release", {"outcome": "done", "reason": "x"})
        assert bad.isError and "outcome" in text(bad)
        # Nothing was claimed by the refused calls.
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)
        released = await mcp.call_tool(
            "release", {"outcome": "failed", "reason": "tests do not build"}
        )
        assert not released.isError and "Released acme/widgets#1 as failed" in text(released)


async def test_explain_says_why_and_a_task_held_at_exit_returns_to_the_pool(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    logs: list[str] = []
    async with mcp_session(broker, tmp_path, logs) as mcp:
        why = await mcp.call_tool("explain", {"roles": ["BACKENDCODER"]})
        assert not why.isError and "acme/widgets:\n  #1 P1 next" in text(why)
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)
        why = await mcp.call_tool("explain", {})
        assert "#1 P1 held" in text(why), text(why)
    # The client went away holding the task: the server released it on its way out.
    with BrokerClient(broker.url, "agent-b") as other:
        task = other.request_task(wait_seconds=5)
        assert task is not None and task.issue_id == 1


async def test_a_refused_token_is_a_tool_error_naming_the_credentials(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    tokens = '{"tok-a": "agent-a"}'
    env = broker_env(
        redis_url, sim.base_url, "acme/widgets", GITHUB_BROKER_SERVER__AGENT_TOKENS=tokens
    )
    broker = BrokerProcess(env, tmp_path, "broker-auth").start()
    try:
        async with mcp_session(broker, tmp_path, [], "--token", "tok-wrong") as mcp:
            refused = await mcp.call_tool("request_task", {"wait_seconds": 0})
            assert refused.isError
            assert "refused this agent's credentials" in text(refused)
            assert "unknown token" in text(refused)
    finally:
        broker.stop()


async def test_streamable_http_transport_reports_an_unreachable_broker_as_a_tool_error(
    tmp_path: Path,
) -> None:
    port = free_port()
    command = [sys.executable, "-m", "github_broker", "mcp", "--transport", "http"]
    command += ["--port", str(port), "--agent-id", "agent-a"]
    command += ["--broker-url", f"http://127.0.0.1:{free_port()}"]  # nothing listens there
    with (tmp_path / "mcp-http.log").open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        await anyio.to_thread.run_sync(
            lambda: wait_for(lambda: port_open(port), 20, "the MCP HTTP server")
        )
        async with (
            streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write, _),
            ClientSession(read, write) as mcp,
        ):
            await mcp.initialize()
            assert "request_task" in {t.name for t in (await mcp.list_tools()).tools}
            result = await mcp.call_tool("request_task", {"wait_seconds": 0})
            assert result.isError
            assert "the broker is unreachable, try again shortly" in text(result)
    finally:
        server.terminate()
        server.wait(timeout=15)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
