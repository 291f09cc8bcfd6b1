"""`github-broker mcp` driven by the official MCP client SDK over stdio and streamable HTTP,
against a real broker, Redis and the GitHub simulator."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import redis
from mcp import Client, MCPDeprecationWarning, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.client.subscriptions import ResourceUpdated
from mcp.types import CallToolResult, LoggingMessageNotificationParams, TextContent

from github_broker import __version__
from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import BrokerClient
from github_broker.agent.mcp_cli import MCP_TOKEN_ENV
from github_broker.agent.session import AgentSession
from github_broker.api.schemas import REQUEST_ID_PATTERN
from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import free_port
from tests.processes import BrokerProcess, broker_env, live_broker, post, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEYS = RepoKeys("gb", "acme", "widgets")
#: A token for the HTTP transport (at least 16 characters).
MCP_TOKEN = "mcp-test-token-0123456789"
#: What the issue promises: a lost lease reaches the client this soon after the broker knows.
TELL_WITHIN_S = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def seeded(issues: int) -> dict[str, Any]:
    return {
        "repositories": [
            {
                "owner": "acme",
                "name": "widgets",
                "issues": generate_issues(issues, priorities=("P1",)),
            }
        ]
    }


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(seeded(1)) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    # A 3 s lease: its heartbeat interval (1 s) is shorter than the server's check interval.
    with live_broker(sim, redis_url, tmp_path, 1, GITHUB_BROKER_LEASES__LEASE_TTL_S="3") as proc:
        yield proc


def labels(sim: Simulator, number: int = 1) -> set[str]:
    return set(sim.state.issue_labels("acme", "widgets", number))


def text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def mcp_command(broker_url: str, *extra: str) -> list[str]:
    command = [sys.executable, "-m", "github_broker", "mcp", "--broker-url", broker_url]
    if not any(arg.startswith("--agent-id") for arg in extra):
        command += ["--agent-id", "agent-a"]
    return [*command, *extra]


@dataclass
class Heard:
    """What a client was told without asking: log messages, and `task://current` as read
    after each update of it, each with the time it arrived."""

    logs: list[tuple[float, LoggingMessageNotificationParams]] = field(default_factory=list)
    current: list[tuple[float, str]] = field(default_factory=list)

    async def log(self, params: LoggingMessageNotificationParams) -> None:
        self.logs.append((time.monotonic(), params))

    def first(self, needle: str) -> float | None:
        """When `needle` first arrived, in a log message or in task://current."""
        told = [t for t, p in self.logs if needle in str(p.data)]
        told += [t for t, body in self.current if needle in body]
        return min(told, default=None)


@asynccontextmanager
async def mcp_over_stdio(
    broker_url: str, tmp_path: Path, heard: Heard, *extra: str, mode: str = "auto"
) -> AsyncIterator[Client]:
    command = mcp_command(broker_url, *extra)
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    with (tmp_path / "mcp.log").open("a") as errlog:
        transport = stdio_client(params, errlog=errlog)
        async with Client(transport, mode=mode, logging_callback=heard.log) as client:
            yield client


@contextmanager
def mcp_http_server(broker_url: str, tmp_path: Path, *extra: str) -> Iterator[str]:
    """`github-broker mcp --transport http` as a process; yields its endpoint URL."""
    port = free_port()
    command = mcp_command(broker_url, "--transport", "http", "--port", str(port), *extra)
    with (tmp_path / "mcp.log").open("ab") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=without_mcp_token()
        )
    try:
        wait_for(lambda: port_open(port) or server.poll() is not None, 20, "the MCP endpoint")
        assert server.poll() is None, (tmp_path / "mcp.log").read_text()
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.terminate()
        server.wait(timeout=15)


@asynccontextmanager
async def mcp_over_http(
    url: str, heard: Heard, mode: str = "auto", token: str | None = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(
            streamable_http_client(url, http_client=http), mode=mode, logging_callback=heard.log
        ) as client,
    ):
        yield client


@asynccontextmanager
async def watching_current_task(client: Client, heard: Heard) -> AsyncIterator[None]:
    """On a 2026-07-28 connection: read task://current whenever the server says it changed."""
    if client.protocol_version == "2025-11-25":
        yield
        return
    async with client.listen(resource_subscriptions=["task://current"]) as sub:

        async def follow() -> None:
            async for event in sub:
                if isinstance(event, ResourceUpdated):
                    contents = (await client.read_resource("task://current")).contents[0]
                    heard.current.append((time.monotonic(), getattr(contents, "text", "")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            yield
            tg.cancel_scope.cancel()


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def without_mcp_token() -> dict[str, str]:
    """This environment without a token for the HTTP transport (a test passes its own)."""
    return {k: v for k, v in os.environ.items() if k != MCP_TOKEN_ENV}


def warnings_in(log: str) -> list[str]:
    """Lines of a server's stderr that are warnings, errors or tracebacks."""
    return [
        line
        for line in log.splitlines()
        if any(word in line for word in ("WARNING", "ERROR", "Traceback", "Warning"))
    ]


# --- the task flow ---------------------------------------------------------------------


async def test_agent_takes_heartbeats_and_completes_a_task_over_mcp(
    sim: Simulator, broker: BrokerProcess, tmp_path: Path
) -> None:
    heard = Heard()
    async with mcp_over_stdio(broker.url, tmp_path, heard) as mcp:
        assert mcp.protocol_version == "2026-07-28"
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert set(tools) == {"request_task", "heartbeat", "complete", "release", "explain"}
        assert tools["request_task"].input_schema["properties"]["wait_seconds"]["maximum"] == 60

        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert not claimed.is_error, text(claimed)
        assert "You now hold acme/widgets#1" in text(claimed)
        assert "Branch: feature/issue-1 (from main)" in text(claimed)
        current = (await mcp.read_resource("task://current")).contents[0]
        assert '"issue_id":1' in getattr(current, "text", "")
        assert "token" not in getattr(current, "text", "")
        prompt = (await mcp.read_resource("task://current/prompt")).contents[0]
        assert getattr(prompt, "text", "") in text(claimed)

        # Longer than the 3 s lease: only the server's own checks keep it.
        await anyio.sleep(4.5)
        beat = await mcp.call_tool("heartbeat", {})
        assert not beat.is_error, text(beat)
        assert "renewed until" in text(beat)
        assert "agent-a" in labels(sim)

        done = await mcp.call_tool("complete", {"summary": "exported CSV"})
        assert not done.is_error, text(done)
        assert "Completed acme/widgets#1" in text(done)

        again = await mcp.call_tool("complete", {})
        assert again.is_error and "you hold no task" in text(again)
    await anyio.to_thread.run_sync(
        lambda: wait_for(lambda: "needs-review" in labels(sim), 15, "needs-review")
    )
    assert not labels(sim) & {"in-progress", "agent-a"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_server_info_names_github_broker_and_its_version(
    broker: BrokerProcess, tmp_path: Path, mode: str
) -> None:
    async with mcp_over_stdio(broker.url, tmp_path, Heard(), mode=mode) as mcp:
        assert mcp.server_info is not None
        assert (mcp.server_info.name, mcp.server_info.version) == ("github-broker", __version__)


# --- a lost lease ----------------------------------------------------------------------


@pytest.fixture
def two_issue_broker(redis_url: str, tmp_path: Path) -> Iterator[tuple[Simulator, BrokerProcess]]:
    # The default lease (600 s, a heartbeat every 200 s): only the server's own check interval
    # can tell the client in time.
    with Simulator(seeded(2)) as sim, live_broker(sim, redis_url, tmp_path, 2) as proc:
        yield sim, proc


def lease_gone(client: redis.Redis, number: int) -> bool:
    return not client.exists(KEYS.lease(number))


async def first_heard(heard: Heard, needle: str, timeout_s: float) -> float:
    with anyio.fail_after(timeout_s):
        while (at := heard.first(needle)) is None:
            await anyio.sleep(0.05)
    return at


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_lease_the_broker_ends_is_told_to_the_client_within_5_s(
    two_issue_broker: tuple[Simulator, BrokerProcess],
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    transport: str,
    mode: str,
) -> None:
    """Revoked (the issue closed on GitHub) and expired (the lease key gone): a 2025-era
    client gets a warning log message, a 2026-07-28 client an update of task://current on
    its subscriptions/listen stream, each within 5 s of the broker ending the lease."""
    sim, broker = two_issue_broker
    heard = Heard()
    store = redis.Redis.from_url(redis_url)
    caplog.set_level(logging.WARNING)

    @asynccontextmanager
    async def connected() -> AsyncIterator[Client]:
        if transport == "stdio":
            async with mcp_over_stdio(broker.url, tmp_path, heard, mode=mode) as client:
                yield client
        else:
            with mcp_http_server(broker.url, tmp_path) as url:
                async with mcp_over_http(url, heard, mode=mode) as client:
                    yield client

    try:
        async with connected() as mcp, watching_current_task(mcp, heard):
            assert mcp.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
            first = 1 if "acme/widgets#1" in text(claimed) else 2
            second = 3 - first

            # Revoked: the broker learns of the closed issue by its poll, then ends the lease.
            sim.state.update_issue("acme", "widgets", first, state="closed")
            await anyio.to_thread.run_sync(
                lambda: wait_for(lambda: lease_gone(store, first), 20, "the revocation")
            )
            known = time.monotonic()
            told = await first_heard(heard, f"took acme/widgets#{first} back", 2 * TELL_WITHIN_S)
            assert told - known < TELL_WITHIN_S
            assert heard.first("issue_closed") is not None
            beat = await mcp.call_tool("heartbeat", {})
            assert beat.is_error and f"took acme/widgets#{first} back" in text(beat)

            # Expired: the lease key vanishes, as when its TTL runs out.
            claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
            assert f"You now hold acme/widgets#{second}" in text(claimed), text(claimed)
            known = time.monotonic()
            store.delete(KEYS.issue_lock(second))
            told = await first_heard(heard, f"took acme/widgets#{second} back", 2 * TELL_WITHIN_S)
            assert told - known < TELL_WITHIN_S
            assert heard.first("(expired)") is not None
    finally:
        store.close()
    if mode == "legacy":
        assert {p.level for _, p in heard.logs if "back" in str(p.data)} == {"warning"}
    assert warnings_in((tmp_path / "mcp.log").read_text()) == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("mcp")] == []


# --- maintainers' notes and pauses ---------------------------------------------------------


@pytest.fixture
def budget_broker(redis_url: str, tmp_path: Path) -> Iterator[tuple[Simulator, BrokerProcess]]:
    # The default lease (a heartbeat every 200 s): only the lease check tells the client in
    # time. A held task reaches its wall-clock budget after 8 s, looked at every 0.5 s.
    extra = {
        "GITHUB_BROKER_BUDGETS__WALL_CLOCK_S": "8",
        "GITHUB_BROKER_PROGRESS__CHECK_INTERVAL_S": "0.5",
    }
    with Simulator(seeded(2)) as sim, live_broker(sim, redis_url, tmp_path, 2, **extra) as proc:
        yield sim, proc


def admin(broker: BrokerProcess, path: str, **body: Any) -> None:
    r = post(broker.url, path, body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(("transport", "mode"), [("stdio", "auto"), ("http", "legacy")])
async def test_notes_and_pauses_reach_the_client_as_soon_as_the_lease_check_sees_them(
    budget_broker: tuple[Simulator, BrokerProcess],
    redis_url: str,
    tmp_path: Path,
    transport: str,
    mode: str,
) -> None:
    """A maintainer's note, a pause of the agent and a budget pause of its task each reach a
    2025-era client as a log message, a 2026-07-28 client in task://current, within 5 s; the
    next tool answer says them too, and request_task is refused while the agent is paused."""
    _, broker = budget_broker
    heard = Heard()
    store = redis.Redis.from_url(redis_url)

    @asynccontextmanager
    async def connected() -> AsyncIterator[Client]:
        if transport == "stdio":
            async with mcp_over_stdio(broker.url, tmp_path, heard, mode=mode) as client:
                yield client
        else:
            with mcp_http_server(broker.url, tmp_path) as url:
                async with mcp_over_http(url, heard, mode=mode) as client:
                    yield client

    try:
        async with connected() as mcp, watching_current_task(mcp, heard):
            claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
            n = 1 if "acme/widgets#1" in text(claimed) else 2
            task_path = f"/admin/tasks/acme/widgets/{n}"

            sent = time.monotonic()
            await anyio.to_thread.run_sync(
                lambda: admin(broker, f"{task_path}/note", text="Use the new parser.")
            )
            told = await first_heard(heard, "Use the new parser.", 2 * TELL_WITHIN_S)
            assert told - sent < TELL_WITHIN_S

            sent = time.monotonic()
            await anyio.to_thread.run_sync(
                lambda: admin(broker, "/admin/agents/agent-a/pause", reason="rota change")
            )
            told = await first_heard(heard, "rota change", 2 * TELL_WITHIN_S)
            assert told - sent < TELL_WITHIN_S

            await anyio.to_thread.run_sync(
                lambda: wait_for(
                    lambda: store.hexists(KEYS.lease(n), "paused"), 20, "the budget pause"
                )
            )
            known = time.monotonic()
            told = await first_heard(heard, "budget", 2 * TELL_WITHIN_S)
            assert told - known < TELL_WITHIN_S

            beat = await mcp.call_tool("heartbeat", {})
            assert not beat.is_error and "waits for a person" in text(beat), text(beat)
            assert "Note from admin (a maintainer)" in text(beat)  # told before the next answer
            current = (await mcp.read_resource("task://current")).contents[0]
            steering = json.loads(getattr(current, "text", ""))
            assert steering["state"] == "waiting_for_user"
            assert [note["text"] for note in steering["notes"]] == ["Use the new parser."]
            assert steering["agent_paused"]["reason"] == "rota change"
            assert steering["paused"]["code"] == "budget"

            released = await mcp.call_tool("release", {"outcome": "abandoned", "reason": "paused"})
            assert not released.is_error, text(released)
            refused = await mcp.call_tool("request_task", {"wait_seconds": 0})
            assert refused.is_error
            assert "You are paused" in text(refused) and "rota change" in text(refused)
            assert store.zcard(KEYS.leases) == 0  # nothing claimed

            await anyio.to_thread.run_sync(lambda: admin(broker, "/admin/agents/agent-a/resume"))
            again = await mcp.call_tool("request_task", {"wait_seconds": 5})
            assert "You now hold acme/widgets#" in text(again), text(again)
    finally:
        store.close()
    if mode == "legacy":
        assert {p.level for _, p in heard.logs if "rota change" in str(p.data)} == {"warning"}
    assert warnings_in((tmp_path / "mcp.log").read_text()) == []


async def test_log_messages_respect_the_level_a_client_set(
    sim: Simulator, broker: BrokerProcess, tmp_path: Path
) -> None:
    heard = Heard()
    async with mcp_over_stdio(broker.url, tmp_path, heard, mode="legacy") as mcp:
        assert mcp.server_capabilities.logging is not None
        with pytest.warns(MCPDeprecationWarning):  # the 2026-07-28 revision retires logging
            await mcp.set_logging_level("warning")

        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)
        sim.state.update_issue("acme", "widgets", 1, state="closed")
        await first_heard(heard, "took acme/widgets#1 back", 20)
    # The claim's info message stayed below the level; the warning came through.
    assert [p.level for _, p in heard.logs] == ["warning"]


async def test_without_set_level_a_client_gets_info_messages(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    heard = Heard()
    async with mcp_over_stdio(broker.url, tmp_path, heard, mode="legacy") as mcp:
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)
    assert [(p.level, p.data) for _, p in heard.logs] == [("info", "claimed acme/widgets#1")]


async def test_lease_checks_back_off_while_the_broker_fails_and_stop_once_settled() -> None:
    """The lease watch is bounded: one heartbeat per check interval while a task is held,
    fewer and fewer while the broker fails (up to the lease's own heartbeat interval), none
    once the task is settled."""
    beats: list[float] = []
    failing = True
    task = {
        "issue_id": 1,
        "issue_url": "http://github.test/acme/widgets/issues/1",
        "title": "t",
        "body": "b",
        "labels": ["P1"],
        "branch_name": "feature/issue-1",
        "prompt": "p",
        "required_role": "BACKENDCODER",
        "task_type": "development",
        "repository": "acme/widgets",
        "base_branch": "main",
        "lease": {"token": "tok", "expires_at": "2030-01-01T00:00:00Z", "heartbeat_interval_s": 1},
    }

    def broker(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/request-task":
            return httpx.Response(200, json=task)
        if request.url.path.endswith("/heartbeat"):
            beats.append(time.monotonic())
            if failing:
                return httpx.Response(503, json={"detail": "restarting"})
            return httpx.Response(200, json={"expires_at": "2030-01-01T00:00:00Z"})
        return httpx.Response(200, json={"status": "completed"})

    transport = httpx.MockTransport(broker)
    client = AsyncBrokerClient("http://broker.test", "agent-a", retries=0, transport=transport)
    session = AgentSession(client, check_interval_s=0.1)
    try:
        assert await session.claim(None, None, 0, None, None) is not None
        await anyio.sleep(2.0)
        # Pauses of 0.1, 0.2, 0.4, 0.8, 1.0 s: five checks at most, not twenty.
        assert 3 <= len(beats) <= 6, beats
        failing = False
        recovered = len(beats)
        await anyio.sleep(2.0)
        # One more pause of at most 1 s, then every 0.1 s again.
        assert len(beats) - recovered >= 5, beats
        await session.finish("completed")
        settled = len(beats)
        await anyio.sleep(0.5)
        assert len(beats) == settled
    finally:
        await session.close()
        await client.aclose()


# --- bad input -------------------------------------------------------------------------


async def test_bad_tool_input_is_a_tool_error_before_any_broker_call(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async with mcp_over_stdio(broker.url, tmp_path, Heard()) as mcp:
        bad = await mcp.call_tool("request_task", {"wait_seconds": 600})
        assert bad.is_error and "wait_seconds" in text(bad)
        # One line a model can act on: what is wrong, what was given, what the tool takes.
        assert "\n" not in text(bad) and "For further information" not in text(bad), text(bad)
        assert "less than or equal to 60 (got 600)" in text(bad)
        bad = await mcp.call_tool("release", {"outcome": "done", "reason": "x", "why": "y"})
        assert bad.is_error and "outcome" in text(bad)
        assert "\n" not in text(bad) and "errors.pydantic.dev" not in text(bad), text(bad)
        assert "why: not an argument of this tool" in text(bad)
        assert "It takes: outcome, reason." in text(bad)
        # Nothing was claimed by the refused calls.
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
        assert "You now hold acme/widgets#1" in text(claimed)
        released = await mcp.call_tool(
            "release", {"outcome": "failed", "reason": "tests do not build"}
        )
        assert not released.is_error and "Released acme/widgets#1 as failed" in text(released)


async def test_tool_schemas_are_as_strict_as_the_broker(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async with mcp_over_stdio(broker.url, tmp_path, Heard()) as mcp:
        tools = {t.name: t.input_schema for t in (await mcp.list_tools()).tools}
        assert all(schema["additionalProperties"] is False for schema in tools.values())
        request_id = tools["request_task"]["properties"]["request_id"]["anyOf"][0]
        assert request_id["pattern"] == REQUEST_ID_PATTERN

        refused = {
            "unknown argument": {"wait_seconds": 0, "priority": "P0"},
            "a number as text": {"wait_seconds": "5"},
            "a boolean as a number": {"wait_seconds": True},
            "a list as JSON text": {"roles": '["BACKENDCODER"]', "wait_seconds": 0},
            "a request id with a space": {"request_id": "a b", "wait_seconds": 0},
            "a request id over 64 characters": {"request_id": "r" * 65, "wait_seconds": 0},
        }
        for case, arguments in refused.items():
            result = await mcp.call_tool("request_task", arguments)
            assert result.is_error, case
            assert "You now hold" not in text(result), case
        typo = await mcp.call_tool("release", {"outcome": "failed", "reason": "x", "why": "y"})
        assert typo.is_error and "why" in text(typo)
        # None of them reached the broker: the task is still there for a valid call.
        claimed = await mcp.call_tool("request_task", {"wait_seconds": 5, "request_id": "r-1.a_b"})
        assert "You now hold acme/widgets#1" in text(claimed), text(claimed)


@pytest.mark.parametrize("agent_id", ["P0", "in-progress", "Needs-Review", "agent a", "-x"])
def test_an_agent_id_the_broker_refuses_is_refused_at_start(agent_id: str) -> None:
    done = subprocess.run(
        mcp_command("http://127.0.0.1:9", f"--agent-id={agent_id}"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert f"agent id {agent_id!r}" in done.stderr
    assert done.stdout == ""


# --- explain, credentials, an unreachable broker ---------------------------------------


async def test_explain_says_why_and_a_task_held_at_exit_returns_to_the_pool(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    async with mcp_over_stdio(broker.url, tmp_path, Heard()) as mcp:
        why = await mcp.call_tool("explain", {"roles": ["BACKENDCODER"]})
        assert not why.is_error and "acme/widgets:\n  #1 P1 next" in text(why)
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
    tokens = '{"agent-a": "tok-a-0123456789ab"}'
    env = broker_env(
        redis_url, sim.base_url, "acme/widgets", GITHUB_BROKER_SERVER__AGENT_TOKENS=tokens
    )
    broker = BrokerProcess(env, tmp_path, "broker-auth").start()
    try:
        async with mcp_over_stdio(broker.url, tmp_path, Heard(), "--token", "tok-wrong") as mcp:
            refused = await mcp.call_tool("request_task", {"wait_seconds": 0})
            assert refused.is_error
            assert "refused this agent's credentials" in text(refused)
            assert "unknown token" in text(refused)
    finally:
        broker.stop()


async def test_streamable_http_transport_reports_an_unreachable_broker_as_a_tool_error(
    tmp_path: Path,
) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with mcp_http_server(nowhere, tmp_path) as url:
        async with mcp_over_http(url, Heard()) as mcp:
            assert "request_task" in {t.name for t in (await mcp.list_tools()).tools}
            result = await mcp.call_tool("request_task", {"wait_seconds": 0})
            assert result.is_error
            assert "the broker is unreachable, try again shortly" in text(result)


async def test_tool_calls_write_nothing_to_stderr(broker: BrokerProcess, tmp_path: Path) -> None:
    log = tmp_path / "mcp.log"
    for mode in ("auto", "legacy"):
        log.write_text("")
        async with mcp_over_stdio(broker.url, tmp_path, Heard(), mode=mode) as mcp:
            await calls(mcp)
        assert log.read_text() == "", f"stdio {mode}"
        log.write_text("")
        with mcp_http_server(broker.url, tmp_path) as url:
            async with mcp_over_http(url, Heard(), mode=mode) as mcp:
                await calls(mcp)
        assert log.read_text() == "", f"http {mode}"


async def calls(mcp: Client) -> None:
    for _ in range(3):
        await mcp.list_tools()
        assert not (await mcp.call_tool("explain", {})).is_error
        assert (await mcp.call_tool("request_task", {"wait_seconds": "5"})).is_error
        await mcp.read_resource("task://current")


# --- the HTTP endpoint beyond loopback -------------------------------------------------


def test_http_beyond_loopback_without_a_token_is_refused_at_start(tmp_path: Path) -> None:
    port = free_port()
    done = subprocess.run(
        mcp_command(
            "http://127.0.0.1:9", "--transport", "http", "--host", "0.0.0.0", "--port", str(port)
        ),
        capture_output=True,
        text=True,
        timeout=30,
        env=without_mcp_token(),
    )
    assert done.returncode == 2
    assert "refusing to serve MCP over HTTP on '0.0.0.0' without a bearer token" in done.stderr
    assert not port_open(port)


async def test_http_with_a_token_refuses_unauthenticated_calls_before_any_work(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    token_file = tmp_path / "mcp-token"
    token_file.write_text(MCP_TOKEN + "\n")
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "curl", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    with mcp_http_server(
        broker.url, tmp_path, "--host", "0.0.0.0", "--mcp-token-file", str(token_file)
    ) as url:
        async with httpx2.AsyncClient(timeout=10) as http:
            bare = await http.post(url, json=initialize, headers=accept)
            wrong = await http.post(
                url, json=initialize, headers={**accept, "Authorization": "Bearer nope"}
            )
            # The host check (DNS rebinding) holds beyond loopback too, token or not.
            rebound = await http.post(
                url,
                json=initialize,
                headers={**accept, "Authorization": f"Bearer {MCP_TOKEN}", "Host": "evil.test"},
            )
        assert (bare.status_code, wrong.status_code, rebound.status_code) == (401, 401, 421)
        assert bare.headers["www-authenticate"].startswith("Bearer")
        assert "mcp-session-id" not in bare.headers
        assert json.loads(bare.text)["error"] == "unauthorized"

        with pytest.raises(Exception):  # noqa: B017 - the SDK's own error for a 401
            async with mcp_over_http(url, Heard()) as mcp:
                await mcp.list_tools()
        # With the token, both eras reach the tools (one server, one agent: the second client
        # finds the task the first one claimed).
        answers = {"auto": "You now hold acme/widgets#1", "legacy": "you still hold acme/widgets#1"}
        for mode, answer in answers.items():
            async with mcp_over_http(url, Heard(), mode=mode, token=MCP_TOKEN) as mcp:
                claimed = await mcp.call_tool("request_task", {"wait_seconds": 5})
                assert answer in text(claimed), text(claimed)
