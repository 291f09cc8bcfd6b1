"""Issue relationships of the simulated GitHub: dependencies (blocked by / blocking) and
sub-issues with their order, across the repositories of one simulator.

Links are kept on `Node`s hung off the issue records (`rec["links"]`), so rendering an issue
reads its summaries (`issue_dependencies_summary`, `sub_issues_summary`, `parent_issue_url`)
from its neighbours' records as they are now. As on GitHub, the APIs name the other issue by
its id (not its number), adding or removing a link leaves both issues' `updated_at` as it was
(a `since` listing does not return them), and every change is delivered as an
`issue_dependencies` or `sub_issues` webhook to the repositories of both ends. An issue is
blocked by at most 50 issues and blocks at most 50; a parent has at most 100 sub-issues, all
in repositories of its owner. Cycles of dependencies are accepted (GitHub does not refuse
them). Issues in a private repository that names collaborators are hidden from anyone else
in the lists (`totalCount` still counts them), which is how a blocker the broker cannot read
is simulated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import render
from .issues import IssueStore
from .messages import ApiError, NotFound
from .model import Record, Repo

logger = logging.getLogger(__name__)

#: GitHub's limits: blockers of one issue (and issues it blocks), sub-issues of one parent.
MAX_BLOCKERS = 50
MAX_SUB_ISSUES = 100


@dataclass(eq=False)
class Node:
    """One issue's links; its neighbours are Nodes of other issues (any repository)."""

    repo: Repo
    rec: Record
    blockers: list[Node] = field(default_factory=list)
    blocking: list[Node] = field(default_factory=list)
    subs: list[Node] = field(default_factory=list)
    parent: Node | None = None

    @property
    def alive(self) -> bool:
        return self.repo.issues.get(self.rec["number"]) is self.rec

    @property
    def ref(self) -> str:
        return f"{self.repo.full_name}#{self.rec['number']}"


def node_of(repo: Repo, rec: Record) -> Node:
    node = rec.get("links")
    if node is None:
        node = rec["links"] = Node(repo, rec)
    return node


def _refused(message: str, field_name: str = "issue_id") -> ApiError:
    return ApiError(
        422,
        "Validation Failed",
        errors=[{"resource": "Issue", "code": "custom", "field": field_name, "message": message}],
    )


class GraphStore(IssueStore):
    """Dependencies and sub-issues; the conventions are IssueStore's (under its lock)."""

    #: Set by the webhook dispatcher: called with (state, repo, event, action, fields).
    graph_observer: Callable[..., None] | None = None

    # ----- lookups ---------------------------------------------------------------------------

    def issue_by_id(self, issue_id: Any) -> tuple[Repo, Record]:
        """The issue (not a pull request) with this database id, in any repository."""
        if isinstance(issue_id, bool) or not isinstance(issue_id, int):
            raise _refused("issue_id must be an integer")
        for repo in self.repo_records():
            for rec in repo.issues.values():
                if rec["id"] == issue_id and rec["pull"] is None:
                    return repo, rec
        raise NotFound()

    def issue_id(self, owner: str, repo: str, number: int) -> int:
        """An issue's database id (what the relationship APIs take)."""
        with self.lock:
            return int(self.issue_record(self.repo(owner, repo), number)["id"])

    def _issue_node(self, owner: str, repo: str, number: int) -> Node:
        r = self.repo(owner, repo)
        rec = self.issue_record(r, number)
        if rec["pull"] is not None:
            raise NotFound()
        return node_of(r, rec)

    @staticmethod
    def visible(node: Node, viewer: str | None) -> bool:
        """Whether `viewer` may read the issue: a private repository that names collaborators
        shows itself to them and its owner alone."""
        repo = node.repo
        if not repo.private or not repo.collaborators or viewer is None:
            return True
        return viewer.lower() in repo.collaborators or viewer.lower() == repo.owner.lower()

    def rendered(self, nodes: list[Node], viewer: str | None, base_url: str | None) -> list[Any]:
        ctx = self.ctx(base_url)
        return [
            render.issue(ctx, n.repo, n.rec)
            for n in nodes
            if n.alive and self.visible(n, viewer)
        ]

    # ----- dependencies ----------------------------------------------------------------------

    def add_blocked_by(
        self, owner: str, repo: str, number: int, blocker_id: Any, *, actor: str = "maintainer"
    ) -> dict[str, Any]:
        """Issue `number` is blocked by the issue with id `blocker_id`; returns the blocker."""
        with self.lock:
            node = self._issue_node(owner, repo, number)
            try:
                brepo, brec = self.issue_by_id(blocker_id)
            except NotFound:
                raise _refused("the blocking issue does not exist") from None
            blocker = node_of(brepo, brec)
            if blocker is node:
                raise _refused("an issue cannot be blocked by itself")
            if blocker in node.blockers:
                raise _refused("the issue is already blocked by this issue")
            if len(node.blockers) >= MAX_BLOCKERS or len(blocker.blocking) >= MAX_BLOCKERS:
                raise _refused(f"an issue can have at most {MAX_BLOCKERS} dependencies each way")
            node.blockers.append(blocker)
            blocker.blocking.append(node)
            self._dependency_events(node, blocker, "added", actor)
            return render.issue(self.ctx(None), brepo, brec)

    def remove_blocked_by(
        self, owner: str, repo: str, number: int, blocker_id: Any, *, actor: str = "maintainer"
    ) -> dict[str, Any]:
        with self.lock:
            node = self._issue_node(owner, repo, number)
            blocker = next((b for b in node.blockers if b.rec["id"] == blocker_id), None)
            if blocker is None:
                raise NotFound()
            node.blockers.remove(blocker)
            blocker.blocking.remove(node)
            self._dependency_events(node, blocker, "removed", actor)
            return render.issue(self.ctx(None), blocker.repo, blocker.rec)

    def blocked_by(
        self, owner: str, repo: str, number: int, *, viewer: str | None = None,
        base_url: str | None = None,
    ) -> tuple[list[Any], str]:
        """The issues `number` is blocked by, and what the list's ETag is made of on GitHub:
        the blocked issue and its links, not the blockers' own state (a blocker that closed
        leaves the ETag as it was, so a conditional read answers 304 with stale states)."""
        with self.lock:
            node = self._issue_node(owner, repo, number)
            rec = node.rec
            basis = f"{rec['id']}:{rec['updated_at']}:{[b.rec['id'] for b in node.blockers]}"
            return self.rendered(node.blockers, viewer, base_url), basis

    def blocking(
        self, owner: str, repo: str, number: int, *, viewer: str | None = None,
        base_url: str | None = None,
    ) -> list[Any]:
        with self.lock:
            node = self._issue_node(owner, repo, number)
            return self.rendered(node.blocking, viewer, base_url)

    def block(self, owner: str, repo: str, number: int, by: tuple[str, str, int]) -> None:
        """Tests: `number` is blocked by issue `by` = (owner, repo, number)."""
        self.add_blocked_by(owner, repo, number, self.issue_id(*by))

    def unblock(self, owner: str, repo: str, number: int, by: tuple[str, str, int]) -> None:
        self.remove_blocked_by(owner, repo, number, self.issue_id(*by))

    def _dependency_events(self, blocked: Node, blocker: Node, what: str, actor: str) -> None:
        self._link_events(
            "issue_dependencies",
            (blocked, blocker),
            ("blocked_issue", "blocking_issue"),
            (f"blocked_by_{what}", f"blocking_{what}"),
            actor,
        )

    def _link_events(
        self,
        event: str,
        ends: tuple[Node, Node],
        names: tuple[str, str],
        actions: tuple[str, str],
        actor: str,
    ) -> None:
        """A link's two deliveries, one to each end's repository, naming the other's."""
        ctx = self.ctx(None)
        issues: dict[str, Any] = {}
        for node, name in zip(ends, names, strict=True):
            issues[f"{name}_id"] = node.rec["id"]
            issues[name] = render.issue(ctx, node.repo, node.rec)
        for i in (0, 1):
            other = ends[1 - i]
            fields = {**issues, f"{names[1 - i]}_repo": render.repository(ctx, other.repo)}
            self._graph_event(ends[i].repo, event, actions[i], fields, actor)

    def _graph_event(
        self, repo: Repo, event: str, action: str, fields: dict[str, Any], actor: str
    ) -> None:
        if self.graph_observer is not None:
            self.graph_observer(self, repo, event, action, fields, self.user(actor))
