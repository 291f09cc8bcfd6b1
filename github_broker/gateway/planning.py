"""GitHub's dependency graph read in bulk: many issues' blockers and sub-issues in one GraphQL
request (`repository { i12: issue(number: 12) { blockedBy ... subIssues ... } ... }`).

The issue objects of a listing already say whether an issue has any (its summaries), so only
those are asked for, `dependencies.batch` at a time: a thousand open issues with a hundred
links cost two requests, not a hundred. A blocker's state comes with it, read fresh (GraphQL
answers carry no ETag, so GitHub's stale `304` of a cached `blocked_by` list cannot happen).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from github_broker.errors import GitHubError, GitHubNotFound, RateLimited
from github_broker.gateway.transport import Transport

#: GitHub's limits: blockers of one issue, sub-issues of one parent.
MAX_BLOCKERS = 50
MAX_SUB_ISSUES = 100
_BLOCKERS = (
    f"blockedBy(first: {MAX_BLOCKERS}) {{ totalCount nodes {{ number state "
    "stateReason(enableDuplicate: true) repository { nameWithOwner } } }"
)
_SUBS = (
    f"subIssues(first: {MAX_SUB_ISSUES}) {{ totalCount nodes {{ number "
    "repository { nameWithOwner } } }"
)


@dataclass(frozen=True)
class Linked:
    """An issue at the other end of a link: `owner/name#n` and its state now (open,
    completed, not_planned, duplicate)."""

    ref: str
    state: str


@dataclass(frozen=True)
class IssueLinks:
    """One issue's links as GitHub shows them now."""

    number: int
    created_at: str
    #: Its blockers (None: not asked); `hidden` more that GitHub counts but did not show.
    blockers: list[Linked] | None = None
    hidden: int = 0
    #: Its sub-issues' refs in the parent's order (None: not asked).
    subs: list[str] | None = None


def state_of(node: dict[str, Any]) -> str:
    """An issue node's state as the graph keys name it."""
    if str(node.get("state", "")).upper() == "OPEN":
        return "open"
    reason = str(node.get("stateReason") or "COMPLETED").lower()
    return reason if reason in ("not_planned", "duplicate") else "completed"


class PlanningReads(Transport):
    """The bulk graph read (GraphQL)."""

    def issue_links(
        self, full_name: str, blockers: list[int], parents: list[int]
    ) -> dict[int, IssueLinks | None]:
        """The blockers of `blockers` and the sub-issues of `parents`, in one request; None
        for an issue GitHub no longer has. Raises GitHubError when the read fails."""
        wanted = sorted(set(blockers) | set(parents))
        if not wanted:
            return {}
        parts = [
            f"i{n}: issue(number: {n}) {{ number createdAt "
            f"{_BLOCKERS if n in blockers else ''} {_SUBS if n in parents else ''} }}"
            for n in wanted
        ]
        owner, _, name = full_name.partition("/")
        document = (
            "query($owner: String!, $name: String!) { repository(owner: $owner, name: $name) { "
            + " ".join(parts)
            + " } }"
        )
        repo = self._graph_query(document, {"owner": owner, "name": name})
        return {n: _links(repo.get(f"i{n}")) for n in wanted}

    def _graph_query(self, document: str, variables: dict[str, Any]) -> dict[str, Any]:
        """The `repository` object of a query whose aliases may fail one by one."""
        base = self.settings.base_url.rstrip("/")
        url = base[: -len("/v3")] + "/graphql" if base.endswith("/api/v3") else "/graphql"
        _, headers, data = self._request(
            "POST", url, body={"query": document, "variables": variables}
        )
        repo = ((data or {}).get("data") or {}).get("repository")
        if isinstance(repo, dict):
            return repo
        errors = (data or {}).get("errors") or [{}]
        first = errors[0]
        where = f"POST /graphql: {first.get('type', '')} {first.get('message', '')}".strip()
        if first.get("type") == "RATE_LIMITED":
            reset = float(headers.get("x-ratelimit-reset", time.time() + 60))
            raise RateLimited(where, retry_at_s=reset)
        if first.get("type") == "NOT_FOUND":
            raise GitHubNotFound(where, status=404)
        raise GitHubError(where, status=422)


def _links(node: dict[str, Any] | None) -> IssueLinks | None:
    if not isinstance(node, dict):
        return None
    blockers, hidden, subs = None, 0, None
    if isinstance(node.get("blockedBy"), dict):
        conn = node["blockedBy"]
        nodes = [b for b in conn.get("nodes") or [] if isinstance(b, dict)]
        blockers = [Linked(_ref(b), state_of(b)) for b in nodes]
        hidden = max(0, int(conn.get("totalCount") or 0) - len(blockers))
    if isinstance(node.get("subIssues"), dict):
        subs = [_ref(s) for s in node["subIssues"].get("nodes") or [] if isinstance(s, dict)]
    return IssueLinks(int(node["number"]), str(node.get("createdAt") or ""), blockers, hidden, subs)


def _ref(node: dict[str, Any]) -> str:
    return f"{node['repository']['nameWithOwner']}#{node['number']}"
