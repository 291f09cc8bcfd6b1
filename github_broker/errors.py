"""The project's error hierarchy; library exceptions are translated into these at the edges."""


class BrokerError(Exception):
    """Base of every error github-broker raises on purpose."""


class ConfigError(BrokerError):
    """The configuration is invalid; the message names the file, the field and the fix."""


class StoreUnavailable(BrokerError):
    """Redis cannot be reached or answered with an error."""


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
