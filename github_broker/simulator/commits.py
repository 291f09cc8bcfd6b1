"""The commit graph of a simulated repository: commits, ancestry, and a commit's REST shape.

A commit is a sha, its parents, a message, an author, a `seq` (the order commits were made in,
which is what "chronological" means here) and the files it changes (`files`: path -> content,
None for a deletion; most commits change none). A sha no record describes (a repository made
before commits were recorded) reads as a root commit with no files. A commit's tree is every
change of its ancestry applied in `seq` order (a merge commit's two sides included).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .model import Record, Repo, fake_sha
from .render import Ctx

logger = logging.getLogger(__name__)

ZERO_SHA = "0" * 40
#: Commits a compare answer lists when the client asks for no page (GitHub's limit).
COMPARE_COMMITS = 250
#: Shortest sha prefix a compare resolves, as `git rev-parse` would.
_ABBREV = re.compile(r"[0-9a-f]{7,40}")


def add(
    repo: Repo,
    parents: list[str],
    *,
    message: str,
    author: str,
    timestamp: str,
    seq: int,
    files: dict[str, str | None] | None = None,
) -> Record:
    sha = fake_sha(repo.full_name, "commit", seq)
    rec: Record = {
        "files": dict(files or {}),
        "sha": sha,
        "parents": list(parents),
        "message": message,
        "author": author,
        "timestamp": timestamp,
        "seq": seq,
        "tree": fake_sha(repo.full_name, "tree", seq),
    }
    repo.commits[sha] = rec
    return rec


def get(repo: Repo, sha: str) -> Record:
    found = repo.commits.get(sha)
    if found is not None:
        return found
    return {
        "sha": sha,
        "parents": [],
        "message": "Initial commit",
        "author": repo.owner,
        "timestamp": repo.created_at,
        "seq": 0,
        "tree": fake_sha(repo.full_name, "tree", sha),
    }


def known(repo: Repo, sha: str) -> bool:
    """A commit the repository has: recorded, a ref's tip, or a pull request's end."""
    if sha in repo.commits or sha in repo.refs.values():
        return True
    return any(
        rec["pull"] and sha in (rec["pull"]["head_sha"], rec["pull"]["base_sha"])
        for rec in repo.issues.values()
    )


def ancestry(repo: Repo, sha: str) -> set[str]:
    """`sha` and every commit it descends from."""
    seen: set[str] = set()
    todo = [sha]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(get(repo, current)["parents"])
    return seen


def is_ancestor(repo: Repo, older: str, newer: str) -> bool:
    return older in ancestry(repo, newer)


def only_in(repo: Repo, head: str, excluded: set[str]) -> list[Record]:
    """Commits reachable from `head` and not in `excluded`, oldest first."""
    return sorted(
        (get(repo, sha) for sha in ancestry(repo, head) - excluded),
        key=lambda c: (c["seq"], c["sha"]),
    )


def changes(repo: Repo, head: str, excluded: set[str]) -> dict[str, str | None]:
    """What the commits reachable from `head` and not in `excluded` do to files, applied
    oldest first: path -> content after them (None: deleted)."""
    out: dict[str, str | None] = {}
    for rec in only_in(repo, head, excluded):
        out.update(rec.get("files") or {})
    return out


def diff(repo: Repo, base: str | None, head: str) -> dict[str, str | None]:
    """What `head` changes since `base` (a merge base, None: nothing): path -> content
    (None: deleted), leaving out files it changed back as they were (added and deleted)."""
    below = ancestry(repo, base) if base else set()
    before = tree(repo, base) if base else {}
    return {p: c for p, c in changes(repo, head, below).items() if before.get(p) != c}


def tree(repo: Repo, sha: str) -> dict[str, str]:
    """The files at commit `sha`: path -> content."""
    return {p: c for p, c in changes(repo, sha, set()).items() if c is not None}


def merge_base(repo: Repo, a: str, b: str) -> str | None:
    common = ancestry(repo, a) & ancestry(repo, b)
    if not common:
        return None
    return max(common, key=lambda sha: (get(repo, sha)["seq"], sha))


def resolve(repo: Repo, name: str) -> str | None:
    """What a compare endpoint accepts: a branch, a tag, a full ref or a (short) sha."""
    for ref in (f"refs/heads/{name}", f"refs/tags/{name}", name, f"refs/{name}"):
        if ref.startswith("refs/") and ref in repo.refs:
            return repo.refs[ref]
    if not _ABBREV.fullmatch(name):
        return None
    if len(name) == 40:
        return name if known(repo, name) else None
    matches = {sha for sha in [*repo.commits, *repo.refs.values()] if sha.startswith(name)}
    return matches.pop() if len(matches) == 1 else None


def person(login: str, timestamp: str) -> dict[str, str]:
    """A git identity; GitHub's noreply address stands in for an email nobody gave."""
    return {"name": login, "email": f"{login}@users.noreply.github.com", "date": timestamp}


def rest_commit(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    """A commit as `GET /repos/{o}/{r}/commits/{sha}` and the compare endpoint show it."""
    api, html, sha = ctx.api(repo), ctx.html(repo), rec["sha"]
    who = person(rec["author"], rec["timestamp"])
    return {
        "url": f"{api}/commits/{sha}",
        "sha": sha,
        "node_id": f"C_{sha[:12]}",
        "html_url": f"{html}/commit/{sha}",
        "comments_url": f"{api}/commits/{sha}/comments",
        "commit": {
            "url": f"{api}/git/commits/{sha}",
            "author": who,
            "committer": who,
            "message": rec["message"],
            "comment_count": 0,
            "tree": {"sha": rec["tree"], "url": f"{api}/git/trees/{rec['tree']}"},
            "verification": {
                "verified": False,
                "reason": "unsigned",
                "signature": None,
                "payload": None,
                "verified_at": None,
            },
        },
        "author": ctx.user(rec["author"]),
        "committer": ctx.user(rec["author"]),
        "parents": [
            {"sha": p, "url": f"{api}/commits/{p}", "html_url": f"{html}/commit/{p}"}
            for p in rec["parents"]
        ],
    }
