"""Reactions on issue comments, and reading one issue comment by id.

A reaction lives on its comment's record (`comment["reactions"]`); the comment's `reactions`
summary in REST answers and webhook payloads counts them (render.reaction_rollup). Reactions
change no issue: GitHub bumps neither the issue's nor the comment's `updated_at` for one.
"""

from __future__ import annotations

import logging
from typing import Any

from . import render
from .issues import IssueStore
from .messages import ApiError, NotFound
from .model import Record, Repo

logger = logging.getLogger(__name__)

#: The reaction contents, in the order GitHub's request schema lists them.
CONTENTS = ("+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes")
_ALLOWED = ", ".join(f'"{c}"' for c in CONTENTS)


def check_content(content: Any) -> str:
    """GitHub validates the body against its schema before anything else: 422 otherwise."""
    if content is None:
        raise ApiError(422, 'Invalid request.\n\n"content" wasn\'t supplied.')
    if content not in CONTENTS:
        shown = f'"{content}"' if isinstance(content, str) else repr(content)
        where = "For 'properties/content'"
        raise ApiError(422, f"Invalid request.\n\n{where}, {shown} is not one of [{_ALLOWED}].")
    return str(content)


class ReactionStore(IssueStore):
    """Reactions per issue comment; the conventions are IssueStore's."""

    def get_issue_comment(
        self, owner: str, repo: str, comment_id: int, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            number, comment = _comment(r, comment_id)
            return render.issue_comment(self.ctx(base_url), r, number, comment)

    def add_reaction(
        self,
        owner: str,
        repo: str,
        comment_id: int,
        *,
        user: str,
        content: Any,
        base_url: str | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """The reaction, and False when `user` had already reacted so (GitHub's 200)."""
        wanted = check_content(content)
        with self.lock:
            r = self.repo(owner, repo)
            _, comment = _comment(r, comment_id)
            ctx = self.ctx(base_url)
            reactions: list[Record] = comment.setdefault("reactions", [])
            for rec in reactions:
                if rec["user"] == user and rec["content"] == wanted:
                    return render.reaction(ctx, rec), False
            rec = {
                "id": self.next_id(),
                "user": self.user(user),
                "content": wanted,
                "created_at": self.now(),
            }
            reactions.append(rec)
            return render.reaction(ctx, rec), True

    def list_reactions(
        self,
        owner: str,
        repo: str,
        comment_id: int,
        *,
        content: str | None = None,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            _, comment = _comment(r, comment_id)
            ctx = self.ctx(base_url)
            return [
                render.reaction(ctx, rec)
                for rec in comment.get("reactions", [])
                if content is None or rec["content"] == content
            ]


def _comment(repo: Repo, comment_id: int) -> tuple[int, Record]:
    for number, comments in repo.issue_comments.items():
        for comment in comments:
            if comment["id"] == comment_id:
                return number, comment
    raise NotFound()
