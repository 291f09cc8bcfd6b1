"""Review timers, review tasks, fix tasks from new feedback, and review-done on old PRs."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from github_broker.clock import ms_from_iso
from github_broker.errors import Conflict, InvalidRequest, NotFound
from github_broker.gateway import GitHubGateway
from github_broker.models import Issue, ReviewComment, TaskType
from github_broker.rules import Rules, task_score
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: "Closes #12" and GitHub's other closing keywords link a PR to an issue.
CLOSING_RE = re.compile(
    r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\s*:?\s+#(\d+)\b", re.IGNORECASE
)


@dataclass
class ReviewReport:
    reviews_offered: int = 0
    fixes_offered: int = 0
    review_done: int = 0
    needs_human: int = 0
    unlinked: int = 0


@dataclass(frozen=True)
class Feedback:
    key: str  # kind:id, unique across the three kinds
    created_ms: int
    comment: ReviewComment


def linked_pulls(
    pulls: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, Any]], dict[int, dict[str, Any]]]:
    """Open PRs by head branch, and by the issue numbers their bodies close."""
    by_head = {p["head"]["ref"]: p for p in pulls}
    by_issue: dict[int, dict[str, Any]] = {}
    for pull in sorted(pulls, key=lambda p: p["number"]):
        for match in CLOSING_RE.finditer(pull.get("body") or ""):
            by_issue.setdefault(int(match.group(1)), pull)
    return by_head, by_issue


class ReviewKeeper:
    """One pass per repository, run by the poller leader after each sync."""

    def __init__(self, settings: Settings, store: Store, gateway: GitHubGateway) -> None:
        self.settings = settings
        self.review = settings.review
        self.store = store
        self.gateway = gateway
        self.rules = Rules(settings)

    async def run(
        self, repo: Repository, pulls: list[dict[str, Any]] | None = None
    ) -> ReviewReport:
        """`pulls`: only these open PRs (a webhook names one), instead of listing them all."""
        report = ReviewReport()
        rstore = self.store.repo(repo.full_name)
        numbers = await rstore.reviewing()
        if not numbers:
            return report
        states = await rstore.review_states(numbers)
        issues = {i.number: i for i in await rstore.get_issues(numbers)}
        if pulls is None:
            pulls = await asyncio.to_thread(self.gateway.open_pulls, repo.full_name)
        login = await asyncio.to_thread(self.gateway.login)
        by_head, by_issue = linked_pulls(pulls)
        pending_fixes = await rstore.existing_tasks([f"{TaskType.FIX}:{n}" for n in numbers])
        for n in numbers:
            detected, state = states[n]
            issue = issues.get(n)
            if issue is None or detected is None:
                continue
            pull = by_head.get(self.rules.branch(issue) or "") or by_issue.get(n)
            due_ms = ms_from_iso(detected) + int(self.review.delay_s * 1000)
            await self._note_link(rstore, n, pull, due_ms, state)
            if pull is None:
                report.unlinked += 1
                continue
            await self._review_done(rstore, n, pull, state, report)
            if self.settings.labels.needs_human in issue.labels:
                continue  # the broker gave up on it: no review, no fix, until a person says
            if due_ms > time.time() * 1000:
                continue
            reviewed = state.get("reviewed") == "1"
            if reviewed and f"{TaskType.FIX}:{n}" in pending_fixes:
                continue
            feedback = await asyncio.to_thread(
                self._feedback, repo.full_name, pull, login, state.get("dev_agent", "")
            )
            if not reviewed:
                # Offered once due, then refreshed on every pass until an agent takes it.
                report.reviews_offered += await self._offer_review(
                    rstore, issue, pull, state, feedback
                )
            else:
                await self._maybe_fix(rstore, issue, pull, state, feedback, report)
        return report

    async def _note_link(
        self,
        rstore: RepoStore,
        n: int,
        pull: dict[str, Any] | None,
        due_ms: int,
        state: dict[str, str],
    ) -> None:
        """Record the linked PR (or its absence) and the due time for /status and /explain."""
        link = json.dumps(
            {
                "pr": pull["number"] if pull else None,
                "pr_url": pull.get("html_url", "") if pull else "",
                "due_ms": due_ms,
            },
            sort_keys=True,
        )
        if state.get("link") != link:
            await rstore.mark_review_state(n, "link", link)

    async def _review_done(
        self,
        rstore: RepoStore,
        n: int,
        pull: dict[str, Any],
        state: dict[str, str],
        report: ReviewReport,
    ) -> None:
        if state.get("review_done") == "1":
            return
        age_s = time.time() - ms_from_iso(pull["created_at"]) / 1000
        if age_s < self.review.timeout_s:
            return
        await rstore.want_labels(pull["number"], [self.settings.labels.review_done], [])
        await rstore.mark_review_state(n, "review_done", "1")
        report.review_done += 1
        logger.info(
            "labelled %s PR #%d review-done (issue #%d)", rstore.repository, pull["number"], n
        )

    async def _offer_review(
        self,
        rstore: RepoStore,
        issue: Issue,
        pull: dict[str, Any],
        state: dict[str, str],
        feedback: list[Feedback],
    ) -> int:
        payload = {
            "pr": pull["number"],
            "pr_url": pull.get("html_url", ""),
            "feedback_ids": [f.key for f in feedback],
            "comments": [f.comment.model_dump() for f in feedback],
        }
        result = await rstore.put_task(
            f"{TaskType.REVIEW}:{issue.number}",
            score=self._score(issue, TaskType.REVIEW),
            role=self.review.review_role or self.rules.role(issue.labels) or "",
            pr=pull["number"],
            author=state.get("dev_agent", ""),
            branch=pull["head"]["ref"],
            payload=payload,
        )
        if result == 2:
            logger.info(
                "%s#%d: waiting review refreshed (%d feedback items)",
                rstore.repository,
                issue.number,
                len(feedback),
            )
        return int(result == 1)

    async def _maybe_fix(
        self,
        rstore: RepoStore,
        issue: Issue,
        pull: dict[str, Any],
        state: dict[str, str],
        feedback: list[Feedback],
        report: ReviewReport,
    ) -> None:
        handled = set(json.loads(state.get("handled", "[]")))
        handled |= set(json.loads(state.get("payload", "{}")).get("feedback_ids", []))
        new = [f for f in feedback if f.key not in handled]
        if not new:
            return
        if time.time() * 1000 - max(f.created_ms for f in new) < self.review.fix_debounce_s * 1000:
            return  # comments still arriving: wait until they settle
        rounds = int(state.get("fix_rounds", "0"))
        if rounds >= self.review.max_fix_rounds:
            if state.get("needs_human") != "1":
                await rstore.want_labels(issue.number, [self.settings.labels.needs_human], [])
                await rstore.mark_review_state(issue.number, "needs_human", "1")
                report.needs_human += 1
                logger.warning(
                    "%s#%d: %d fix rounds used, labelled needs-human",
                    rstore.repository,
                    issue.number,
                    rounds,
                )
            return
        payload = fix_payload(
            issue.number,
            pull["number"],
            pull.get("html_url", ""),
            rounds + 1,
            {f.key: f.comment for f in new},
        )
        if await rstore.put_task(
            f"{TaskType.FIX}:{issue.number}",
            score=self._score(issue, TaskType.FIX),
            role=self.rules.role(issue.labels) or "",
            pr=pull["number"],
            author="",
            branch=pull["head"]["ref"],
            payload=payload,
        ):
            report.fixes_offered += 1

    def _score(self, issue: Issue, task_type: TaskType) -> int:
        return task_score(self.rules.priority(issue.labels) or 0, task_type, issue.created_at)

    # --- feedback (runs in a worker thread) ---------------------------------------------

    def _feedback(
        self, full_name: str, pull: dict[str, Any], login: str, dev_agent: str
    ) -> list[Feedback]:
        reviews, inline, conversation = self.gateway.pull_feedback(full_name, pull["number"])
        # The PR's author (the developing agent) and the broker's own login are not reviewers.
        own = {login, str((pull.get("user") or {}).get("login") or ""), dev_agent} - {""}
        out = []
        for r in reviews:
            # Approvals are not work; an empty COMMENTED review wraps inline comments.
            if r.get("state") in ("APPROVED", "PENDING") or not (r.get("body") or "").strip():
                continue
            out.append(self._item("review", r, r.get("submitted_at"), own))
        out += [self._item("inline", c, c.get("created_at"), own) for c in inline]
        out += [self._item("conversation", c, c.get("created_at"), own) for c in conversation]
        return sorted((f for f in out if f is not None), key=lambda f: (f.created_ms, f.key))

    def _item(
        self, kind: str, data: dict[str, Any], created: str | None, own: set[str]
    ) -> Feedback | None:
        user = data.get("user") or {}
        author = str(user.get("login", ""))
        if not self._counts(author, str(user.get("type", "")), own):
            return None
        comment = ReviewComment(
            id=int(data["id"]),
            kind=kind,
            author=author,
            body=data.get("body") or "",
            url=data.get("html_url") or "",
            path=data.get("path"),
            line=data.get("line"),
        )
        return Feedback(f"{kind}:{data['id']}", ms_from_iso(created) if created else 0, comment)

    def _counts(self, author: str, user_type: str, own: set[str]) -> bool:
        if user_type == "Bot" or author.endswith("[bot]") or author in own:
            return False
        if author in self.review.ignored_authors:
            return False
        return not self.review.allowed_authors or author in self.review.allowed_authors


def fix_payload(
    issue: int, pr: int, pr_url: str, round_: int, comments: dict[str, ReviewComment]
) -> dict[str, Any]:
    """The `task:fix:{pr}` record: which feedback (ids) this round addresses, and its text."""
    return {
        "pr": pr,
        "pr_url": pr_url,
        "issue": issue,
        "round": round_,
        "status": "pending",
        "comment_ids": sorted(comments),
        "comments": [c.model_dump() for c in comments.values()],
    }


async def post_fix(
    rstore: RepoStore,
    rules: Rules,
    *,
    issue_number: int,
    pr: int,
    pr_url: str,
    branch: str | None,
    comments: list[ReviewComment],
) -> str:
    """A fix task posted directly by a maintainer or a bot (`POST /tasks/fix`)."""
    issue = await rstore.get_issue(issue_number)
    if issue is None:
        raise NotFound(f"issue #{issue_number} is not an open issue of {rstore.repository}")
    branch = branch or rules.branch(issue)
    if not branch:
        raise InvalidRequest(f"issue #{issue_number} names no branch; pass `branch`")
    _, state = (await rstore.review_states([issue_number]))[issue_number]
    round_ = int(state.get("fix_rounds", "0")) + 1
    keyed = {f"direct:{uuid.uuid4().hex[:12]}": c for c in comments}
    task_id = f"{TaskType.FIX}:{issue_number}"
    added = await rstore.put_task(
        task_id,
        score=task_score(rules.priority(issue.labels) or 0, TaskType.FIX, issue.created_at),
        role=rules.role(issue.labels) or "",
        pr=pr,
        author="",
        branch=branch,
        payload=fix_payload(issue_number, pr, pr_url, round_, keyed),
        direct=True,
    )
    if not added:
        raise Conflict(f"a fix task for {rstore.repository}#{issue_number} is already pending")
    logger.info("fix task posted for %s#%d (PR #%d)", rstore.repository, issue_number, pr)
    return task_id
