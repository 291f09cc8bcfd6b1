"""The GitHub gateway: every call to GitHub goes through here (PyGithub's requester).

Blocking by nature (PyGithub is synchronous): async callers run these methods in a worker
thread (`asyncio.to_thread`), never on the event loop.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import requests
from github import Auth, Github, GithubException

from github_broker.errors import (
    GitHubError,
    GitHubNotFound,
    GitHubRefused,
    GitHubUnavailable,
    RateLimited,
)
from github_broker.metrics import observe_github
from github_broker.models import Quota
from github_broker.settings import GitHubSettings

logger = logging.getLogger(__name__)

#: Pause when GitHub says "secondary rate limit" without a Retry-After header (GitHub's advice).
SECONDARY_LIMIT_DEFAULT_S = 60.0
#: Conditional-request cache entries kept per gateway (URL -> ETag and body).
ETAG_CACHE_SIZE = 4096


@dataclass
class Page:
    """One page of a list answer; `status` 304 means unchanged since `etag`."""

    status: int
    items: list[dict[str, Any]] = field(default_factory=list)
    etag: str | None = None


class GitHubGateway:
    """Thin, typed access to the REST endpoints the broker uses."""

    def __init__(self, settings: GitHubSettings) -> None:
        self.settings = settings
        self._github = Github(
            auth=_auth(settings),
            base_url=settings.base_url.rstrip("/"),
            timeout=int(max(1, settings.timeout_s)),
            per_page=settings.per_page,
            # Retries, pacing and rate-limit waits are ours; PyGithub's would block silently.
            retry=None,
            seconds_between_requests=None,
            seconds_between_writes=settings.seconds_between_writes or None,
        )
        self._requester = self._github.requester
        self._lock = threading.Lock()
        self.quota = Quota()
        self.calls = 0
        self._etags: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._login: str | None = None
        # Configured full name -> `/repositories/{id}`: a renamed or transferred repository
        # keeps its id, and PyGithub would follow GitHub's 301 dropping the query string.
        self._repo_paths: dict[str, str] = {}

    def close(self) -> None:
        self._github.close()

    # --- transport ----------------------------------------------------------------------

    def _request(
        self,
        verb: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
        etag: str | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        self._respect_quota(verb)
        headers = {"If-None-Match": etag} if etag else None
        started = time.perf_counter()
        try:
            status, raw_headers, output = self._requester.requestJson(
                verb, path, parameters=params, headers=headers, input=body
            )
        except requests.exceptions.RequestException as e:
            observe_github(verb, path, "error", started)
            raise GitHubUnavailable(f"{verb} {path}: {type(e).__name__}: {e}") from e
        except GithubException as e:
            # Raised by PyGithub itself, e.g. minting a GitHub App installation token.
            observe_github(verb, path, str(e.status), started)
            if e.status >= 500:
                raise GitHubUnavailable(f"{verb} {path}: {e.status} {e}") from e
            raise GitHubError(f"{verb} {path}: {e.status} {e}", status=e.status) from e
        observe_github(verb, path, str(status), started)
        with self._lock:
            self.calls += 1
        resp_headers = {k.lower(): v for k, v in raw_headers.items()}
        self._note_quota(resp_headers)
        data = json.loads(output) if output else None
        if status >= 400:
            self._raise(verb, path, status, resp_headers, data)
        return status, resp_headers, data

    def _respect_quota(self, verb: str) -> None:
        q = self.quota
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
        with self._lock:
            self.quota = Quota(
                limit=int(headers.get("x-ratelimit-limit", 0)) or None,
                remaining=int(headers["x-ratelimit-remaining"]),
                reset_s=float(headers.get("x-ratelimit-reset", 0)) or None,
                seen_s=time.time(),
            )

    def _raise(self, verb: str, path: str, status: int, headers: dict[str, str], data: Any) -> None:
        message = data.get("message", "") if isinstance(data, dict) else str(data or "")
        where = f"{verb} {path}: {status} {message}".strip()
        if status in (403, 429):
            if "retry-after" in headers:
                retry_at = time.time() + float(headers["retry-after"])
                raise RateLimited(where, retry_at_s=retry_at)
            if headers.get("x-ratelimit-remaining") == "0":
                reset = float(headers.get("x-ratelimit-reset", time.time() + 60))
                raise RateLimited(where, retry_at_s=reset)
            if "secondary rate limit" in message.lower():
                raise RateLimited(where, retry_at_s=time.time() + SECONDARY_LIMIT_DEFAULT_S)
        if status >= 500:
            raise GitHubUnavailable(where)
        if status in (404, 410):
            raise GitHubNotFound(where, status=status)
        if status == 422:
            raise GitHubRefused(where, code=_refusal_code(message, data))
        raise GitHubError(where, status=status)

    # --- reads --------------------------------------------------------------------------

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

    def issues_page(
        self, full_name: str, params: dict[str, Any], *, page: int, etag: str | None = None
    ) -> Page:
        """One page of `GET /repos/{repo}/issues` (pull requests included, as GitHub does)."""
        query = {**params, "per_page": self.settings.per_page, "page": page}
        status, headers, data = self._request(
            "GET", f"{self._repo(full_name)}/issues", params=query, etag=etag
        )
        if status == 304:
            return Page(status=304, etag=etag)
        return Page(
            status=status,
            items=list(data or []),
            etag=headers.get("etag"),
        )

    def issue(self, full_name: str, number: int) -> dict[str, Any] | None:
        """One issue (or PR) as GitHub shows it now; None when deleted or transferred."""
        try:
            _, _, data = self._request("GET", f"{self._repo(full_name)}/issues/{number}")
        except GitHubNotFound:
            return None
        return dict(data)

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

    def open_pulls(self, full_name: str) -> list[dict[str, Any]]:
        return self._list(f"{self._repo(full_name)}/pulls", {"state": "open"})

    def pull_feedback(
        self, full_name: str, pr: int
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """(reviews, inline review comments, conversation comments) of a pull request."""
        return (
            self._list(f"{self._repo(full_name)}/pulls/{pr}/reviews"),
            self._list(f"{self._repo(full_name)}/pulls/{pr}/comments"),
            self._list(f"{self._repo(full_name)}/issues/{pr}/comments"),
        )

    def label_events(self, full_name: str, number: int) -> list[dict[str, Any]]:
        """The issue's `labeled` / `unlabeled` events, oldest first (who changed which label)."""
        return [
            e
            for e in self._list(f"/repos/{full_name}/issues/{number}/events")
            if e.get("event") in ("labeled", "unlabeled")
        ]

    def login(self) -> str:
        """The login the broker acts as on GitHub (its own comments are not feedback)."""
        if self.settings.app_id is not None:
            return ""  # an App acts as a bot, and bots' comments are never feedback anyway
        if self._login is None:
            _, _, data = self._request("GET", "/user")
            self._login = str((data or {}).get("login", ""))
        return self._login

    # --- writes (all idempotent) --------------------------------------------------------

    def add_labels(self, full_name: str, number: int, labels: list[str]) -> None:
        if labels:
            self._request(
                "POST", f"{self._repo(full_name)}/issues/{number}/labels", body={"labels": labels}
            )

    def remove_label(self, full_name: str, number: int, label: str) -> None:
        # Already absent (404) means the wish is fulfilled.
        with contextlib.suppress(GitHubNotFound):
            self._request(
                "DELETE", f"{self._repo(full_name)}/issues/{number}/labels/{quote(label, safe='')}"
            )

    def create_branch(self, full_name: str, branch: str, base: str) -> bool:
        """Create `branch` at the tip of `base`; False when it already exists."""
        # Conditional: while the base branch does not move this is a free 304.
        ref = self._get_cached(f"{self._repo(full_name)}/git/ref/heads/{quote(base, safe='/')}")
        sha = ref["object"]["sha"]
        try:
            self._request(
                "POST",
                f"{self._repo(full_name)}/git/refs",
                body={"ref": f"refs/heads/{branch}", "sha": sha},
            )
        except GitHubRefused as e:
            if e.code == "already_exists":
                return False  # an earlier attempt or a person made it
            raise
        return True

    def label_names(self, full_name: str) -> list[str]:
        """Every label of a repository (`GET /repos/{repo}/labels`, all pages)."""
        names: list[str] = []
        page = 1
        while True:
            _, _, data = self._request(
                "GET",
                f"/repos/{full_name}/labels",
                params={"per_page": self.settings.per_page, "page": page},
            )
            names += [str(label["name"]) for label in data or []]
            if len(data or []) < self.settings.per_page:
                return names
            page += 1

    def ensure_label(self, full_name: str, name: str, color: str, description: str) -> bool:
        """Create a repository label; False when it exists already."""
        try:
            self._request(
                "POST",
                f"{self._repo(full_name)}/labels",
                body={"name": name, "color": color, "description": description},
            )
        except GitHubRefused as e:
            if e.code == "already_exists":
                return False
            raise
        return True

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


def _auth(settings: GitHubSettings) -> Auth.Auth | None:
    """A token, or a GitHub App installation (PyGithub mints and renews its tokens)."""
    key = settings.app_key()
    if settings.app_id is not None and settings.app_installation_id is not None and key:
        return Auth.AppAuth(settings.app_id, key).get_installation_auth(
            settings.app_installation_id
        )
    token = settings.resolved_token()
    return Auth.Token(token) if token else None
