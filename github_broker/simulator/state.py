"""SimState: the whole in-memory GitHub — issues, refs, collaborators and reactions (from the
stores it is made of) plus pull requests and reviews."""

from __future__ import annotations

import logging
import re
from typing import Any

from . import render
from .checks import CheckStore
from .collaborators import CollaboratorStore
from .issues import TimeLike
from .messages import ApiError, NotFound, validation_failed
from .model import Record, Repo, normalize_time
from .planning import PlanningStore
from .reactions import ReactionStore

logger = logging.getLogger(__name__)

_REVIEW_STATES = {
    "APPROVE": "APPROVED",
    "REQUEST_CHANGES": "CHANGES_REQUESTED",
    "COMMENT": "COMMENTED",
    "APPROVED": "APPROVED",
    "CHANGES_REQUESTED": "CHANGES_REQUESTED",
    "COMMENTED": "COMMENTED",
    "PENDING": "PENDING",
}
# GitHub closes these issues when a PR carrying the keyword merges into the default branch.
_CLOSING_KEYWORD = re.compile(r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\s*:?\s+#(\d+)", re.I)


def closed_by(body: str | None) -> set[int]:
    """The issue numbers a pull request's body closes (its closing keywords)."""
    return {int(m.group(1)) for m in _CLOSING_KEYWORD.finditer(body or "")}


_PULL_SORTS = {"created": "created", "updated": "updated", "popularity": "comments"}


class SimState(CheckStore, CollaboratorStore, ReactionStore, PlanningStore):
    """Thread-safe store of the simulated GitHub; see IssueStore for the conventions."""

    # ----- pull requests ---------------------------------------------------------------------

    def pull_record(self, repo: Repo, number: int) -> Record:
        rec = self.issue_record(repo, number)
        if rec["pull"] is None:
            raise NotFound()
        return rec

    def create_pull(
        self,
        owner: str,
        repo: str,
        *,
        title: str,
        head: str,
        base: str | None = None,
        body: str = "",
        user: str = "octocat",
        draft: bool = False,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """Open a PR (``base`` defaults to the default branch).

        A missing head branch is created: agents push over git, which the simulator lacks.
        """
        with self.lock:
            r = self.repo(owner, repo)
            base = base or r.default_branch
            head = head.split(":", 1)[1] if ":" in head else head
            if f"refs/heads/{base}" not in r.refs:
                raise validation_failed("PullRequest", "base", "invalid")
            if head == base:
                raise _pull_error(f"No commits between {base} and {head}")
            for rec in r.issues.values():
                pr = rec["pull"]
                if pr and rec["state"] == "open" and pr["head"] == head and pr["base"] == base:
                    raise _pull_error(f"A pull request already exists for {r.owner}:{head}.")
            head_ref = f"refs/heads/{head}"
            if head_ref not in r.refs:
                # The branch arrives as `git push` would have left it: one commit on the base.
                base_tip = r.refs[f"refs/heads/{base}"]
                r.refs[head_ref] = self.commit(r, [base_tip], message=title, author=user)["sha"]
            pull_id = self.next_id()
            pull: Record = {
                "id": pull_id,
                "node_id": f"PR_{pull_id}",
                "head": head,
                "base": base,
                "head_sha": r.refs[head_ref],
                "base_sha": r.refs[f"refs/heads/{base}"],
                "draft": draft,
                "merged": False,
                "merged_at": None,
                "merged_by": None,
                "merge_commit_sha": None,
                "review_comments": 0,
            }
            rec = self.new_issue_record(r, title=title, body=body, user=user, pull=pull)
            return render.pull(self.ctx(base_url), r, rec)

    def get_pull(
        self, owner: str, repo: str, number: int, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.pull_record(r, number)
            answer = render.pull(self.ctx(base_url), r, rec)
            self.pull_read(r, rec, answer)
            return answer

    def update_pull(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        base: str | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.pull_record(r, number)
            if state == "open" and rec["pull"]["merged"]:
                raise _pull_error("Cannot reopen a merged pull request")
            if base is not None:
                if f"refs/heads/{base}" not in r.refs:
                    raise validation_failed("PullRequest", "base", "invalid")
                rec["pull"]["base"] = base
            self.apply_update(r, rec, title=title, body=body, state=state)
            self.touch(r, rec)
            return render.pull(self.ctx(base_url), r, rec)

    def merge_pull(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        user: str = "octocat",
        sha: str | None = None,
        commit_title: str | None = None,
    ) -> dict[str, Any]:
        """Merge with a merge commit on the base branch (a `push` to it), close the PR, and
        close the issues its body closes when the base is the default branch. ``sha``: the
        head the caller reviewed; another head answers 409, as on GitHub."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.pull_record(r, number)
            pr = rec["pull"]
            if pr["merged"] or rec["state"] != "open":
                raise ApiError(405, "Pull Request is not mergeable")
            if sha is not None and sha != pr["head_sha"]:
                raise ApiError(409, "Head branch was modified. Review and try the merge again.")
            self.check_merge(r, rec)
            base_ref = f"refs/heads/{pr['base']}"
            title = commit_title or f"Merge pull request #{number} from {r.owner}/{pr['head']}"
            parents = [r.refs.get(base_ref, pr["base_sha"]), pr["head_sha"]]
            merge = self.commit(r, parents, message=title, author=user)["sha"]
            self._move(r, base_ref, merge, self.user(user))
            now = self.now()
            pr.update(merged=True, merged_at=now, merged_by=self.user(user), merge_commit_sha=merge)
            self.apply_update(r, rec, state="closed")
            self.touch(r, rec)
            if pr["base"] == r.default_branch:
                self._close_linked_issues(r, rec)
            return {"sha": merge, "merged": True, "message": "Pull Request successfully merged"}

    def _close_linked_issues(self, repo: Repo, pull_rec: Record) -> None:
        for match in _CLOSING_KEYWORD.finditer(pull_rec["body"] or ""):
            linked = repo.issues.get(int(match.group(1)))
            if linked is not None and linked["pull"] is None and linked["state"] == "open":
                self.apply_update(repo, linked, state="closed")
                self.touch(repo, linked)

    def is_merged(self, owner: str, repo: str, number: int) -> bool:
        with self.lock:
            return bool(self.pull_record(self.repo(owner, repo), number)["pull"]["merged"])

    def list_pulls(
        self,
        owner: str,
        repo: str,
        *,
        state: str = "open",
        head: str | None = None,
        base: str | None = None,
        sort: str = "created",
        direction: str | None = None,
        page: int = 1,
        per_page: int = 30,
        base_url: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        if state not in ("open", "closed", "all"):
            raise validation_failed("PullRequest", "state", "invalid")
        order = _PULL_SORTS.get(sort, "created")
        # GitHub's default: newest first for "created", otherwise ascending.
        descending = direction == "desc" if direction else sort == "created"
        head_branch = head.split(":", 1)[1] if head and ":" in head else head

        def keep(rec: Record) -> bool:
            pr = rec["pull"]
            if pr is None or (state != "all" and rec["state"] != state):
                return False
            if head_branch is not None and pr["head"] != head_branch:
                return False
            return base is None or pr["base"] == base

        key = ("pulls", state, head_branch, base, order, descending)
        with self.lock:
            r = self.repo(owner, repo)
            pulls = r.pulls
            matches = self.listing(
                r,
                key,
                order,
                descending,
                keep,
                lambda: [r.issues[n] for n in pulls if n in r.issues],
            )
            start = (max(page, 1) - 1) * per_page
            ctx = self.ctx(base_url)
            items = [render.pull(ctx, r, rec) for rec in matches[start : start + per_page]]
            return items, len(matches)

    # ----- reviews and review comments -------------------------------------------------------

    def add_review(
        self,
        owner: str,
        repo: str,
        pr_number: int,
        *,
        user: str,
        body: str = "",
        state: str = "COMMENTED",
        commit_id: str | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """Submit a review; ``state`` takes either review states or REST events (APPROVE...)."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.pull_record(r, pr_number)
            review_state = _REVIEW_STATES.get(state.upper())
            if review_state is None:
                raise validation_failed("PullRequestReview", "event", "invalid")
            if review_state in ("CHANGES_REQUESTED", "COMMENTED") and not body:
                raise ApiError(422, "Unprocessable Entity", errors=[_body_required(review_state)])
            review = self._new_review(r, rec, user=user, body=body, state=review_state)
            if commit_id:
                review["commit_id"] = commit_id
            return render.review(self.ctx(base_url), r, pr_number, review)

    def _new_review(self, repo: Repo, rec: Record, *, user: str, body: str, state: str) -> Record:
        pull = rec["pull"]
        review: Record = {
            "id": self.next_id(),
            "user": self.user(user),
            "body": body,
            "state": state,
            "submitted_at": None if state == "PENDING" else self.now(),
            "commit_id": repo.refs.get(f"refs/heads/{pull['head']}", pull["head_sha"]),
        }
        repo.reviews.setdefault(rec["number"], []).append(review)
        self.touch(repo, rec)
        return review

    def list_reviews(
        self,
        owner: str,
        repo: str,
        pr_number: int,
        *,
        viewer: str | None = None,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        """Submitted reviews, and `viewer`'s own PENDING one: drafts are private on GitHub."""
        with self.lock:
            r = self.repo(owner, repo)
            self.pull_record(r, pr_number)
            ctx = self.ctx(base_url)
            return [
                render.review(ctx, r, pr_number, rv)
                for rv in r.reviews.get(pr_number, [])
                if rv["state"] != "PENDING" or rv["user"] == viewer
            ]

    def add_review_comment(
        self,
        owner: str,
        repo: str,
        pr_number: int,
        *,
        user: str,
        body: str,
        path: str = "README.md",
        line: int = 1,
        side: str = "RIGHT",
        commit_id: str | None = None,
        review_id: int | None = None,
        in_reply_to: int | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """Comment on a diff line; without ``review_id`` GitHub wraps it in a COMMENTED review."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.pull_record(r, pr_number)
            if not body:
                raise validation_failed("PullRequestReviewComment", "body", "missing_field")
            if not path:
                raise validation_failed("PullRequestReviewComment", "path", "missing_field")
            if review_id is None:
                review_id = self._new_review(r, rec, user=user, body="", state="COMMENTED")["id"]
            elif not any(rv["id"] == review_id for rv in r.reviews.get(pr_number, [])):
                raise NotFound()
            now = self.now()
            comment: Record = {
                "id": self.next_id(),
                "review_id": review_id,
                "user": self.user(user),
                "body": body,
                "path": path,
                "line": line,
                "side": side,
                "commit_id": commit_id or rec["pull"]["head_sha"],
                "in_reply_to": in_reply_to,
                "created_at": now,
                "updated_at": now,
            }
            r.review_comments.setdefault(pr_number, []).append(comment)
            rec["pull"]["review_comments"] += 1
            self.touch(r, rec)
            return render.review_comment(self.ctx(base_url), r, pr_number, comment)

    def list_review_comments(
        self,
        owner: str,
        repo: str,
        pr_number: int,
        *,
        since: TimeLike | None = None,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            self.pull_record(r, pr_number)
            ctx = self.ctx(base_url)
            since_text = "" if since is None else normalize_time(since)
            return [
                render.review_comment(ctx, r, pr_number, c)
                for c in r.review_comments.get(pr_number, [])
                if c["updated_at"] >= since_text
            ]


def _pull_error(message: str) -> ApiError:
    return ApiError(
        422,
        "Validation Failed",
        errors=[{"resource": "PullRequest", "code": "custom", "message": message}],
    )


def _body_required(state: str) -> dict[str, Any]:
    event = "REQUEST_CHANGES" if state == "CHANGES_REQUESTED" else "COMMENT"
    return {
        "resource": "PullRequestReview",
        "code": "custom",
        "field": "body",
        "message": f"Review body is required when event is {event}",
    }
