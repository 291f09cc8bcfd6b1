"""`github-broker mcp`: the broker's task calls as MCP tools, for agents that speak MCP."""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from pydantic import Field

from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import BrokerClientError, BrokerUnavailable, Unauthorized
from github_broker.agent.runner import public_json
from github_broker.agent.session import AgentSession, NoTask, TaskHeld, where
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: Long-poll (seconds) of request_task when the agent does not say.
DEFAULT_WAIT_S = 10.0

INSTRUCTIONS = """\
This server hands you GitHub issues to work on, one at a time, from a github-broker.
Call request_task to get one; its prompt says what to do and which branch to push.
While you hold a task this server renews its lease for you. When the work is pushed call
complete; if you cannot finish call release (failed or abandoned) with a reason. If the
broker takes the task back (issue closed, lease revoked) you are told: stop and ask again.
When no task comes, explain says why."""


def describe(task: Task) -> str:
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
        f"Lease until {task.lease.expires_at}; this server renews it every "
        f"{task.lease.heartbeat_interval_s}s while you work.",
        "When the work is pushed, call complete. If you cannot finish, call release with "
        "outcome failed (or abandoned) and a reason.",
        "",
        "--- prompt ---",
        task.prompt,
    ]
    return "\n".join(lines)


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


def build_server(
    session: AgentSession,
    *,
    explainer: AsyncBrokerClient | None = None,
    roles: list[str] | None = None,
    repositories: list[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
) -> FastMCP:
    """An MCP server for one agent: five tools and the current task as resources.

    `roles`/`repositories` are the defaults of request_task; `explainer` is the client
    explain uses (the broker answers /explain to its admin token).
    """
    mcp = FastMCP("github-broker", instructions=INSTRUCTIONS, host=host, port=port)
    explainer = explainer or session.client
    default_roles, default_repositories = roles, repositories

    def prefixed(text: str) -> str:
        notice = session.take_lost()
        return f"{notice}\n\n{text}" if notice else text

    @mcp.tool()
    async def request_task(
        ctx: Context,
        roles: Annotated[
            list[str] | None, Field(description="Roles you accept; omit for the defaults.")
        ] = None,
        repositories: Annotated[
            list[str] | None, Field(description="owner/name list; omit for all.")
        ] = None,
        wait_seconds: Annotated[
            float, Field(ge=0, le=60, description="Wait up to this long for a task.")
        ] = DEFAULT_WAIT_S,
        request_id: Annotated[
            str | None,
            Field(
                max_length=100,
                description="Reuse the same id when you retry this call after an error.",
            ),
        ] = None,
    ) -> str:
        """Ask the broker for the next task for you: an issue to work on, with its prompt."""

        async def notify(message: str) -> None:
            await ctx.session.send_log_message(
                level="warning", data=message, logger="github-broker"
            )

        chosen_roles = roles or default_roles
        try:
            task = await session.claim(
                chosen_roles, repositories or default_repositories, wait_seconds, request_id, notify
            )
        except TaskHeld as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        if task is None:
            return prefixed(
                f"No task for you right now (roles {', '.join(chosen_roles or ['any'])}, "
                f"waited {wait_seconds:g}s). Call explain to see why, or ask again later."
            )
        await ctx.info(f"claimed {where(task)}")
        return prefixed(describe(task))

    @mcp.tool()
    async def heartbeat() -> str:
        """Renew the lease on your task now (this server also does it on its own)."""
        try:
            expires = await session.heartbeat()
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        return f"Lease on {where(session.held())} renewed until {expires}."

    @mcp.tool()
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
        return f"Completed {where(task)}; {after}. Call request_task for more work."

    @mcp.tool()
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
        return f"Released {where(task)} as {outcome}. Call request_task for other work."

    @mcp.tool()
    async def explain(
        roles: Annotated[
            list[str] | None, Field(description="Roles to explain for; omit for the defaults.")
        ] = None,
        repository: Annotated[str | None, Field(description="owner/name; omit for all.")] = None,
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

    @mcp.resource(
        "task://current",
        name="current-task",
        description="The task you hold (JSON, without the lease token), or null.",
        mime_type="application/json",
    )
    def current_task() -> str:
        task = session.task
        return "null" if task is None else public_json(task)

    @mcp.resource(
        "task://current/prompt",
        name="current-prompt",
        description="The prompt of the task you hold.",
        mime_type="text/markdown",
    )
    def current_prompt() -> str:
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
    mcp: FastMCP,
    transport: Literal["stdio", "http"],
    explainer: AsyncBrokerClient | None = None,
) -> None:
    """Run until the client goes away (stdio) or a signal stops it; release what is held."""
    try:
        if transport == "stdio":
            await mcp.run_stdio_async()
        else:
            await mcp.run_streamable_http_async()
    finally:
        await session.close()
        await session.client.aclose()
        if explainer is not None:
            await explainer.aclose()
