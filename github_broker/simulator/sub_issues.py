"""Sub-issues of the simulated GitHub: a parent's ordered list, each sub-issue's one parent.

As on GitHub: the sub-issue is named by its id, must belong to the parent's owner, has one
parent at most (`replace_parent` moves it), a parent holds at most 100; the maintainer-set
order is changed with `after_id` or `before_id`; neither issue's `updated_at` moves, and each
change is delivered as a `sub_issues` webhook (`sub_issue_added` ... to the parent's
repository, `parent_issue_added` ... to the sub-issue's).
"""

from __future__ import annotations

import logging
from typing import Any

from . import render
from .graph import MAX_SUB_ISSUES, GraphStore, Node, _refused, node_of
from .messages import ApiError, NotFound

logger = logging.getLogger(__name__)


class SubIssueStore(GraphStore):
    """Parents and their ordered sub-issues (links on graph.Node)."""

    def add_sub_issue(
        self,
        owner: str,
        repo: str,
        number: int,
        sub_issue_id: Any,
        *,
        replace_parent: bool = False,
        actor: str = "maintainer",
    ) -> dict[str, Any]:
        """Returns the parent, as GitHub does."""
        with self.lock:
            parent = self._issue_node(owner, repo, number)
            try:
                srepo, srec = self.issue_by_id(sub_issue_id)
            except NotFound:
                raise _refused("the sub-issue does not exist", "sub_issue_id") from None
            sub = node_of(srepo, srec)
            self._check_sub(parent, sub, replace_parent)
            if sub.parent is not None:
                self._detach(sub.parent, sub, actor)
            parent.subs.append(sub)
            sub.parent = parent
            self._sub_events(parent, sub, "added", actor)
            return render.issue(self.ctx(None), parent.repo, parent.rec)

    def _check_sub(self, parent: Node, sub: Node, replace_parent: bool) -> None:
        if sub is parent:
            raise _refused("an issue cannot be its own sub-issue", "sub_issue_id")
        if sub.repo.owner.lower() != parent.repo.owner.lower():
            raise _refused("the sub-issue must belong to the parent's owner", "sub_issue_id")
        if sub.parent is parent:
            raise _refused("the issue is already a sub-issue of this parent", "sub_issue_id")
        if sub.parent is not None and not replace_parent:
            raise _refused("the issue already has a parent", "sub_issue_id")
        up: Node | None = parent
        while up is not None:
            if up is sub:
                raise _refused("a parent cannot be a sub-issue of its own sub-issue")
            up = up.parent
        if len(parent.subs) >= MAX_SUB_ISSUES:
            raise _refused(f"a parent can have at most {MAX_SUB_ISSUES} sub-issues")

    def remove_sub_issue(
        self, owner: str, repo: str, number: int, sub_issue_id: Any, *, actor: str = "maintainer"
    ) -> dict[str, Any]:
        with self.lock:
            parent = self._issue_node(owner, repo, number)
            sub = next((s for s in parent.subs if s.rec["id"] == sub_issue_id), None)
            if sub is None:
                raise NotFound()
            self._detach(parent, sub, actor)
            return render.issue(self.ctx(None), parent.repo, parent.rec)

    def _detach(self, parent: Node, sub: Node, actor: str) -> None:
        parent.subs.remove(sub)
        sub.parent = None
        self._sub_events(parent, sub, "removed", actor)

    def reprioritize_sub_issue(
        self,
        owner: str,
        repo: str,
        number: int,
        sub_issue_id: Any,
        *,
        after_id: Any = None,
        before_id: Any = None,
    ) -> dict[str, Any]:
        """Move a sub-issue right after `after_id` or right before `before_id`."""
        with self.lock:
            parent = self._issue_node(owner, repo, number)
            if (after_id is None) == (before_id is None):
                # This endpoint answers GitHub's simple validation shape: messages alone.
                raise ApiError(422, "Validation Failed",
                               errors=["Either after_id or before_id must be given"])
            by_id = {s.rec["id"]: s for s in parent.subs}
            sub, anchor = by_id.get(sub_issue_id), by_id.get(after_id or before_id)
            if sub is None or anchor is None:
                raise NotFound()
            if sub is not anchor:
                parent.subs.remove(sub)
                at = parent.subs.index(anchor) + (1 if after_id is not None else 0)
                parent.subs.insert(at, sub)
            return render.issue(self.ctx(None), parent.repo, parent.rec)

    def sub_issues(
        self, owner: str, repo: str, number: int, *, viewer: str | None = None,
        base_url: str | None = None,
    ) -> list[Any]:
        """In the parent's order."""
        with self.lock:
            parent = self._issue_node(owner, repo, number)
            return self.rendered(parent.subs, viewer, base_url)

    def parent_issue(
        self, owner: str, repo: str, number: int, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            node = self._issue_node(owner, repo, number)
            if node.parent is None or not node.parent.alive:
                raise NotFound()
            return render.issue(self.ctx(base_url), node.parent.repo, node.parent.rec)

    def nest(self, owner: str, repo: str, number: int, sub: tuple[str, str, int]) -> None:
        """Tests: issue `sub` = (owner, repo, number) becomes the last sub-issue of `number`."""
        self.add_sub_issue(owner, repo, number, self.issue_id(*sub))

    def _sub_events(self, parent: Node, sub: Node, what: str, actor: str) -> None:
        self._link_events(
            "sub_issues",
            (parent, sub),
            ("parent_issue", "sub_issue"),
            (f"sub_issue_{what}", f"parent_issue_{what}"),
            actor,
        )
