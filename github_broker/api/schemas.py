"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from github_broker.claim.rules import branch_problem
from github_broker.models import (
    AGENT_ID_PATTERN,
    MAX_LIST_ITEMS,
    MAX_NUMBER,
    REQUEST_ID_PATTERN,
    AgentPause,
    Note,
    Outcome,
    RepoName,
    RoleName,
    TaskPause,
    TaskState,
)


def _json_integer(value: Any) -> Any:
    """What the OpenAPI's `integer` admits: a JSON number without a fraction (`2`, `2.0`),
    never `true` or `"2"`, which pydantic's lax mode would read as one."""
    if isinstance(value, bool | str | bytes):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


#: An issue, PR or line number in a request body: 1 .. 2^53-1, a JSON integer (pydantic's
#: strict int would refuse `2.0`). The bounds come before the validator, so that the OpenAPI
#: declares them as `minimum` and `maximum`.
BodyNumber = Annotated[int, Field(ge=1, le=MAX_NUMBER), BeforeValidator(_json_integer)]


class TaskRequest(BaseModel):
    """`POST /request-task`. `{agent_id}` alone is the original's request and still works."""

    model_config = ConfigDict(extra="ignore")

    agent_id: str = Field(
        pattern=AGENT_ID_PATTERN, description="Your agent id; also a label on GitHub."
    )
    roles: list[RoleName] | None = Field(
        None,
        max_length=MAX_LIST_ITEMS,
        description="Roles you accept (from agents.yml); omit to take any role.",
    )
    repositories: list[RepoName] | None = Field(
        None, max_length=MAX_LIST_ITEMS, description="owner/name list; omit for all."
    )
    # strict: a number, not `false` or `"5"` read as one (what the OpenAPI declares).
    wait_seconds: float = Field(
        0, ge=0, le=60, strict=True, description="Long-poll up to this many seconds."
    )
    previous: Outcome = Field(
        Outcome.COMPLETED,
        description="What happened to a task you still hold: completed, failed or abandoned.",
    )
    request_id: str | None = Field(
        None,
        pattern=REQUEST_ID_PATTERN,
        description="One id per logical request, reused on every retry: a repeat gets the "
        "task already handed out for it (same lease) and settles nothing.",
    )


class LeaseRequest(BaseModel):
    """Heartbeat, complete and release bodies: who you are and the lease token."""

    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    token: str = Field(min_length=1, max_length=512)


#: Longest progress note a heartbeat may carry (characters).
MAX_NOTE_CHARS = 500


class Usage(BaseModel):
    """What the agent has spent on this task so far (cumulative: a retried report counts
    once)."""

    tokens: Annotated[int, Field(ge=0, le=MAX_NUMBER), BeforeValidator(_json_integer)] | None = None
    cost: float | None = Field(None, ge=0, le=1e12, strict=True)


class HeartbeatRequest(LeaseRequest):
    """Heartbeat body: the lease, and optionally a progress note and the usage so far."""

    note: str | None = Field(
        None,
        max_length=MAX_NOTE_CHARS,
        description="What you are doing now, in a line; shown to maintainers. A changed note "
        "counts as progress beside what GitHub shows.",
    )
    usage: Usage | None = None


class ReleaseRequest(LeaseRequest):
    reason: Literal["failed", "abandoned"] = "abandoned"


class FixComment(BaseModel):
    author: str = Field(min_length=1, max_length=100)
    body: str = Field(min_length=1, max_length=65536)
    path: str | None = Field(None, max_length=1000)
    line: BodyNumber | None = None
    url: str = Field("", max_length=2000)


class FixRequest(BaseModel):
    """`POST /tasks/fix`: feedback on a PR that should become a fix task now."""

    repository: RepoName = Field(description="owner/name")
    issue: BodyNumber = Field(description="the issue the PR works on")
    pr: BodyNumber = Field(description="the pull request to fix")
    pr_url: str = Field("", max_length=2000)
    branch: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="default: the issue's branch; git ref rules apply",
    )
    comments: list[FixComment] = Field(min_length=1, max_length=100)

    @field_validator("branch")
    @classmethod
    def _usable_branch(cls, value: str | None) -> str | None:
        if value is not None:
            problem = branch_problem(value, None)
            if problem:
                raise ValueError(problem)
        return value


class FixAccepted(BaseModel):
    task_id: str
    status: str


class HeartbeatResponse(BaseModel):
    """The new expiry and what the agent must know now: the task's state, maintainers'
    notes (delivered once), a budget pause of the task, a pause of the agent (finish this
    task; no new one is handed out)."""

    expires_at: str
    state: TaskState
    notes: list[Note] = []
    paused: TaskPause | None = None
    agent_paused: AgentPause | None = None


class Done(BaseModel):
    status: str


class Readiness(BaseModel):
    """`GET /ready`, with 200 and with 503: each dependency's check."""

    ready: bool
    checks: dict[str, str]
