"""The `push` webhook payload: what GitHub tells hooks when a ref is created, moved or deleted.

Shapes follow @octokit/webhooks-schemas (`push$event`, `commit`, `committer`) and GitHub's
deliveries: `compare` links the two ends (a new ref: its first commit), `commits` lists what
the push brought (at most PUSH_COMMITS), and the repository carries the push event's own
fields (`created_at`/`pushed_at` as epoch seconds, `stargazers`, `master_branch`,
`organization`).
"""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Any

from . import commits
from .model import Record, Repo, parse_time
from .render import Ctx

logger = logging.getLogger(__name__)

#: Commits a push payload lists at most (GitHub's documented cap).
PUSH_COMMITS = 2048


def payload(ctx: Ctx, repo: Repo, push: Record) -> dict[str, Any]:
    """The event's own fields; the dispatcher adds `repository` and `sender`."""
    html = ctx.html(repo)
    before, after = push["before"], push["after"]
    if push["created"]:
        compare = f"{html}/commit/{after[:12]}"
    else:
        compare = f"{html}/compare/{before[:12]}...{after[:12]}"
    listed = [hook_commit(ctx, repo, c, c["distinct"]) for c in push["commits"][-PUSH_COMMITS:]]
    head = None
    if not push["deleted"]:
        tip = next((c for c in listed if c["id"] == after), None)
        head = tip or hook_commit(ctx, repo, commits.get(repo, after), False)
    return {
        "ref": push["ref"],
        "before": before,
        "after": after,
        "created": push["created"],
        "deleted": push["deleted"],
        "forced": push["forced"],
        "base_ref": push["base_ref"],
        "compare": compare,
        "commits": listed,
        "head_commit": head,
        "pusher": {"name": push["pusher"], "email": _email(push["pusher"])},
    }


def hook_commit(ctx: Ctx, repo: Repo, rec: Record, distinct: bool) -> dict[str, Any]:
    who = {"name": rec["author"], "email": _email(rec["author"]), "username": rec["author"]}
    return {
        "id": rec["sha"],
        "tree_id": rec["tree"],
        "distinct": distinct,
        "message": rec["message"],
        "timestamp": rec["timestamp"],
        "url": f"{ctx.html(repo)}/commit/{rec['sha']}",
        "author": who,
        "committer": who,
        # The simulator keeps no files.
        "added": [],
        "removed": [],
        "modified": [],
    }


def repository(shaped: dict[str, Any], repo: Repo) -> dict[str, Any]:
    """A webhook repository as push events carry it."""
    pushed = repo.pushed_at or repo.created_at
    return {
        **shaped,
        "created_at": _epoch(repo.created_at),
        "pushed_at": _epoch(pushed),
        "stargazers": shaped.get("stargazers_count", 0),
        "master_branch": repo.default_branch,
        # The simulator's repositories belong to organizations (render.repository's owner).
        "organization": repo.owner,
    }


def _email(login: str) -> str:
    return commits.person(login, "")["email"]


def _epoch(text: str) -> int:
    return int(parse_time(text).astimezone(UTC).timestamp())
