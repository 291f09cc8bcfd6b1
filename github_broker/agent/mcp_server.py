"""`github-broker mcp`: the broker's task calls as MCP tools, for agents that speak MCP."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

from mcp.server import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
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
from pydantic import ConfigDict, Field

from github_broker import __version__
from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import (
    AgentPaused,
    BrokerClientError,
    BrokerUnavailable,
    HeartbeatAnswer,
    Unauthorized,
)
from github_broker.agent.mcp_http import HttpEndpoint
from github_broker.agent.runner.task_files import public_json
from github_broker.agent.session import AgentSession, NoTask, TaskHeld, where
from github_broker.api.schemas import MAX_LIST_ITEMS, REQUEST_ID_PATTERN, RepoName, RoleName
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: Long-poll (seconds) of request_task when the agent does not say.
DEFAULT_WAIT_S = 10.0
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

Roles = Annotated[
    list[RoleName] | None,
    Field(max_length=MAX_LIST_ITEMS, description="Roles you accept; omit for the defaults."),
]


def describe(task: Task, check_interval_s: float) -> str:
    """What an LLM needs to start: where, which branch, what to do next, then the prompt."""
    lines = [
        f"You now hold {where(task)}: {task.title!r} "
        f"({task.task_type.value}, role {task.required_role}).",
        f"Issue: {task.issue_url}",
        f"Branch: {task.branch_name} (from {task.base_branch})",
    ]
    if task.pr_url:
        lines.append(f"Pull request: {task.pr_url}")
    lines += [
        f"Lease until {task.lease.expires_at}; this server renews it while you work and checks "
        f"it every {check_interval_s:g}s.",
        "When the work is pushed, call complete. If you cannot finish, call release with "
        "outcome failed (or abandoned) and a reason.",
        "",
        "--- prompt ---",
        task.prompt,
    ]
    return "\n".join(lines)


def describe_beat(task: Task, answer: HeartbeatAnswer) -> str:
    """The heartbeat tool's answer: the new expiry, and the task's state when it is not plain
    work in progress."""
    text = f"Lease on {where(task)} renewed until {answer.expires_at}."
    if answer.paused is not None:
        text += f" The task waits for a person ({answer.paused.detail}): do not work on it."
    elif answer.state.value != "in_progress":
        text += f" Task state: {answer.state.value}."
    return text


def paused_refusal(e: AgentPaused) -> str:
    """request_task's answer while this agent is paused."""
    return (
        f"You are paused: the broker hands you no new work. {e.detail or e} Do not start "
        "other work; call request_task again later (it succeeds once you are resumed)."
    )


def current_task_json(session: AgentSession) -> str:
    """task://current: the held task (no lease token) with what maintainers said of it; null
    when none is held; {"lost": why} after the broker took it back."""
    task = session.task
    if task is not None:
        data = json.loads(public_json(task)) | session.steering()
        return json.dumps(data, separators=(",", ":"))
    return "null" if session.lost is None else json.dumps({"lost": session.lost})


def describe_verdicts(data: dict[str, list[dict[str, Any]]]) -> str:
    if not data:
        return "The broker serves no repositories."
    lines = []
    for repository, verdicts in data.items():
        lines.append(f"{repository}:")
        if not verdicts:
            lines.append("  no open issues in the queue")
        for v in verdicts:
            prio = "-" if v.get("priority") is None else f"P{v['priority']}"
            lines.append(f"  #{v['issue']} {prio} {v['verdict']}: {v['detail']}")
    return "\n".join(lines)


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


class _StrictMetadata(FuncMetadata):
    """Arguments taken exactly as the published schema says: no JSON text read as a list."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


def strict_tool(fn: Callable[..., Any]) -> Tool:
    """`fn` as a tool that refuses what the broker would: unknown arguments, `"5"` for a
    number, `true` for a string (the published inputSchema says `additionalProperties:
    false`, and the same model validates every call)."""
    tool = Tool.from_function(fn)
    loose = tool.fn_metadata.arg_model

    class Arguments(loose):  # type: ignore[valid-type, misc]
        model_config = ConfigDict(extra="forbid", strict=True)

    Arguments.__name__ = loose.__name__
    strict: type[ArgModelBase] = Arguments
    meta = tool.fn_metadata
    tool.fn_metadata = _StrictMetadata(
        arg_model=strict,
        output_schema=meta.output_schema,
        output_model=meta.output_model,
        wrap_output=meta.wrap_output,
    )
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool


def build_server(
    session: AgentSession,
    *,
    explainer: AsyncBrokerClient | None = None,
    roles: list[str] | None = None,
    repositories: list[str] | None = None,
) -> MCPServer:
    """An MCP server for one agent: five tools and the current task as resources.

    `roles`/`repositories` are the defaults of request_task; `explainer` is the client
    explain uses (the broker answers /explain to its admin token). Both protocol eras are
    served: 2025-era clients (the `initialize` handshake) get log messages, 2026-07-28
    clients an update of `task://current` on their `subscriptions/listen` stream.
    """
    explainer = explainer or session.client
    default_roles, default_repositories = roles, repositories
    client_log = ClientLog()
    bus = InMemorySubscriptionBus()

    async def task_changed() -> None:
        await bus.publish(ResourceUpdated(uri=CURRENT_TASK_URI))

    session.on_change = task_changed

    def prefixed(text: str) -> str:
        news = session.take_news()
        return "\n\n".join([*news, text])

    async def request_task(
        ctx: Context,
        roles: Roles = None,
        repositories: Annotated[
            list[RepoName] | None,
            Field(max_length=MAX_LIST_ITEMS, description="owner/name list; omit for all."),
        ] = None,
        wait_seconds: Annotated[
            float, Field(ge=0, le=60, description="Wait up to this long for a task.")
        ] = DEFAULT_WAIT_S,
        request_id: Annotated[
            str | None,
            Field(
                pattern=REQUEST_ID_PATTERN,
                description="Reuse the same id when you retry this call after an error.",
            ),
        ] = None,
    ) -> str:
        """Ask the broker for the next task for you: an issue to work on, with its prompt."""
        client_session = ctx.session

        async def notify(message: str) -> None:
            await client_log.send(client_session, "warning", message)

        chosen_roles = roles or default_roles
        try:
            task = await session.claim(
                chosen_roles, repositories or default_repositories, wait_seconds, request_id, notify
            )
        except TaskHeld as e:
            raise ToolError(str(e)) from e
        except AgentPaused as e:
            raise ToolError(prefixed(paused_refusal(e))) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        if task is None:
            return prefixed(
                f"No task for you right now (roles {', '.join(chosen_roles or ['any'])}, "
                f"waited {wait_seconds:g}s). Call explain to see why, or ask again later."
            )
        await client_log.send(ctx.session, "info", f"claimed {where(task)}", ctx.request_id)
        return prefixed(describe(task, session.check_interval_s))

    async def heartbeat() -> str:
        """Renew the lease on your task now (this server also does it on its own)."""
        try:
            answer = await session.heartbeat()
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        return prefixed(describe_beat(session.held(), answer))

    async def complete(
        summary: Annotated[str, Field(max_length=4000, description="What you did.")] = "",
    ) -> str:
        """Report your task done after pushing its branch; development work goes to review."""
        try:
            task = await session.finish("completed")
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        logger.info("%s completed %s: %s", session.agent_id, where(task), summary or "-")
        after = (
            "it moves to review (needs-review)" if task.task_type.value == "development" else "done"
        )
        return prefixed(f"Completed {where(task)}; {after}. Call request_task for more work.")

    async def release(
        outcome: Annotated[
            Literal["failed", "abandoned"],
            Field(description="failed: you tried and could not; abandoned: you stopped."),
        ],
        reason: Annotated[str, Field(min_length=1, max_length=4000, description="Why.")],
    ) -> str:
        """Give your task back to the pool (failed or abandoned), saying why."""
        try:
            task = await session.finish(outcome)
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        logger.info("%s released %s as %s: %s", session.agent_id, where(task), outcome, reason)
        return prefixed(f"Released {where(task)} as {outcome}. Call request_task for other work.")

    async def explain(
        roles: Annotated[
            list[RoleName] | None,
            Field(
                max_length=MAX_LIST_ITEMS,
                description="Roles to explain for; omit for the defaults.",
            ),
        ] = None,
        repository: Annotated[
            RepoName | None, Field(description="owner/name; omit for all.")
        ] = None,
    ) -> str:
        """Why no task is available: each open issue's verdict for an agent with these roles."""
        try:
            data = await explainer.explain(roles or default_roles, repository)
        except Unauthorized as e:
            raise ToolError(
                f"the broker explains only to its admin token ({e}); start this server with "
                "--admin-token or ask the broker's operator"
            ) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        return prefixed(describe_verdicts(data))

    mcp = MCPServer(
        "github-broker",
        version=__version__,
        instructions=INSTRUCTIONS,
        tools=[strict_tool(f) for f in (request_task, heartbeat, complete, release, explain)],
        subscriptions=bus,
    )
    # MCPServer has no public hook for logging/setLevel yet; the SDK's migration guide names
    # this one. Registering it is what declares the `logging` capability.
    mcp._lowlevel_server.add_request_handler(
        "logging/setLevel", SetLevelRequestParams, client_log.set_level
    )

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

    return mcp


def broker_error(e: BrokerClientError) -> str:
    if isinstance(e, BrokerUnavailable):
        return f"the broker is unreachable, try again shortly: {e}"
    if isinstance(e, Unauthorized):
        return f"the broker refused this agent's credentials (check --token / --agent-id): {e}"
    return f"the broker refused: {e}"


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
