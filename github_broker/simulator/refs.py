"""Git refs, branches, pushes and comparisons of the simulated GitHub (RefStore).

Every ref that is created, moved or deleted goes through `RefStore._move`, which keeps open
pull requests' heads in step and tells the webhook dispatcher (`push_observer`) what GitHub
would put in its `push` event.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from . import commits, render
from .commits import ZERO_SHA
from .issues import IssueStore, LabelSpec
from .messages import ApiError, NotFound
from .model import Record, Repo

logger = logging.getLogger(__name__)

_BAD_REF = re.compile(r"[\x00-\x20~^:?*\[\\\x7f]|\.\.|@\{|//|/\.|\.lock(/|$)|[/.]$")
#: Who moves refs when a Python caller (a test acting as a person) does not say.
DEFAULT_PUSHER = "octocat"


def valid_ref_name(ref: str) -> bool:
    """git check-ref-format's rules, which GitHub applies to refs it creates."""
    return not _BAD_REF.search(ref) and ref != "@"


def _full(ref: str) -> str:
    return ref if ref.startswith("refs/") else f"refs/{ref}"


class RefStore(IssueStore):
    """Refs and commits; the conventions are IssueStore's (lock, GitHub-shaped answers)."""

    #: Called under the lock with (state, repo, push) after a ref is created, moved or
    #: deleted; the webhook dispatcher (simulator/webhooks.py) sets it.
    push_observer: Callable[..., None] | None = None

    def add_repo(
        self,
        owner: str,
        name: str,
        *,
        default_branch: str = "main",
        private: bool = False,
        description: str = "",
        labels: Iterable[LabelSpec] = (),
        branches: Iterable[str] = (),
    ) -> dict[str, Any]:
        """A repository whose other branches each hold one commit on the default branch."""
        with self.lock:
            answer = super().add_repo(
                owner,
                name,
                default_branch=default_branch,
                private=private,
                description=description,
                labels=labels,
            )
            r = self.repo(owner, name)
            root = r.refs[f"refs/heads/{default_branch}"]
            for branch in branches:
                start = self.commit(r, [root], message=f"Start {branch}", author=r.owner)
                r.refs[f"refs/heads/{branch}"] = start["sha"]
            return answer

    # ----- reading ---------------------------------------------------------------------------

    def branches(self, owner: str, repo: str) -> dict[str, str]:
        with self.lock:
            prefix = "refs/heads/"
            return {
                ref[len(prefix) :]: sha
                for ref, sha in self.repo(owner, repo).refs.items()
                if ref.startswith(prefix)
            }

    def get_ref(
        self, owner: str, repo: str, ref: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            full = _full(ref)
            if full not in r.refs:
                raise NotFound()
            return render.git_ref(self.ctx(base_url), r, full, r.refs[full])

    def list_refs(
        self, owner: str, repo: str, prefix: str = "", *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            full = _full(prefix)
            ctx = self.ctx(base_url)
            return [
                render.git_ref(ctx, r, ref, sha)
                for ref, sha in sorted(r.refs.items())
                if ref.startswith(full)
            ]

    def get_branch(
        self, owner: str, repo: str, branch: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            sha = r.refs.get(f"refs/heads/{branch}")
            if sha is None:
                raise NotFound("Branch not found")
            return render.branch(self.ctx(base_url), r, branch, sha)

    def list_branches(
        self, owner: str, repo: str, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        ctx = self.ctx(base_url)
        with self.lock:
            r = self.repo(owner, repo)
            return [
                render.branch(ctx, r, name, sha)
                for name, sha in sorted(self.branches(owner, repo).items())
            ]

    def compare(
        self, owner: str, repo: str, basehead: str, *, base_url: str | None = None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """`GET /compare/{base}...{head}`: the comparison and every commit `head` is ahead
        by, oldest first (the caller pages them). 404 for an unknown ref, as on GitHub."""
        with self.lock:
            r = self.repo(owner, repo)
            base_name, sep, head_name = basehead.partition("...")
            base = self._compare_end(r, base_name) if sep else None
            head = self._compare_end(r, head_name) if sep else None
            if base is None or head is None:
                raise NotFound()
            shared = commits.merge_base(r, base, head)
            if shared is None:
                raise NotFound(f"No common ancestor between {base_name} and {head_name}.")
            below_base = commits.ancestry(r, base)
            ahead = commits.only_in(r, head, below_base)
            behind = len(below_base - commits.ancestry(r, head))
            status = {
                (False, False): "identical",
                (True, False): "ahead",
                (False, True): "behind",
                (True, True): "diverged",
            }[(bool(ahead), bool(behind))]
            ctx = self.ctx(base_url)
            api, html = ctx.api(r), ctx.html(r)
            summary = {
                "url": f"{api}/compare/{basehead}",
                "html_url": f"{html}/compare/{basehead}",
                "permalink_url": f"{html}/compare/{r.owner}:{base}...{r.owner}:{head}",
                "diff_url": f"{html}/compare/{basehead}.diff",
                "patch_url": f"{html}/compare/{basehead}.patch",
                "base_commit": commits.rest_commit(ctx, r, commits.get(r, base)),
                "merge_base_commit": commits.rest_commit(ctx, r, commits.get(r, shared)),
                "status": status,
                "ahead_by": len(ahead),
                "behind_by": behind,
                "total_commits": len(ahead),
                "commits": [],
                "files": [],
            }
            return summary, [commits.rest_commit(ctx, r, c) for c in ahead]

    @staticmethod
    def _compare_end(repo: Repo, name: str) -> str | None:
        """`branch` or `owner:branch` (the same repository's network is this repository)."""
        owner, sep, rest = name.rpartition(":")
        if sep and owner.lower() != repo.owner.lower():
            return None
        return commits.resolve(repo, rest if sep else name)

    # ----- writing ---------------------------------------------------------------------------

    def create_ref(
        self,
        owner: str,
        repo: str,
        ref: str,
        sha: str | None = None,
        *,
        pusher: str = DEFAULT_PUSHER,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """Create ``refs/heads/x`` or any ``refs/...``; ``sha`` defaults to the default branch."""
        with self.lock:
            r = self.repo(owner, repo)
            self._check_new_ref(r, ref)
            if sha is not None and not (_is_sha(sha) and commits.known(r, sha)):
                raise ApiError(422, "Object does not exist")
            target = sha or r.refs[f"refs/heads/{r.default_branch}"]
            self._move(r, ref, target, self.user(pusher))
            return render.git_ref(self.ctx(base_url), r, ref, target)

    def update_ref(
        self,
        owner: str,
        repo: str,
        ref: str,
        sha: str,
        *,
        force: bool = False,
        pusher: str = DEFAULT_PUSHER,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """Move a ref; GitHub refuses a move that loses commits unless ``force`` is set."""
        with self.lock:
            r = self.repo(owner, repo)
            full = _full(ref)
            if full not in r.refs:
                raise ApiError(422, "Reference does not exist")
            if not (_is_sha(sha) and commits.known(r, sha)):
                raise ApiError(422, "Object does not exist")
            if not force and not commits.is_ancestor(r, r.refs[full], sha):
                raise ApiError(422, "Update is not a fast forward")
            self._move(r, full, sha, self.user(pusher))
            return render.git_ref(self.ctx(base_url), r, full, sha)

    def delete_ref(self, owner: str, repo: str, ref: str, *, pusher: str = DEFAULT_PUSHER) -> None:
        with self.lock:
            r = self.repo(owner, repo)
            full = _full(ref)
            if full not in r.refs:
                raise ApiError(422, "Reference does not exist")
            self._move(r, full, None, self.user(pusher))

    def push(
        self,
        owner: str,
        repo: str,
        branch: str,
        *,
        message: str = "Work in progress",
        author: str = DEFAULT_PUSHER,
        count: int = 1,
        parent: str | None = None,
        base: str | None = None,
        files: dict[str, str | None] | None = None,
        merge: str | None = None,
    ) -> dict[str, Any]:
        """What `git push` of ``count`` new commits does to ``branch``: the first commit's
        parent is ``parent`` (default: the branch's tip; a new branch starts from ``base``,
        default the default branch), each next one's the one before. A ``parent`` the tip
        does not descend from rewrites history: GitHub reports that push as forced.
        ``files`` (path -> content, None deletes): what the last commit changes. ``merge``:
        a branch merged in by the last commit (a second parent; its changes are taken,
        the pushed branch's own win where both changed a file)."""
        if count < 1:
            raise ApiError(422, "count must be at least 1")
        with self.lock:
            r = self.repo(owner, repo)
            full = f"refs/heads/{branch}"
            before = r.refs.get(full)
            if before is None:
                self._check_new_ref(r, full)
            if parent is not None:
                if not (_is_sha(parent) and commits.known(r, parent)):
                    raise ApiError(422, "Object does not exist")
                tip = parent
            elif before is not None:
                tip = before
            else:
                start = r.refs.get(f"refs/heads/{base or r.default_branch}")
                if start is None:
                    raise NotFound("Branch not found")
                tip = start
            for i in range(count):
                text = message if count == 1 else f"{message} ({i + 1}/{count})"
                last = i == count - 1
                parents = [tip]
                if last and merge is not None:
                    other = r.refs.get(f"refs/heads/{merge}")
                    if other is None:
                        raise NotFound("Branch not found")
                    parents.append(other)
                    files = {**commits.changes(r, tip, commits.ancestry(r, other)), **(files or {})}
                changed = files if last else None
                tip = self.commit(r, parents, message=text, author=author, files=changed)["sha"]
            push = self._move(r, full, tip, self.user(author))
            return {k: push[k] for k in ("ref", "before", "after", "created", "forced")}

    def commit(
        self,
        repo: Repo,
        parents: list[str],
        *,
        message: str,
        author: str,
        files: dict[str, str | None] | None = None,
    ) -> Record:
        """Record a new commit (no ref moves)."""
        return commits.add(
            repo,
            parents,
            message=message,
            author=self.user(author),
            timestamp=self.now(),
            seq=self.next_id(),
            files=files,
        )

    def ref_moved(self, repo: Repo, ref: str, push: Record) -> None:
        """Called under the lock after every ref move (checks.py: mergeability, fake CI)."""

    def _check_new_ref(self, repo: Repo, ref: str) -> None:
        if not ref.startswith("refs/") or ref.count("/") < 2:
            raise ApiError(422, "Reference name must start with 'refs/' and have two slashes")
        if not valid_ref_name(ref):
            raise ApiError(422, f"{ref} is not a valid ref name.")
        if ref in repo.refs:
            raise ApiError(422, "Reference already exists")
        # Refs are files to git: a ref cannot sit under another one, nor hold one.
        if any(o.startswith(ref + "/") or ref.startswith(o + "/") for o in repo.refs):
            raise ApiError(422, "Reference update failed")

    def _move(self, repo: Repo, ref: str, after: str | None, pusher: str) -> Record:
        """Point `ref` at `after` (None deletes it), move open pull requests' heads along
        (GitHub's `synchronize`), and report the push."""
        before = repo.refs.get(ref)
        observed = self.push_observer is not None
        # Which commits the push brings is only worked out when someone listens: with a
        # branch per issue, reading every other ref on every push would cost O(refs).
        elsewhere = _reachable_from_other_refs(repo, ref) if observed else set()
        if after is None:
            del repo.refs[ref]
        else:
            repo.refs[ref] = after
        # No repo.version bump: cached listings hold records and read refs when rendered.
        repo.pushed_at = self.now()
        push: Record = {
            "ref": ref,
            "before": before or ZERO_SHA,
            "after": after or ZERO_SHA,
            "created": before is None,
            "deleted": after is None,
            "forced": bool(before and after and not commits.is_ancestor(repo, before, after)),
            "pusher": pusher,
            "pulls": self._synchronize_pulls(repo, ref, after),
            "base_ref": None,
            "commits": [],
        }
        if observed and after is not None:
            excluded = commits.ancestry(repo, before) if before else elsewhere
            push["commits"] = [
                {**c, "distinct": c["sha"] not in elsewhere}
                for c in commits.only_in(repo, after, excluded)
            ]
            if before is None:
                # A branch made at another branch's tip says which one (GitHub's base_ref).
                tips = [f"refs/heads/{repo.default_branch}", *sorted(repo.refs)]
                push["base_ref"] = next(
                    (t for t in tips if t != ref and repo.refs.get(t) == after), None
                )
        if self.push_observer is not None:
            self.push_observer(self, repo, push)
        self.ref_moved(repo, ref, push)
        return push

    def _synchronize_pulls(self, repo: Repo, ref: str, after: str | None) -> list[int]:
        if after is None or not ref.startswith("refs/heads/"):
            return []
        branch = ref[len("refs/heads/") :]
        moved = []
        for number in sorted(repo.pulls):
            rec = repo.issues.get(number)
            if rec is None or rec["state"] != "open":
                continue
            pull = rec["pull"]
            if pull["head"] == branch and pull["head_sha"] != after:
                pull["head_sha"] = after
                self.touch(repo, rec)
                moved.append(number)
        return moved


def _is_sha(value: str) -> bool:
    return len(value) == 40 and all(c in "0123456789abcdef" for c in value)


def _reachable_from_other_refs(repo: Repo, ref: str) -> set[str]:
    seen: set[str] = set()
    for name, sha in repo.refs.items():
        if name != ref and sha not in seen:
            seen |= commits.ancestry(repo, sha)
    return seen
