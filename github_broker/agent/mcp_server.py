"""`github-broker mcp`: the broker's task calls as MCP tools, for agents that speak MCP: the
server, its log messages and the current task as resources (the tools: mcp_tools.py)."""

from __future__ import annotations

import json
import logging
from typing import Any, get_args

from mcp.server import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.subscriptions import ResourceUpdated
from mcp.types import (
    EmptyResult,
    LoggingLevel,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    SetLevelRequestParams,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from github_broker import __version__
from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.mcp_http import HttpEndpoint
from github_broker.agent.mcp_tools import AgentTools
from github_broker.agent.runner.task_files import public_json
from github_broker.agent.session import AgentSession

logger = logging.getLogger(__name__)

#: Log messages 2025-era clients get until they send logging/setLevel.
DEFAULT_LOG_LEVEL: LoggingLevel = "info"
#: The resource a client watches to learn that its task changed (claimed, settled, lost).
CURRENT_TASK_URI = "task://current"
LOGGER_NAME = "github-broker"
#: RFC 5424 severities, least severe first (the order of the protocol's LoggingLevel).
LEVELS: tuple[str, ...] = get_args(LoggingLevel)

INSTRUCTIONS = """\
This server hands you GitHub issues to work on, one at a time, from a github-broker.
Call request_task to get one; its prompt says what to do and which branch to push.
While you hold a task this server renews its lease for you. When the work is pushed call
complete; if you cannot finish call release (failed or abandoned) with a reason. If the
broker takes the task back (issue closed, lease revoked) you are told: stop and ask again.
Maintainers may send you notes about the task, set it aside (stop until they retry it) or
pause you (finish this task, then ask for no more): you are told of each, before the next
tool answer and in task://current; do as they say. When no task comes, explain says why."""


def current_task_json(session: AgentSession) -> str:
    """task://current: the held task (no lease token) with what maintainers said of it; null
    when none is held; {"lost": why} after the broker took it back."""
    task = session.task
    if task is not None:
        data = json.loads(public_json(task)) | session.steering()
        return json.dumps(data, separators=(",", ":"))
    return "null" if session.lost is None else json.dumps({"lost": session.lost})


class ClientLog:
    """Log messages to 2025-era clients, at or above the level set by `logging/setLevel`.

    One level for the server: it serves one agent, usually through one client. A 2026-07-28
    client has no standing channel for them (the revision retires protocol logging); it
    watches `task://current` through `subscriptions/listen` instead."""

    def __init__(self) -> None:
        self.level: LoggingLevel = DEFAULT_LOG_LEVEL

    def wants(self, level: LoggingLevel) -> bool:
        return LEVELS.index(level) >= LEVELS.index(self.level)

    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        self.level = params.level
        return EmptyResult()

    async def send(
        self,
        session: ServerSession,
        level: LoggingLevel,
        text: str,
        request_id: str | int | None = None,
    ) -> None:
        """Send `text` unless the client asked for less; `request_id` ties it to a request."""
        if session.protocol_version in MODERN_PROTOCOL_VERSIONS or not self.wants(level):
            return
        message = LoggingMessageNotificationParams(level=level, data=text, logger=LOGGER_NAME)
        await session.send_notification(
            LoggingMessageNotification(params=message), related_request_id=request_id
        )


def build_server(
    session: AgentSession,
    *,
    explainer: AsyncBrokerClient | None = None,
    roles: list[str] | None = None,
    repositories: list[str] | None = None,
) -> MCPServer:
    """An MCP server for one agent: five tools (mcp_tools.py) and the current task as
    resources.

    `roles`/`repositories` are the defaults of request_task; `explainer` is the client
    explain uses (the broker answers /explain to its admin token). Both protocol eras are
    served: 2025-era clients (the `initialize` handshake) get log messages, 2026-07-28
    clients an update of `task://current` on their `subscriptions/listen` stream.
    """
    client_log = ClientLog()
    bus = InMemorySubscriptionBus()

    async def task_changed() -> None:
        await bus.publish(ResourceUpdated(uri=CURRENT_TASK_URI))

    session.on_change = task_changed
    tools = AgentTools(session, explainer or session.client, client_log.send, roles, repositories)
    mcp = MCPServer(
        "github-broker",
        version=__version__,
        instructions=INSTRUCTIONS,
        tools=tools.tools(),
        subscriptions=bus,
    )
    # MCPServer has no public hook for logging/setLevel yet; the SDK's migration guide names
    # this one. Registering it is what declares the `logging` capability.
    mcp._lowlevel_server.add_request_handler(
        "logging/setLevel", SetLevelRequestParams, client_log.set_level
    )
    add_task_resources(mcp, session)
    return mcp


def add_task_resources(mcp: MCPServer, session: AgentSession) -> None:
    """`task://current` (the held task, JSON) and `task://current/prompt`."""

    @mcp.resource(
        CURRENT_TASK_URI,
        name="current-task",
        description="The task you hold (JSON, without the lease token) with its state and "
        "what maintainers said (notes, paused, agent_paused); null when you hold none; "
        '{"lost": why} after the broker took it back, until your next tool call.',
        mime_type="application/json",
    )
    async def current_task() -> str:
        return current_task_json(session)

    @mcp.resource(
        "task://current/prompt",
        name="current-prompt",
        description="The prompt of the task you hold.",
        mime_type="text/markdown",
    )
    async def current_prompt() -> str:
        task = session.task
        return "You hold no task: call request_task." if task is None else task.prompt


async def serve(
    session: AgentSession,
    mcp: MCPServer,
    http: HttpEndpoint | None = None,
    explainer: AsyncBrokerClient | None = None,
) -> None:
    """Serve over stdio, or over `http` when given, until the client goes away (stdio) or a
    signal stops it; release what is held."""
    try:
        if http is None:
            await mcp.run_stdio_async()
        else:
            await http.serve(mcp)
    finally:
        await session.close()
        await session.client.aclose()
        if explainer is not None:
            await explainer.aclose()
