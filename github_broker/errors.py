"""The project's error hierarchy, and the error body every HTTP answer of the API and the
dashboard shares (`Problem`, and how routes declare it in the OpenAPI); library exceptions are
translated into these at the edges."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class BrokerError(Exception):
    """Base of every error github-broker raises on purpose."""


class ConfigError(BrokerError):
    """The configuration is invalid; the message names the file, the field and the fix."""


class StoreUnavailable(BrokerError):
    """Redis cannot be reached or answered with an error."""


class CallUnanswered(StoreUnavailable):
    """Redis did not answer a call (no reply within the bound, the connection lost): it may
    still run it later."""


class MirrorRebuilding(StoreUnavailable):
    """Redis lost its data and the sync has not rebuilt the mirror yet; retry shortly."""


class NotDurable(StoreUnavailable):
    """Redis ran the write but did not make it durable (replicas, AOF) within the bound."""


class Fenced(BrokerError):
    """A poller that lost leadership tried to write; another process leads now."""


class GitHubError(BrokerError):
    """GitHub answered with an error that retrying will not fix."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GitHubNotFound(GitHubError):
    """The repository, issue, label or ref does not exist."""


class GitHubRefused(GitHubError):
    """GitHub refused a write (422); `code` is its reason: already_exists, invalid, ..."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message, status=422)
        self.code = code


class GitHubUnavailable(BrokerError):
    """GitHub timed out, refused the connection or answered 5xx; retry later."""


class RateLimited(BrokerError):
    """GitHub's primary or secondary rate limit was hit; do not call before `retry_at_s`."""

    def __init__(self, message: str, *, retry_at_s: float) -> None:
        super().__init__(message)
        self.retry_at_s = retry_at_s


class LeaseError(BrokerError):
    """A heartbeat, completion or release was refused; `reason` says why."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


class AgentPaused(BrokerError):
    """The agent is paused (by a maintainer or the circuit breaker): no new task for it."""

    reason = "agent_paused"


class NotFound(BrokerError):
    """The addressed repository or task is unknown to the broker."""


class Conflict(BrokerError):
    """The request collides with existing state (a fix task already pending)."""


class InvalidRequest(BrokerError):
    """The request is well-formed JSON but asks for something impossible."""


class AuthError(BrokerError):
    """Missing or wrong credentials, or a token used for another agent's id."""


class Forbidden(AuthError):
    """Valid credentials, but not for this agent, endpoint or repository (403)."""

    forbidden = True


#: What `Problem.reason` says, per status; the OpenAPI carries it as the field's description.
REASON_DOC = (
    "Why, for programs: 401 `unauthorized` (no or an unknown token, or a webhook signature "
    "that does not match), 403 `forbidden` (a token of another agent, a maintainer outside "
    "their repositories, a cross-origin request while no token is configured), 404 "
    "`not_found` (a repository, issue, path or organization the broker does not serve), 405 "
    "`method_not_allowed`, 409 the lease refusal (`expired`, `revoked`, `not_owner`, "
    "`issue_closed`, `label_removed`, ...) or `conflict`, 413 `too_large`, 421 `misdirected` "
    "(no token is configured and the Host is neither a loopback name nor an allowed one), 422 "
    "`invalid_request`, 429 `too_many_attempts` (dashboard login), 500 `internal`, 503 "
    "`unavailable` (Redis or GitHub cannot be reached), `rebuilding` (Redis lost its data "
    "and the mirror is being rebuilt) or `rate_limited` (GitHub's rate limit)."
)


class Problem(BaseModel):
    """Every error answer: `detail` for people (never an internal address), `reason` for
    programs."""

    detail: str
    reason: str | None = Field(None, description=REASON_DOC)
    state: str | None = Field(
        None,
        description="On a 409 that refuses a lease call: the state the lease's end left the "
        "task in for this agent (`completed`, `failed`, `timed_out`, `cancelled`); absent "
        "otherwise.",
    )


#: A `Problem` answered as JSON, declared by hand: a `model` in `responses` would be declared
#: in the route's own media type (text/plain for /metrics, text/html for the dashboard).
PROBLEM_JSON: dict[str, Any] = {
    "application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}
}
#: Declared on every route: `BodyLimit` caps the body of every request, whatever its method,
#: and answers JSON.
BODY_LIMIT_RESPONSE: dict[int | str, dict[str, Any]] = {
    413: {"description": "The body is larger than server.max_body_bytes.", "content": PROBLEM_JSON}
}


def in_words(e: BrokerError) -> str:
    """A broker error as a person reads it on a page: what failed, then the detail (the
    store's errors, whatever their kind, read "Redis unavailable")."""
    what = "Redis unavailable" if isinstance(e, StoreUnavailable) else type(e).__name__
    return f"{what}: {e}"
