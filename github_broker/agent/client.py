"""Python SDK for agents: request, heartbeat, complete and release tasks over the HTTP API."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import requests
from pydantic import BaseModel, Field, ValidationError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base
from urllib3.exceptions import MaxRetryError, NewConnectionError

from github_broker import __version__
from github_broker.models import AgentCredential, AgentPause, Note, Task, TaskPause, TaskState

logger = logging.getLogger(__name__)

#: Seconds a single call may take (connect and read) unless it long-polls.
DEFAULT_TIMEOUT_S = 10.0
#: Extra attempts after the first one fails with a connection error or a 502/503/504.
DEFAULT_RETRIES = 4
#: First pause (seconds) between attempts; doubles per attempt, with jitter.
DEFAULT_BACKOFF_S = 0.5
#: Longest pause (seconds) between two attempts, whatever Retry-After says.
MAX_BACKOFF_S = 30.0
#: Gateway answers worth another attempt: the broker (or a proxy before it) is restarting.
RETRY_STATUSES = frozenset({502, 503, 504})
#: Longest progress note the broker takes (characters); a longer one is cut to this here.
MAX_NOTE_CHARS = 500

Previous = Literal["completed", "failed", "abandoned"]
ReleaseReason = Literal["failed", "abandoned"]


class BrokerClientError(Exception):
    """Base of every error the client raises; `status`, `reason` and `detail` (the broker's
    own words) come from the broker's answer."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str | None = None,
        detail: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.detail = detail


class Unauthorized(BrokerClientError):
    """401/403: the bearer token is missing, unknown, or bound to another agent id."""


class LeaseLost(BrokerClientError):
    """409 on a lease call: the lease is not yours any more; `reason` says why (`expired`,
    `revoked`, `issue_closed`, ...), `detail` the broker's words (a revoke: who and why),
    `state` the state its end left the task in for you (`completed`, `failed`, `timed_out`,
    `cancelled`; None when the broker does not say, e.g. `not_owner`)."""

    reason: str

    def __init__(
        self,
        message: str,
        *,
        status: int | None = 409,
        reason: str | None = None,
        detail: str | None = None,
        state: str | None = None,
    ):
        super().__init__(message, status=status, reason=reason or "unknown", detail=detail)
        self.state = state


class AgentPaused(BrokerClientError):
    """409 `agent_paused` on request-task: this agent is paused (by a maintainer, or by the
    circuit breaker); `detail` says by whom, why and how it is resumed. A task it held was
    settled first. Wait, then ask again: the same request succeeds once it is resumed."""


class RequestRejected(BrokerClientError):
    """Another 4xx: the request itself is wrong (agent id, role, repository, wait)."""


class BrokerUnavailable(BrokerClientError):
    """The broker stayed unreachable, or kept answering 503, through every retry."""


class Usage(BaseModel):
    """What the agent has spent on a task so far: running totals, so a retried report counts
    once (the broker sums them per issue against its budgets)."""

    tokens: int | None = Field(None, ge=0)
    cost: float | None = Field(None, ge=0)


class HeartbeatAnswer(BaseModel):
    """What a heartbeat learns: the new lease expiry and what the agent must know now."""

    #: The lease's new expiry (ISO 8601).
    expires_at: str
    #: The task's state; `waiting_for_user` while `paused`, `idle` when flagged stalled.
    state: TaskState = TaskState.IN_PROGRESS
    #: Maintainers' messages, each delivered once.
    notes: list[Note] = []
    #: The task reached a budget and waits for a person: stop working on it, keep
    #: heartbeating until a maintainer retries it (this goes back to None) or revokes it.
    paused: TaskPause | None = None
    #: This agent is paused: finish this task, then ask for no more (request-task raises
    #: AgentPaused until a maintainer resumes it).
    agent_paused: AgentPause | None = None


class BrokerClient:
    """A synchronous client for one agent; safe to share between threads (one session each).

    Every call has a timeout and is retried with exponential backoff and jitter on connection
    errors and 502/503/504 (honouring Retry-After); 4xx answers are never retried. Failures are
    raised, never turned into "no task".
    """

    def __init__(
        self,
        base_url: str,
        agent_id: str,
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_id = agent_id
        self.token = token
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        self._local = threading.local()
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()

    # --- the four calls -----------------------------------------------------------------

    def request_task(
        self,
        roles: list[str] | None = None,
        repositories: list[str] | None = None,
        wait_seconds: float = 0,
        previous: Previous = "completed",
        request_id: str | None = None,
    ) -> Task | None:
        """The next task, or None when the broker has none for this agent (after long-polling
        up to `wait_seconds`, at most 60).

        `previous` settles a task this agent still holds, in the same atomic step as the claim.
        Every attempt of one call carries the same `request_id` (a new one per call unless
        given; pass your own to make retries of your own idempotent too): a repeat that
        reaches the broker gets the task already handed out for it, with the same lease, and
        settles nothing, so a lost answer never costs a task or misfiles one as done.

        AgentPaused while a maintainer (or the circuit breaker) has paused this agent: wait,
        then ask again.
        """
        body = task_request_body(
            self.agent_id, wait_seconds, previous, request_id, roles, repositories
        )
        response, _ = self._post("/request-task", lambda _: body, self.timeout_s + wait_seconds)
        return task_from_answer(response, _error)

    def heartbeat(
        self, task: Task, *, note: str | None = None, usage: Usage | None = None
    ) -> HeartbeatAnswer:
        """Extend the task's lease and hear what happened: the new expiry, the task's state,
        maintainers' notes, a pause of the task or of this agent. LeaseLost (with `reason`
        and `detail`) if the lease is gone.

        `note`: what the agent is doing now, in a line (cut to MAX_NOTE_CHARS), shown to
        maintainers; a changed note counts as progress. `usage`: spent on this task so far.
        """
        body = {**self._lease_body(task), **heartbeat_extras(note, usage)}
        response, _ = self._post(task_path(task, "heartbeat"), lambda _: body, self.timeout_s)
        if response.status_code != 200:
            raise _error(response)
        return heartbeat_from_answer(response)

    def credential(self, task: Task) -> AgentCredential | None:
        """The task's short-lived GitHub token (its repository alone), when the broker hands
        them out (`task.credential_path`); None when it does not. LeaseLost if the lease is
        gone. Give it to the agent's command as GH_TOKEN / GITHUB_TOKEN (`github_env`)."""
        if not task.credential_path:
            return None
        response, _ = self._post(
            task_path(task, "credential"), lambda _: self._lease_body(task), self.timeout_s
        )
        return credential_from_answer(response, _error)

    def complete(self, task: Task) -> None:
        """Report the task done; development work moves on to review."""
        self._finish(task, "complete", {}, "completed")

    def release(self, task: Task, reason: ReleaseReason = "abandoned") -> None:
        """Give the task back (`failed` or `abandoned`); it returns to the pool at once."""
        self._finish(task, "release", {"reason": reason}, reason)

    @contextlib.contextmanager
    def retrying_within(self, budget: RetryBudget) -> Iterator[None]:
        """Calls this thread makes inside the block retry only while `budget` lasts (from
        the first failure it saw): the runner's --give-up-after."""
        before = self.retry_budget
        self._local.retry_budget = budget
        try:
            yield
        finally:
            self._local.retry_budget = before

    @property
    def retry_budget(self) -> RetryBudget | None:
        """The budget `retrying_within` set for this thread's calls, if any."""
        budget: RetryBudget | None = getattr(self._local, "retry_budget", None)
        return budget

    # --- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------

    def _finish(self, task: Task, action: str, extra: dict[str, Any], outcome: str) -> None:
        response, maybe_delivered = self._post(
            task_path(task, action),
            lambda _: {**self._lease_body(task), **extra},
            self.timeout_s,
        )
        if response.status_code == 200:
            return
        # An earlier attempt that got through leaves this outcome as the lease's tombstone.
        if maybe_delivered and response.status_code == 409 and _reason(response) == outcome:
            return
        raise _error(response)

    def _lease_body(self, task: Task) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "token": task.lease.token}

    def _session(self) -> requests.Session:
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers["User-Agent"] = f"github-broker-client/{__version__}"
            if self.token:
                session.headers["Authorization"] = f"Bearer {self.token}"
            self._local.session = session
            with self._lock:
                self._sessions.append(session)
        return session

    def _post(
        self, path: str, body: Callable[[bool], dict[str, Any]], read_timeout_s: float
    ) -> tuple[requests.Response, bool]:
        """POST with retries; returns the answer and whether an earlier attempt may have
        reached the broker (its effect may already have happened)."""
        url = self.base_url + path
        timeout = (min(self.timeout_s, DEFAULT_TIMEOUT_S), read_timeout_s)
        maybe_delivered = False

        def attempt() -> requests.Response:
            nonlocal maybe_delivered
            try:
                response = self._session().post(url, json=body(maybe_delivered), timeout=timeout)
            except requests.RequestException as e:
                if not _transient(e):
                    raise BrokerClientError(f"POST {url}: {e}") from e
                maybe_delivered = maybe_delivered or not _never_sent(e)
                raise
            if response.status_code in RETRY_STATUSES:
                # A gateway timeout may have let the request through; 502/503 did not.
                maybe_delivered = maybe_delivered or response.status_code == 504
                raise RetryStatus(response.status_code, _retry_after_s(response), response)
            return response

        try:
            return self._retrying(f"POST {path}")(attempt), maybe_delivered
        except RetryStatus as e:
            response = e.response
            raise BrokerUnavailable(
                f"POST {path}: broker unavailable ({response.status_code}): {_detail(response)}",
                status=response.status_code,
                reason=_reason(response),
            ) from None
        except requests.RequestException as e:
            raise BrokerUnavailable(f"POST {path}: broker unreachable: {e}") from e

    def _retrying(self, what: str) -> Retrying:
        return Retrying(**retry_policy(self, what, _retryable))


class RetryStatus(Exception):
    """A 502/503/504 answer (`retry_after_s` from its Retry-After): retried like a lost
    connection. Shared with the asyncio client."""

    def __init__(self, status: int, retry_after_s: float | None, response: Any) -> None:
        super().__init__(str(status))
        self.status = status
        self.retry_after_s = retry_after_s
        self.response = response


def retry_policy(
    client: Any, what: str, retryable: Callable[[BaseException], bool]
) -> dict[str, Any]:
    """tenacity's settings for one call of `client` (its `retries`, `backoff_s`, `agent_id`):
    exponential backoff with jitter, at least what Retry-After asks, at most MAX_BACKOFF_S;
    the last error re-raised."""

    def wait(state: RetryCallState) -> float:
        ceiling = min(MAX_BACKOFF_S, client.backoff_s * 2 ** (state.attempt_number - 1))
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, RetryStatus) and error.retry_after_s is not None:
            delay = min(MAX_BACKOFF_S, max(delay, float(error.retry_after_s)))
        return float(delay)

    def log(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        why = error.status if isinstance(error, RetryStatus) else type(error).__name__
        logger.info(
            "%s: %s; agent %s retries in %.1fs (attempt %d of %d)",
            what,
            why,
            client.agent_id,
            state.upcoming_sleep,
            state.attempt_number + 1,
            client.retries + 1,
        )

    return {
        "stop": stop_after_attempt(client.retries + 1) | _StopWhenSpent(client),
        "wait": wait,
        "retry": retry_if_exception(retryable),
        "before_sleep": log,
        "reraise": True,
    }


@dataclass
class RetryBudget:
    """How long calls may go on failing: `limit_s` seconds from the first failure seen."""

    limit_s: float
    #: time.monotonic() of the first failure, None while none was seen.
    since: float | None = None

    def failed(self) -> None:
        if self.since is None:
            self.since = time.monotonic()

    def left_s(self, after_s: float = 0.0) -> float:
        """Seconds left `after_s` seconds from now."""
        start = time.monotonic() if self.since is None else self.since
        return start + self.limit_s - time.monotonic() - after_s


class _StopWhenSpent(stop_base):
    """No attempt once the client's retry budget (BrokerClient.retrying_within) is spent."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, retry_state: RetryCallState) -> bool:
        budget: RetryBudget | None = getattr(self.client, "retry_budget", None)
        if budget is None:
            return False
        budget.failed()
        return budget.left_s(retry_state.upcoming_sleep or 0.0) < 0


def _retryable(e: BaseException) -> bool:
    if isinstance(e, RetryStatus):
        return True
    return isinstance(e, requests.RequestException) and _transient(e)


def new_request_id() -> str:
    """A request id for one logical request-task (the same on each of its retries)."""
    return uuid.uuid4().hex


def task_request_body(
    agent_id: str,
    wait_seconds: float,
    previous: str,
    request_id: str | None,
    roles: list[str] | None,
    repositories: list[str] | None,
) -> dict[str, Any]:
    """The JSON body of one logical request-task (both SDK clients send it on every retry)."""
    body: dict[str, Any] = {
        "agent_id": agent_id,
        "wait_seconds": wait_seconds,
        "previous": previous,
        "request_id": request_id or new_request_id(),
    }
    if roles:
        body["roles"] = list(roles)
    if repositories:
        body["repositories"] = list(repositories)
    return body


def task_from_answer(response: Any, error: Callable[[Any], BrokerClientError]) -> Task | None:
    """A request-task answer (requests or httpx response): the task, None for 204, or
    `error(response)` raised."""
    if response.status_code == 204:
        return None
    return answer_of(response, Task, "task", error)


def heartbeat_extras(note: str | None, usage: Usage | None) -> dict[str, Any]:
    """The optional part of a heartbeat body (both SDK clients send it)."""
    extras: dict[str, Any] = {}
    if note and note.strip():
        note = note.strip()
        extras["note"] = note if len(note) <= MAX_NOTE_CHARS else note[: MAX_NOTE_CHARS - 1] + "…"
    if usage is not None:
        extras["usage"] = usage.model_dump(exclude_none=True)
    return extras


def heartbeat_from_answer(response: Any) -> HeartbeatAnswer:
    """A heartbeat's 200 answer (requests or httpx response) as a HeartbeatAnswer."""
    return answer_of(response, HeartbeatAnswer, "heartbeat answer", _unexpected)


def credential_from_answer(
    response: Any, error: Callable[[Any], BrokerClientError]
) -> AgentCredential:
    """A credential call's answer (requests or httpx response), or `error(response)` raised."""
    return answer_of(response, AgentCredential, "credential", error)


M = TypeVar("M", bound=BaseModel)


def answer_of(
    response: Any, model: type[M], what: str, error: Callable[[Any], BrokerClientError]
) -> M:
    """A 200 answer (requests or httpx response) as `model`; `error(response)` raised for any
    other status, BrokerClientError for a body that is not one."""
    if response.status_code != 200:
        raise error(response)
    try:
        return model.model_validate(response.json())
    except (ValueError, ValidationError) as e:
        raise BrokerClientError(
            f"unexpected {what} from the broker: {e}", status=response.status_code
        ) from e


def _unexpected(response: Any) -> BrokerClientError:
    return BrokerClientError(
        f"unexpected answer from the broker: {response.status_code}", status=response.status_code
    )


def github_env(credential: AgentCredential | None) -> dict[str, str]:
    """The variables GitHub's tools read a token from (`gh`, git credential helpers, most
    SDKs): GH_TOKEN and GITHUB_TOKEN; nothing without a credential."""
    if credential is None:
        return {}
    return {"GH_TOKEN": credential.token, "GITHUB_TOKEN": credential.token}


def task_path(task: Task, action: str) -> str:
    """The path of a lease call (`heartbeat`, `complete`, `release`, `credential`) on
    `task`."""
    owner, _, repo = task.repository.partition("/")
    return f"/tasks/{quote(owner, safe='')}/{quote(repo, safe='')}/{task.issue_id}/{action}"


def _never_sent(e: requests.RequestException) -> bool:
    """True when the request cannot have reached the broker (the connection never opened)."""
    if isinstance(e, requests.ConnectTimeout):
        return True
    cause = e.args[0] if e.args else None
    return isinstance(cause, MaxRetryError) and isinstance(cause.reason, NewConnectionError)


def _transient(e: requests.RequestException) -> bool:
    # ChunkedEncodingError: the connection was cut while the answer was being read.
    return isinstance(
        e, requests.ConnectionError | requests.Timeout | requests.exceptions.ChunkedEncodingError
    )


def _retry_after_s(response: Any) -> float | None:
    """Seconds a Retry-After header asks for (requests or httpx response)."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _problem(response: Any) -> dict[str, Any]:
    """The broker's error body (requests or httpx response), or {}."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _detail(response: requests.Response) -> str:
    detail = _problem(response).get("detail")
    if isinstance(detail, str) and detail:
        return detail
    return response.text[:200] or response.reason or "no detail"


def _reason(response: Any) -> str | None:
    reason = _problem(response).get("reason")
    return reason if isinstance(reason, str) else None


def _state(response: Any) -> str | None:
    state = _problem(response).get("state")
    return state if isinstance(state, str) else None


def _error(response: requests.Response) -> BrokerClientError:
    status, detail = response.status_code, _detail(response)
    message = f"{response.request.method} {response.request.path_url}: {status} {detail}"
    return error_for(status, message, _reason(response), detail, _state(response))


def error_for(
    status: int, message: str, reason: str | None, detail: str, state: str | None = None
) -> BrokerClientError:
    """The SDK's error for a broker's answer `status` (both SDK clients raise the same)."""
    if status == 409 and reason == "agent_paused":
        return AgentPaused(message, status=status, reason=reason, detail=detail)
    if status == 409:
        return LeaseLost(message, reason=reason, detail=detail, state=state)
    if status in (401, 403):
        return Unauthorized(message, status=status, reason=reason, detail=detail)
    if 400 <= status < 500:
        return RequestRejected(message, status=status, reason=reason, detail=detail)
    return BrokerClientError(message, status=status, reason=reason, detail=detail)
