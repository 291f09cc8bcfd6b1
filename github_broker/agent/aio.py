"""asyncio SDK for agents: the same four calls, errors and retries as `client.py`, on httpx."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from tenacity import AsyncRetrying

from github_broker import __version__
from github_broker.agent.client import (
    DEFAULT_BACKOFF_S,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_S,
    RETRY_STATUSES,
    BrokerClientError,
    BrokerUnavailable,
    HeartbeatAnswer,
    Previous,
    ReleaseReason,
    RetryStatus,
    Usage,
    _problem,
    _reason,
    _retry_after_s,
    _state,
    credential_from_answer,
    error_for,
    heartbeat_extras,
    heartbeat_from_answer,
    retry_policy,
    task_from_answer,
    task_path,
    task_request_body,
)
from github_broker.models import AgentCredential, Task

logger = logging.getLogger(__name__)

#: httpx errors worth another attempt: the broker restarting, a cut connection, a timeout.
TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


class AsyncBrokerClient:
    """An asyncio client for one agent; one connection pool, shareable between tasks.

    Like `BrokerClient`: every call has a timeout and is retried (tenacity) with exponential
    backoff and jitter on connection errors and 502/503/504, honouring Retry-After; 4xx
    answers are never retried; failures are raised, never turned into "no task".
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
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_id = agent_id
        self.timeout_s = timeout_s
        self.retries = max(0, retries)
        self.backoff_s = backoff_s
        headers = {"User-Agent": f"github-broker-client/{__version__}"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=transport)

    # --- the four calls -----------------------------------------------------------------

    async def request_task(
        self,
        roles: list[str] | None = None,
        repositories: list[str] | None = None,
        wait_seconds: float = 0,
        previous: Previous = "completed",
        request_id: str | None = None,
    ) -> Task | None:
        """The next task, or None when there is none (after long-polling `wait_seconds`).

        One `request_id` (given, or made here) goes with every attempt of this call, as in
        `BrokerClient`: a repeat that reached the broker gets the same hand-out and settles
        nothing, so every attempt sends the same body. AgentPaused while this agent is paused.
        """
        body = task_request_body(
            self.agent_id, wait_seconds, previous, request_id, roles, repositories
        )
        read_timeout_s = self.timeout_s + wait_seconds
        response, _ = await self._post("/request-task", lambda _: body, read_timeout_s)
        return task_from_answer(response, _error)

    async def heartbeat(
        self, task: Task, *, note: str | None = None, usage: Usage | None = None
    ) -> HeartbeatAnswer:
        """Extend the task's lease and hear what happened (as `BrokerClient.heartbeat`):
        expiry, state, maintainers' notes, pauses; LeaseLost if the lease is gone."""
        body = {**self._lease_body(task), **heartbeat_extras(note, usage)}
        response, _ = await self._post(task_path(task, "heartbeat"), lambda _: body, self.timeout_s)
        if response.status_code != 200:
            raise _error(response)
        return heartbeat_from_answer(response)

    async def credential(self, task: Task) -> AgentCredential | None:
        """The task's short-lived GitHub token (as `BrokerClient.credential`); None when the
        broker hands out none."""
        if not task.credential_path:
            return None
        response, _ = await self._post(
            task_path(task, "credential"), lambda _: self._lease_body(task), self.timeout_s
        )
        return credential_from_answer(response, _error)

    async def complete(self, task: Task) -> None:
        """Report the task done; development work moves on to review."""
        await self._finish(task, "complete", {}, "completed")

    async def release(self, task: Task, reason: ReleaseReason = "abandoned") -> None:
        """Give the task back (`failed` or `abandoned`); it returns to the pool at once."""
        await self._finish(task, "release", {"reason": reason}, reason)

    async def explain(
        self, roles: list[str] | None = None, repository: str | None = None
    ) -> dict[str, list[dict[str, Any]]]:
        """`GET /explain`: per repository, each issue's verdict for an agent with `roles`."""
        params: dict[str, str | list[str]] = {"roles": list(roles or ())}
        if repository:
            params["repository"] = repository
        response = await self._get("/explain", params)
        if response.status_code != 200:
            raise _error(response)
        data: dict[str, list[dict[str, Any]]] = response.json()
        return data

    # --- lifecycle ----------------------------------------------------------------------

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncBrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- transport ----------------------------------------------------------------------

    async def _finish(self, task: Task, action: str, extra: dict[str, Any], outcome: str) -> None:
        response, maybe_delivered = await self._post(
            task_path(task, action), lambda _: {**self._lease_body(task), **extra}, self.timeout_s
        )
        if response.status_code == 200:
            return
        # An earlier attempt that got through leaves this outcome as the lease's tombstone.
        if maybe_delivered and response.status_code == 409 and _reason(response) == outcome:
            return
        raise _error(response)

    def _lease_body(self, task: Task) -> dict[str, Any]:
        return {"agent_id": self.agent_id, "token": task.lease.token}

    def _timeout(self, read_timeout_s: float) -> httpx.Timeout:
        return httpx.Timeout(read_timeout_s, connect=min(self.timeout_s, DEFAULT_TIMEOUT_S))

    def _retrying(self, what: str) -> AsyncRetrying:
        return AsyncRetrying(
            **retry_policy(self, what, lambda e: isinstance(e, (*TRANSIENT, RetryStatus)))
        )

    async def _post(
        self, path: str, body: Callable[[bool], dict[str, Any]], read_timeout_s: float
    ) -> tuple[httpx.Response, bool]:
        """POST with retries; returns the answer and whether an earlier attempt may have
        reached the broker (its effect may already have happened)."""
        maybe_delivered = False
        with _client_errors(f"POST {path}"):
            async for attempt in self._retrying(f"POST {path}"):
                with attempt:
                    try:
                        response = await self._http.post(
                            path,
                            json=body(maybe_delivered),
                            timeout=self._timeout(read_timeout_s),
                        )
                    except TRANSIENT as e:
                        maybe_delivered = maybe_delivered or not _never_sent(e)
                        raise
                    if response.status_code in RETRY_STATUSES:
                        # A gateway timeout may have let the request through; 502/503 did not.
                        maybe_delivered = maybe_delivered or response.status_code == 504
                        raise RetryStatus(response.status_code, _retry_after_s(response), response)
                    return response, maybe_delivered
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _get(self, path: str, params: dict[str, str | list[str]]) -> httpx.Response:
        with _client_errors(f"GET {path}"):
            async for attempt in self._retrying(f"GET {path}"):
                with attempt:
                    response = await self._http.get(
                        path, params=params, timeout=self._timeout(self.timeout_s)
                    )
                    if response.status_code in RETRY_STATUSES:
                        raise RetryStatus(response.status_code, _retry_after_s(response), response)
                    return response
        raise AssertionError("unreachable: the last attempt returns or raises")


@contextmanager
def _client_errors(what: str) -> Iterator[None]:
    """httpx's failures, once the retries are spent, as the client's own errors."""
    try:
        yield
    except RetryStatus as e:
        raise _unavailable(what, e.response) from None
    except TRANSIENT as e:
        raise BrokerUnavailable(f"{what}: broker unreachable: {e!r}") from e
    except httpx.HTTPError as e:
        raise BrokerClientError(f"{what}: {e!r}") from e


def _never_sent(e: Exception) -> bool:
    """True when the request cannot have reached the broker (the connection never opened)."""
    return isinstance(e, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)


def _detail(response: httpx.Response) -> str:
    detail = _problem(response).get("detail")
    if isinstance(detail, str) and detail:
        return detail
    return response.text[:200] or response.reason_phrase or "no detail"


def _unavailable(what: str, response: httpx.Response) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"{what}: broker unavailable ({response.status_code}): {_detail(response)}",
        status=response.status_code,
        reason=_reason(response),
    )


def _error(response: httpx.Response) -> BrokerClientError:
    status, detail = response.status_code, _detail(response)
    message = f"{response.request.method} {response.request.url.path}: {status} {detail}"
    return error_for(status, message, _reason(response), detail, _state(response))
