"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from github_broker.models import Outcome

#: Agent ids become GitHub label names (max 50 characters) and key parts.
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$"


class TaskRequest(BaseModel):
    """`POST /request-task`. `{agent_id}` alone is the original's request and still works."""

    model_config = ConfigDict(extra="ignore")

    agent_id: str = Field(
        pattern=AGENT_ID_PATTERN, description="Your agent id; also a label on GitHub."
    )
    roles: list[str] | None = Field(None, description="Roles you accept; omit to take any role.")
    repositories: list[str] | None = Field(None, description="owner/name list; omit for all.")
    wait_seconds: float = Field(0, ge=0, le=60, description="Long-poll up to this many seconds.")
    previous: Outcome = Field(
        Outcome.COMPLETED,
        description="What happened to a task you still hold: completed, failed or abandoned.",
    )


class LeaseRequest(BaseModel):
    """Heartbeat, complete and release bodies: who you are and the lease token."""

    agent_id: str = Field(pattern=AGENT_ID_PATTERN)
    token: str = Field(min_length=1, max_length=200)


class ReleaseRequest(LeaseRequest):
    reason: Literal["failed", "abandoned"] = "abandoned"


class FixComment(BaseModel):
    author: str = Field(min_length=1, max_length=100)
    body: str = Field(min_length=1, max_length=65536)
    path: str | None = None
    line: int | None = Field(None, ge=1)
    url: str = ""


class FixRequest(BaseModel):
    """`POST /tasks/fix`: feedback on a PR that should become a fix task now."""

    repository: str = Field(description="owner/name")
    issue: int = Field(ge=1, description="the issue the PR works on")
    pr: int = Field(ge=1, description="the pull request to fix")
    pr_url: str = ""
    branch: str | None = Field(None, description="default: the issue's branch")
    comments: list[FixComment] = Field(min_length=1, max_length=100)


class FixAccepted(BaseModel):
    task_id: str
    status: str


class HeartbeatResponse(BaseModel):
    expires_at: str


class Done(BaseModel):
    status: str


class Problem(BaseModel):
    """Every error answer."""

    detail: str
    reason: str | None = None
