"""The tools of one agent's MCP server: request_task, heartbeat, complete, release and
explain, with the words of their answers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.server.session import ServerSession
from mcp.types import LoggingLevel
from pydantic import ConfigDict, Field, ValidationError

from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import (
    AgentPaused,
    BrokerClientError,
    BrokerUnavailable,
    HeartbeatAnswer,
    Unauthorized,
)
from github_broker.agent.session import AgentSession, NoTask, TaskHeld, where
from github_broker.models import (
    MAX_LIST_ITEMS,
    REQUEST_ID_PATTERN,
    AgentCredential,
    RepoName,
    RoleName,
    Task,
)

logger = logging.getLogger(__name__)

#: Long-poll (seconds) of request_task when the agent does not say.
DEFAULT_WAIT_S = 10.0

#: Sends a log message to the client: (its session, level, text, the request it belongs to).
ClientLogger = Callable[[ServerSession, LoggingLevel, str, str | int | None], Awaitable[None]]

Roles = Annotated[
    list[RoleName] | None,
    Field(max_length=MAX_LIST_ITEMS, description="Roles you accept; omit for the defaults."),
]
Repositories = Annotated[
    list[RepoName] | None,
    Field(max_length=MAX_LIST_ITEMS, description="owner/name list; omit for all."),
]
WaitSeconds = Annotated[float, Field(ge=0, le=60, description="Wait up to this long for a task.")]
RequestId = Annotated[
    str | None,
    Field(
        pattern=REQUEST_ID_PATTERN,
        description="Reuse the same id when you retry this call after an error.",
    ),
]


def describe(task: Task, check_interval_s: float, credential: AgentCredential | None = None) -> str:
    """What an LLM needs to start: where, which branch, the task's GitHub token if any, what
    to do next, then the prompt."""
    lines = [
        f"You now hold {where(task)}: {task.title!r} "
        f"({task.task_type.value}, role {task.required_role}).",
        f"Issue: {task.issue_url}",
        f"Branch: {task.branch_name} (from {task.base_branch})",
    ]
    if task.pr_url:
        lines.append(f"Pull request: {task.pr_url}")
    if credential is not None:
        lines.append(
            f"GitHub token for this task ({credential.repository} only, until "
            f"{credential.expires_at}): run git and gh with GH_TOKEN={credential.token} and "
            f"GITHUB_TOKEN={credential.token} in their environment; do not use another token."
        )
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


def broker_error(e: BrokerClientError) -> str:
    if isinstance(e, BrokerUnavailable):
        return f"the broker is unreachable, try again shortly: {e}"
    if isinstance(e, Unauthorized):
        return f"the broker refused this agent's credentials (check --token / --agent-id): {e}"
    return f"the broker refused: {e}"


class _StrictMetadata(FuncMetadata):
    """Arguments taken exactly as the published schema says: no JSON text read as a list."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        return data


def argument_problems(error: ValidationError) -> str:
    """What is wrong with a tool call's arguments, in one line a model can act on (pydantic's
    own text spans lines and ends each with a link to its documentation)."""
    parts = []
    for e in error.errors(include_url=False):
        name = ".".join(str(p) for p in e["loc"]) or "arguments"
        if e["type"] in ("extra_forbidden", "missing"):
            problem = "required" if e["type"] == "missing" else "not an argument of this tool"
            parts.append(f"{name}: {problem}")
            continue
        given = repr(e.get("input"))
        given = given if len(given) <= 40 else given[:39] + "…"
        parts.append(f"{name}: {e['msg'][0].lower()}{e['msg'][1:]} (got {given})")
    return "; ".join(parts)


class StrictTool(Tool):
    """A tool whose refused arguments are answered in one line."""

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as e:
            if not isinstance(e.__cause__, ValidationError):
                raise
            takes = ", ".join(self.parameters.get("properties", {})) or "no arguments"
            raise ToolError(
                f"{self.name} refused its arguments: {argument_problems(e.__cause__)}. "
                f"It takes: {takes}."
            ) from e.__cause__


def strict_tool(fn: Callable[..., Any]) -> Tool:
    """`fn` as a tool that refuses what the broker would: unknown arguments, `"5"` for a
    number, `true` for a string (the published inputSchema says `additionalProperties:
    false`, and the same model validates every call), each refusal in one line."""
    tool = StrictTool.from_function(fn)
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


class AgentTools:
    """One agent's tools over its session; each method's docstring is the tool's description.

    `roles`/`repositories` are the defaults of request_task; `explainer` is the client
    explain uses (the broker answers /explain to its admin token)."""

    def __init__(
        self,
        session: AgentSession,
        explainer: AsyncBrokerClient,
        log: ClientLogger,
        roles: list[str] | None = None,
        repositories: list[str] | None = None,
    ) -> None:
        self.session = session
        self.explainer = explainer
        self.log = log
        self.default_roles = roles
        self.default_repositories = repositories

    def tools(self) -> list[Tool]:
        return [
            strict_tool(f)
            for f in (self.request_task, self.heartbeat, self.complete, self.release, self.explain)
        ]

    def _prefixed(self, text: str) -> str:
        """`text` after what maintainers said since the last tool answer."""
        news = self.session.take_news()
        return "\n\n".join([*news, text])

    async def request_task(
        self,
        ctx: Context,
        roles: Roles = None,
        repositories: Repositories = None,
        wait_seconds: WaitSeconds = DEFAULT_WAIT_S,
        request_id: RequestId = None,
    ) -> str:
        """Ask the broker for the next task for you: an issue to work on, with its prompt."""
        client_session = ctx.session

        async def notify(message: str) -> None:
            await self.log(client_session, "warning", message, None)

        chosen_roles = roles or self.default_roles
        try:
            task = await self.session.claim(
                chosen_roles,
                repositories or self.default_repositories,
                wait_seconds,
                request_id,
                notify,
            )
        except TaskHeld as e:
            raise ToolError(str(e)) from e
        except AgentPaused as e:
            raise ToolError(self._prefixed(paused_refusal(e))) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        if task is None:
            return self._prefixed(
                f"No task for you right now (roles {', '.join(chosen_roles or ['any'])}, "
                f"waited {wait_seconds:g}s). Call explain to see why, or ask again later."
            )
        await self.log(ctx.session, "info", f"claimed {where(task)}", ctx.request_id)
        credential = await self.session.credential(task)
        return self._prefixed(describe(task, self.session.check_interval_s, credential))

    async def heartbeat(self) -> str:
        """Renew the lease on your task now (this server also does it on its own)."""
        try:
            answer = await self.session.heartbeat()
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        return self._prefixed(describe_beat(self.session.held(), answer))

    async def complete(
        self,
        summary: Annotated[str, Field(max_length=4000, description="What you did.")] = "",
    ) -> str:
        """Report your task done after pushing its branch; development work goes to review."""
        try:
            task = await self.session.finish("completed")
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        logger.info("%s completed %s: %s", self.session.agent_id, where(task), summary or "-")
        after = (
            "it moves to review (needs-review)" if task.task_type.value == "development" else "done"
        )
        return self._prefixed(f"Completed {where(task)}; {after}. Call request_task for more work.")

    async def release(
        self,
        outcome: Annotated[
            Literal["failed", "abandoned"],
            Field(description="failed: you tried and could not; abandoned: you stopped."),
        ],
        reason: Annotated[str, Field(min_length=1, max_length=4000, description="Why.")],
    ) -> str:
        """Give your task back to the pool (failed or abandoned), saying why."""
        try:
            task = await self.session.finish(outcome)
        except NoTask as e:
            raise ToolError(str(e)) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        logger.info("%s released %s as %s: %s", self.session.agent_id, where(task), outcome, reason)
        return self._prefixed(
            f"Released {where(task)} as {outcome}. Call request_task for other work."
        )

    async def explain(
        self,
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
            data = await self.explainer.explain(roles or self.default_roles, repository)
        except Unauthorized as e:
            raise ToolError(
                f"the broker explains only to its admin token ({e}); start this server with "
                "--admin-token or ask the broker's operator"
            ) from e
        except BrokerClientError as e:
            raise ToolError(broker_error(e)) from e
        return self._prefixed(describe_verdicts(data))
