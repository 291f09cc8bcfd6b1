"""The gateway's transport: one request to GitHub with its quota, pacing, conditional cache,
error translation and call count; GraphQL's endpoint; a repository addressed by id.

Blocking by nature (PyGithub is synchronous): async callers run the gateway's methods in a
worker thread (`asyncio.to_thread`), never on the event loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlencode

import requests
from github import Auth, Github, GithubException

from github_broker.errors import (
    GitHubError,
    GitHubNotFound,
    GitHubRefused,
    GitHubUnavailable,
    RateLimited,
)
from github_broker.gateway.pacing import TokenBucket, WritePacer
from github_broker.metrics import observe_github
from github_broker.models import Quota
from github_broker.settings import GitHubSettings

logger = logging.getLogger(__name__)

#: Pause when GitHub says "secondary rate limit" without a Retry-After header (GitHub's advice).
SECONDARY_LIMIT_DEFAULT_S = 60.0
#: Conditional-request cache entries kept per gateway (URL -> ETag and body).
ETAG_CACHE_SIZE = 4096
#: Verbs GitHub's secondary limit counts as content-creating (GraphQL mutations are POSTs).
WRITE_VERBS = frozenset({"POST", "PATCH", "PUT", "DELETE"})


#: The GitHub requests made under `counting_calls` (asyncio.to_thread copies the context,
#: so calls made in worker threads count too); None outside it.
_CALLS: ContextVar[list[int] | None] = ContextVar("github_calls", default=None)


@contextlib.contextmanager
def counting_calls() -> Iterator[list[int]]:
    """Count the GitHub requests this context makes inside the block: `[n]` once it ends."""
    counter = [0]
    token = _CALLS.set(counter)
    try:
        yield counter
    finally:
        _CALLS.reset(token)


class Transport:
    """Requests to GitHub: quota respected and noted, writes paced, errors translated."""

    def __init__(self, settings: GitHubSettings) -> None:
        self.settings = settings
        #: When GitHub last answered anything but a 5xx (time.time()): it is reachable.
        self.last_answer_s = 0.0
        self._github = Github(
            auth=_auth(settings),
            base_url=settings.base_url.rstrip("/"),
            timeout=int(max(1, settings.timeout_s)),
            per_page=settings.per_page,
            # Retries, pacing and rate-limit waits are ours; PyGithub's would block silently.
            retry=None,
            seconds_between_requests=None,
            # Pacing is ours too (`writes`): a token bucket, not a fixed sleep per write.
            seconds_between_writes=None,
        )
        self._requester = self._github.requester
        self._lock = threading.Lock()
        self.quota = Quota()
        self.graphql_quota = Quota()
        self.calls = 0
        gap = settings.seconds_between_writes
        hourly = settings.writes_per_hour if gap > 0 else 0
        self.writes = WritePacer(
            TokenBucket(1 / gap if gap > 0 else 0, settings.write_burst),
            TokenBucket(hourly / 3600, hourly),
        )
        self._etags: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        # Configured full name -> `/repositories/{id}`: a renamed or transferred repository
        # keeps its id, and PyGithub would follow GitHub's 301 dropping the query string.
        self._repo_paths: dict[str, str] = {}

    def close(self) -> None:
        self._github.close()

    def _request(
        self,
        verb: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        etag: str | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        graphql = path.endswith("graphql")
        self._respect_quota(self.graphql_quota if graphql else self.quota)
        if verb in WRITE_VERBS:
            self.writes.take()
        headers = {"If-None-Match": etag} if etag else None
        started = time.perf_counter()
        try:
            status, raw_headers, output = self._requester.requestJson(
                verb, path, parameters=params, headers=headers, input=body
            )
        except requests.exceptions.RequestException as e:
            observe_github(verb, path, "error", started)
            # requests names the host and port (`HTTPConnectionPool(host=...)`): that goes to
            # the log, the error that may reach a client says what happened.
            logger.warning("GitHub %s %s failed: %s", verb, path, e)
            raise GitHubUnavailable(f"{verb} {path}: {network_problem(e)}") from e
        except GithubException as e:
            # Raised by PyGithub itself, e.g. minting a GitHub App installation token.
            observe_github(verb, path, str(e.status), started)
            if e.status >= 500:
                raise GitHubUnavailable(f"{verb} {path}: {e.status} {e}") from e
            raise GitHubError(f"{verb} {path}: {e.status} {e}", status=e.status) from e
        observe_github(verb, path, str(status), started)
        with self._lock:
            self.calls += 1
        counter = _CALLS.get()
        if counter is not None:
            counter[0] += 1
        resp_headers = {k.lower(): v for k, v in raw_headers.items()}
        self._note_quota(resp_headers)
        data = json.loads(output) if output else None
        if status < 500:
            # GitHub answered: the write queue's outage backoff ends (leader/outbox.py).
            self.last_answer_s = time.time()
        if status >= 400:
            self._raise(verb, path, status, resp_headers, data)
        return status, resp_headers, data

    def _respect_quota(self, q: Quota) -> None:
        if q.remaining is None or q.reset_s is None:
            return
        reserve = self.settings.min_remaining_quota
        if q.remaining <= reserve and q.reset_s > time.time():
            raise RateLimited(
                f"GitHub quota low ({q.remaining} left); waiting for the reset",
                retry_at_s=q.reset_s,
            )

    def _note_quota(self, headers: dict[str, str]) -> None:
        if "x-ratelimit-remaining" not in headers:
            return
        quota = Quota(
            limit=int(headers.get("x-ratelimit-limit", 0)) or None,
            remaining=int(headers["x-ratelimit-remaining"]),
            reset_s=float(headers.get("x-ratelimit-reset", 0)) or None,
            seen_s=time.time(),
        )
        with self._lock:
            if headers.get("x-ratelimit-resource") == "graphql":
                self.graphql_quota = quota
            else:
                self.quota = quota

    def _raise(self, verb: str, path: str, status: int, headers: dict[str, str], data: Any) -> None:
        message = data.get("message", "") if isinstance(data, dict) else str(data or "")
        where = f"{verb} {path}: {status} {message}".strip()
        if status in (403, 429):
            if "retry-after" in headers:
                retry_s = float(headers["retry-after"])
                # A secondary limit: no write goes out before GitHub's Retry-After.
                self.writes.pause_until(time.monotonic() + retry_s)
                raise RateLimited(where, retry_at_s=time.time() + retry_s)
            if headers.get("x-ratelimit-remaining") == "0":
                reset = float(headers.get("x-ratelimit-reset", time.time() + 60))
                raise RateLimited(where, retry_at_s=reset)
            if "secondary rate limit" in message.lower():
                self.writes.pause_until(time.monotonic() + SECONDARY_LIMIT_DEFAULT_S)
                raise RateLimited(where, retry_at_s=time.time() + SECONDARY_LIMIT_DEFAULT_S)
        if status >= 500:
            raise GitHubUnavailable(where)
        if status in (404, 410):
            raise GitHubNotFound(where, status=status)
        if status == 422:
            raise GitHubRefused(where, code=_refusal_code(message, data))
        raise GitHubError(where, status=status)

    def repository(self, full_name: str) -> dict[str, Any]:
        """The repository; also pins the id every other call addresses it by."""
        # A 301 here loses nothing: this request has no query string.
        _, _, data = self._request("GET", f"/repos/{full_name}")
        current = str(data.get("full_name") or full_name)
        if current.lower() != full_name.lower():
            logger.warning(
                "repository %s now lives at %s (renamed or transferred); addressing it by id %s,"
                " update the configuration",
                full_name,
                current,
                data.get("id"),
            )
        if data.get("id") is not None:
            with self._lock:
                self._repo_paths[full_name] = f"/repositories/{data['id']}"
        return dict(data)

    def _repo(self, full_name: str) -> str:
        """The path prefix of a repository: by id once known (renames and transfers keep it)."""
        with self._lock:
            path = self._repo_paths.get(full_name)
        if path is None:
            self.repository(full_name)
            with self._lock:
                path = self._repo_paths.get(full_name, f"/repos/{full_name}")
        return path

    def _get_cached(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET with If-None-Match from an in-memory cache: unchanged answers cost no quota."""
        key = path + "?" + urlencode(sorted((params or {}).items()))
        with self._lock:
            cached = self._etags.get(key)
        status, headers, data = self._request(
            "GET", path, params=params, etag=cached[0] if cached else None
        )
        if status == 304 and cached is not None:
            return cached[1]
        if headers.get("etag"):
            with self._lock:
                self._etags[key] = (headers["etag"], data)
                self._etags.move_to_end(key)
                while len(self._etags) > ETAG_CACHE_SIZE:
                    self._etags.popitem(last=False)
        return data

    def _list(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        per_page = self.settings.per_page
        items: list[dict[str, Any]] = []
        page = 1
        while True:
            batch = self._get_cached(path, {**(params or {}), "per_page": per_page, "page": page})
            items.extend(batch or [])
            if not batch or len(batch) < per_page:
                return items
            page += 1

    def _graphql(
        self, document: str, variables: dict[str, Any], *, allow_missing: bool = False
    ) -> dict[str, Any]:
        """`data` of a GraphQL answer; an error raises, except with `allow_missing` a
        NOT_FOUND below the root (that field is null in `data`, the rest is there)."""
        base = self.settings.base_url.rstrip("/")
        # GitHub Enterprise serves REST under /api/v3 and GraphQL at /api/graphql.
        url = base[: -len("/v3")] + "/graphql" if base.endswith("/api/v3") else "/graphql"
        _, headers, data = self._request(
            "POST", url, body={"query": document, "variables": variables}
        )
        errors = (data or {}).get("errors") or []
        if allow_missing and (data or {}).get("data") is not None:
            errors = [
                e for e in errors if e.get("type") != "NOT_FOUND" or len(e.get("path") or []) < 2
            ]
        if errors:
            first = errors[0]
            where = f"POST /graphql: {first.get('type', '')} {first.get('message', '')}".strip()
            if first.get("type") == "NOT_FOUND":
                raise GitHubNotFound(where, status=404)
            if first.get("type") == "RATE_LIMITED":
                reset = float(headers.get("x-ratelimit-reset", time.time() + 60))
                raise RateLimited(where, retry_at_s=reset)
            raise GitHubError(where, status=422)
        return dict((data or {}).get("data") or {})

    def ping(self) -> Quota:
        """`GET /rate_limit`: reachable and authenticated (does not count against the quota)."""
        self._request("GET", "/rate_limit")
        return self.quota


def _refusal_code(message: str, data: Any) -> str:
    """GitHub's reason for a 422: `errors[].code` when it sends one, else read the message.

    Labels answer `{"errors": [{"code": "already_exists"}]}`; refs answer only a message
    ("Reference already exists", "... is not a valid ref name.").
    """
    errors = data.get("errors") if isinstance(data, dict) else None
    codes = sorted({str(e.get("code")) for e in errors or [] if isinstance(e, dict)} - {"None"})
    if codes:
        return codes[0] if len(codes) == 1 else ",".join(codes)
    return "already_exists" if "already exists" in message.lower() else "invalid"


def network_problem(e: requests.exceptions.RequestException) -> str:
    """What went wrong on the way to GitHub, without its address."""
    if isinstance(e, requests.exceptions.Timeout):
        return "GitHub did not answer in time"
    if isinstance(e, requests.exceptions.SSLError):
        return "the TLS handshake with GitHub failed"
    if isinstance(e, requests.exceptions.ConnectionError):
        text = str(e)
        if "Connection refused" in text:
            return "GitHub cannot be reached: connection refused"
        if "Name or service not known" in text or "NameResolutionError" in text:
            return "GitHub cannot be reached: its host name does not resolve"
        return "GitHub cannot be reached: connection failed"
    return f"the request to GitHub failed ({type(e).__name__})"


def _auth(settings: GitHubSettings) -> Auth.Auth | None:
    """A token, or a GitHub App installation (PyGithub mints and renews its tokens)."""
    key = settings.app_key()
    if settings.app_id is not None and settings.app_installation_id is not None and key:
        return Auth.AppAuth(settings.app_id, key).get_installation_auth(
            settings.app_installation_id
        )
    token = settings.resolved_token()
    return Auth.Token(token) if token else None
