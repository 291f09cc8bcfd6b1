"""What the broker reads from GitHub: issues, pull requests and their feedback, branches,
permissions, comments, labels, its own login."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from github_broker.errors import GitHubNotFound
from github_broker.gateway.people import role_of
from github_broker.gateway.transport import Transport
from github_broker.settings import GitHubSettings


@dataclass
class Page:
    """One page of a list answer; `status` 304 means unchanged since `etag`."""

    status: int
    items: list[dict[str, Any]] = field(default_factory=list)
    etag: str | None = None


class Reads(Transport):
    """The REST reads; lists and single objects go through the conditional cache."""

    def __init__(self, settings: GitHubSettings) -> None:
        super().__init__(settings)
        self._login: str | None = None

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

    def pull(self, full_name: str, number: int) -> dict[str, Any] | None:
        """One pull request (conditional GET); None when it does not exist."""
        try:
            return dict(self._get_cached(f"/repos/{full_name}/pulls/{number}"))
        except GitHubNotFound:
            return None

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

    def branch_head(self, full_name: str, branch: str) -> str | None:
        """The sha at the tip of `branch` (a conditional GET: a free 304 while it does not
        move); None while the branch does not exist."""
        try:
            ref = self._get_cached(
                f"{self._repo(full_name)}/git/ref/heads/{quote(branch, safe='/')}"
            )
        except GitHubNotFound:
            return None
        return str(ref["object"]["sha"]) if isinstance(ref, dict) else None

    def commits_ahead(self, full_name: str, base: str, head: str) -> int | None:
        """Commits on `head` that `base` lacks (`GET .../compare/base...head`); None when a
        branch does not exist."""
        basehead = f"{quote(base, safe='/')}...{quote(head, safe='/')}"
        try:
            data = self._get_cached(f"{self._repo(full_name)}/compare/{basehead}")
        except GitHubNotFound:
            return None
        return int(data.get("ahead_by", 0)) if isinstance(data, dict) else None

    def label_events(self, full_name: str, number: int) -> list[dict[str, Any]]:
        """The issue's `labeled` / `unlabeled` events, oldest first (who changed which label)."""
        return [
            e
            for e in self._list(f"/repos/{full_name}/issues/{number}/events")
            if e.get("event") in ("labeled", "unlabeled")
        ]

    def permission(self, full_name: str, login: str) -> str:
        """`login`'s permission on the repository as GitHub's legacy base roles report it:
        admin, write (maintain included), read (triage included) or none; `none` for an
        account that does not exist. Conditional: asking again while it is unchanged is a
        free 304."""
        data = self._permission_of(full_name, login)
        return str((data or {}).get("permission") or "none")

    def role(self, full_name: str, login: str) -> str:
        """`login`'s role on the repository: admin, maintain, write, triage, read or none,
        from the `permissions` flags GitHub lists (the legacy `permission` reads maintain as
        write). Conditional, as `permission`."""
        data = self._permission_of(full_name, login) or {}
        flags = (data.get("user") or {}).get("permissions")
        if isinstance(flags, dict):
            return role_of(flags) if any(flags.values()) else "none"
        return str(data.get("role_name") or data.get("permission") or "none")

    def _permission_of(self, full_name: str, login: str) -> Any:
        try:
            return self._get_cached(
                f"{self._repo(full_name)}/collaborators/{quote(login, safe='')}/permission"
            )
        except GitHubNotFound:
            return None

    def comments_page(
        self, full_name: str, since: str, *, page: int, etag: str | None = None
    ) -> Page:
        """One page of the repository's issue and pull request comments updated at or after
        `since`, least recently updated first (`GET /repos/{repo}/issues/comments`)."""
        query = {
            "since": since,
            "sort": "updated",
            "direction": "asc",
            "per_page": self.settings.per_page,
            "page": page,
        }
        status, headers, data = self._request(
            "GET", f"{self._repo(full_name)}/issues/comments", params=query, etag=etag
        )
        if status == 304:
            return Page(status=304, etag=etag)
        return Page(status=status, items=list(data or []), etag=headers.get("etag"))

    def login(self) -> str:
        """The login the broker acts as on GitHub (its own comments are not feedback)."""
        if self.settings.app_id is not None:
            return ""  # an App acts as a bot, and bots' comments are never feedback anyway
        if self._login is None:
            _, _, data = self._request("GET", "/user")
            self._login = str((data or {}).get("login", ""))
        return self._login

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
