"""Review tasks, fix tasks from new feedback, and review-done on old PRs (their timers:
review_timers.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from github_broker.claim.rules import Rules, task_score
from github_broker.clock import ms_from_iso
from github_broker.errors import Conflict, InvalidRequest, NotFound
from github_broker.gateway import GitHubGateway
from github_broker.leader.review_timers import ReviewTimers
from github_broker.models import Issue, ReviewComment, TaskType
from github_broker.settings import Repository, Settings
from github_broker.steering.commands.grammar import has_command
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
    #: Development tasks completed with no PR and no commit: back in the pool.
    no_pr: int = 0
    #: Feedback a held review's agent had not seen, sent to it as a note.
    late_feedback: int = 0
    #: issue -> when (ms) a review becomes due or new feedback settles: the poller runs the
    #: upkeep of that issue then, not at its next pass.
    next_due: dict[int, int] = field(default_factory=dict)


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


@dataclass(frozen=True)
class _Pass:
    """What one review pass read once for all its issues."""

    repo: Repository
    rstore: RepoStore
    #: The broker's own GitHub login (its comments are not feedback).
    login: str
    #: The fix task ids already queued or under way.
    pending_fixes: set[str]
    #: The PRs' checks records, by issue (empty when checks never hold a review).
    checks: dict[int, dict[str, Any]]
    report: ReviewReport


class ReviewKeeper:
    """One pass per repository, run by the poller leader after each sync."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        reindex: Callable[[RepoStore, Issue], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.review = settings.review
        self.store = store
        self.gateway = gateway
        self.rules = Rules(settings)
        #: Indexes an issue again from its cache (Syncer.reindex): a task back in the pool.
        self.reindex = reindex
        #: Whether this process leads (set by the daemon): timers fire only in the leader.
        self.leading: Callable[[], bool] = lambda: True
        self.timers = ReviewTimers(self._upkeep_when_due, lambda: self.leading())

    async def run(
        self, repo: Repository, pulls: list[dict[str, Any]] | None = None
    ) -> ReviewReport:
        """`pulls`: only the issues these open PRs link (a webhook or a timer names one),
        instead of listing them all."""
        report = ReviewReport()
        rstore = self.store.repo(repo.full_name)
        numbers = await rstore.reviewing()
        if not numbers:
            return report
        partial_pass = pulls is not None
        states = await rstore.review_states(numbers)
        issues = {i.number: i for i in await rstore.get_issues(numbers)}
        if pulls is None:
            pulls = await asyncio.to_thread(self.gateway.open_pulls, repo.full_name)
        login = await asyncio.to_thread(self.gateway.login)
        by_head, by_issue = linked_pulls(pulls)
        pending_fixes = await rstore.existing_tasks([f"{TaskType.FIX}:{n}" for n in numbers])
        checks = await rstore.checks_records(numbers) if self._gated else {}
        one_pass = _Pass(repo, rstore, login, pending_fixes, checks, report)
        for n in numbers:
            detected, state = states[n]
            issue = issues.get(n)
            if issue is None or detected is None:
                continue
            pull = by_head.get(self.rules.branch(issue) or "") or by_issue.get(n)
            if pull is None and partial_pass:
                continue  # not one of the PRs asked about: its link is not known here
            await self._upkeep(one_pass, issue, detected, state, pull)
        return report

    async def _upkeep(
        self,
        one_pass: _Pass,
        issue: Issue,
        detected: str,
        state: dict[str, str],
        pull: dict[str, Any] | None,
    ) -> None:
        """One issue in its review loop: its link noted, then a review or a fix offered once
        due, or its missing PR handled."""
        p, n = one_pass, issue.number
        due_ms = ms_from_iso(detected) + int(self.review.delay_s * 1000)
        await self._note_link(p.rstore, n, pull, due_ms, state)
        if pull is None:
            p.report.unlinked += 1
            await self._no_pr(p.repo, p.rstore, issue, detected, state, p.report)
            return
        await self._review_done(p.rstore, n, pull, state, p.report)
        if self.settings.labels.needs_human in issue.labels:
            return  # the broker gave up on it: no review, no fix, until a person says
        if due_ms > time.time() * 1000:
            p.report.next_due[n] = due_ms
            return
        reviewed = state.get("reviewed") == "1"
        if reviewed and f"{TaskType.FIX}:{n}" in p.pending_fixes:
            return
        feedback = await asyncio.to_thread(
            self._feedback, p.repo.full_name, pull, p.login, state.get("dev_agent", "")
        )
        if not reviewed and self._gated and not _green(p.checks.get(n)):
            return  # its checks decide (leader/checks.py offers it once they allow)
        if not reviewed:
            # Offered once due, then refreshed on every pass until an agent takes it.
            p.report.reviews_offered += await self._offer_review(
                p.rstore, issue, pull, state, feedback, p.report
            )
        else:
            await self._maybe_fix(p.rstore, issue, pull, state, feedback, p.report)

    @property
    def _gated(self) -> bool:
        """Whether a PR's checks may hold its review (`checks.review_when_green`, the
        overlap hold)."""
        cfg = self.settings.checks
        return cfg.enabled and (cfg.review_when_green != "off" or cfg.hold_overlapping)

    # --- timers: a review or fix is offered when it becomes due, not at the next pass ------

    def arm(self, repo: Repository, report: ReviewReport) -> None:
        """Run the upkeep of each issue of `report.next_due` when it becomes due."""
        self.timers.arm(repo, report.next_due)

    def stop(self) -> None:
        self.timers.stop()

    async def _upkeep_when_due(self, repo: Repository, n: int) -> dict[int, int]:
        return (await self.run_issues(repo, [n])).next_due

    async def run_issues(self, repo: Repository, numbers: list[int]) -> ReviewReport:
        """The upkeep of these issues alone (a review or a fix that has just become due):
        their linked PRs read one by one, not listed."""
        rstore = self.store.repo(repo.full_name)
        states = await rstore.review_states(numbers)
        pulls = []
        for n in numbers:
            link = json.loads(states[n][1].get("link") or "{}")
            if link.get("pr"):
                pull = await asyncio.to_thread(self.gateway.pull, repo.full_name, int(link["pr"]))
                if pull is not None and pull.get("state") == "open":
                    pulls.append(pull)
        if not pulls:
            return ReviewReport()
        return await self.run(repo, pulls=pulls)

    async def _no_pr(
        self,
        repo: Repository,
        rstore: RepoStore,
        issue: Issue,
        detected: str,
        state: dict[str, str],
        report: ReviewReport,
    ) -> None:
        """A development task completed with no PR: after `progress.no_pr_grace_s` it goes
        back to the pool as a failed attempt when its branch has no commit, or waits on a
        person (someone must open the PR) when it has."""
        grace_ms = int(self.settings.progress.no_pr_grace_s * 1000)
        due = ms_from_iso(detected) + grace_ms
        if due > time.time() * 1000:
            report.next_due[issue.number] = due
            return
        if state.get("no_pr") == "1" or await self._merged(repo, rstore, issue.number, state):
            return
        branch = self.rules.branch(issue)
        ahead = await self._commits_ahead(repo, rstore, branch) if branch else None
        agent = state.get("dev_agent", "")
        target = str(issue.number)
        if ahead:
            await rstore.mark_review_state(issue.number, "no_pr", "1")
            what = f"{ahead} commit(s) on {branch} but no PR opened"
            await rstore.control("no_pr", "broker", target, what, agent, "1")
            return
        what = f"no PR and no commit on {branch}"
        done = await rstore.control("no_pr", "broker", target, what, agent, "")
        report.no_pr += 1
        logger.info("%s#%d: %s", repo.full_name, issue.number, done.outcome)
        if done.reindex:
            labels = [lab for lab in issue.labels if lab != self.settings.labels.needs_review]
            await self.reindex(rstore, issue.model_copy(update={"labels": labels}))

    async def _merged(
        self, repo: Repository, rstore: RepoStore, n: int, state: dict[str, str]
    ) -> bool:
        """Whether the PR last linked to issue `n` was merged (remembered in its review state:
        the link is cleared once the PR is no longer open): its work is done (GitHub closes
        the issue, the sync hears it), not missing. Without this, the issue went back to the
        pool as development between the merge and its close (its branch is in main then)."""
        if state.get("merged_pr"):
            return True
        link = json.loads(state.get("link") or "{}")
        if not link.get("pr"):
            return False
        pull = await asyncio.to_thread(self.gateway.pull, repo.full_name, int(link["pr"]))
        if not (pull and pull.get("merged")):
            return False
        await rstore.mark_review_state(n, "merged_pr", str(link["pr"]))
        return True

    async def _commits_ahead(self, repo: Repository, rstore: RepoStore, branch: str) -> int | None:
        """How many commits `branch` has beyond the repository's base branch."""
        base = repo.base_branch or (await rstore.sync_state()).get("default_branch") or "main"
        return await asyncio.to_thread(self.gateway.commits_ahead, repo.full_name, base, branch)

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
        report: ReviewReport,
    ) -> int:
        payload = {
            "pr": pull["number"],
            "pr_url": pull.get("html_url", ""),
            "feedback_ids": [f.key for f in feedback],
            "comments": [f.comment.model_dump() for f in feedback],
        }
        role = self.review.review_role or self.rules.issue_role(issue) or ""
        author = state.get("dev_agent", "")
        result = await self._put_task(rstore, TaskType.REVIEW, issue, pull, role, author, payload)
        if result == 2:
            logger.info(
                "%s#%d: waiting review refreshed (%d feedback items)",
                rstore.repository,
                issue.number,
                len(feedback),
            )
        elif result == 0:
            await self._late_feedback(rstore, issue.number, state, feedback, report)
        return int(result == 1)

    async def _late_feedback(
        self,
        rstore: RepoStore,
        n: int,
        state: dict[str, str],
        feedback: list[Feedback],
        report: ReviewReport,
    ) -> None:
        """Feedback given before the review was handed out that its payload missed (the
        upkeep had not read it yet): it is part of that review, so the reviewing agent gets it
        as a note with its next heartbeat, and it never becomes a fix round."""
        lease = await rstore.lease(n)
        if lease is None or lease.task_type != "review":
            return
        seen = set(json.loads(state.get("payload") or "{}").get("feedback_ids", []))
        late = [f for f in feedback if f.key not in seen and f.created_ms <= lease.claimed_ms]
        if not late:
            return
        note = "Feedback given before your review was handed out:\n" + "\n".join(
            f"- {f.comment.author}: {f.comment.body[:500]} {f.comment.url}".rstrip() for f in late
        )
        what = json.dumps(
            {
                "ids": [f.key for f in late],
                "comments": [f.comment.model_dump() for f in late],
                "note": note,
            }
        )
        if await rstore.lease_upkeep("feedback", n, lease.token, what):
            report.late_feedback += len(late)

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
        settles = max(f.created_ms for f in new) + int(self.review.fix_debounce_s * 1000)
        if time.time() * 1000 < settles:
            report.next_due[issue.number] = settles
            return  # comments still arriving: wait until they settle
        rounds = int(state.get("fix_rounds", "0"))
        if rounds >= self.review.max_fix_rounds:
            if state.get("needs_human") != "1":
                await self._needs_human(rstore, issue.number, rounds, report)
            return
        payload = fix_payload(
            issue.number,
            pull["number"],
            pull.get("html_url", ""),
            rounds + 1,
            {f.key: f.comment for f in new},
        )
        role = self.rules.issue_role(issue) or ""
        if await self._put_task(rstore, TaskType.FIX, issue, pull, role, "", payload):
            report.fixes_offered += 1

    async def _put_task(
        self,
        rstore: RepoStore,
        task_type: TaskType,
        issue: Issue,
        pull: dict[str, Any],
        role: str,
        author: str,
        payload: dict[str, Any],
    ) -> int:
        """A review or fix task on `pull`'s branch, at the issue's priority (see put_task)."""
        return await rstore.put_task(
            f"{task_type}:{issue.number}",
            score=self._score(issue, task_type),
            role=role,
            pr=pull["number"],
            author=author,
            branch=pull["head"]["ref"],
            payload=payload,
        )

    async def _needs_human(
        self, rstore: RepoStore, n: int, rounds: int, report: ReviewReport
    ) -> None:
        """Every fix round used: labelled needs-human, for a person to look."""
        await rstore.want_labels(n, [self.settings.labels.needs_human], [])
        await rstore.mark_review_state(n, "needs_human", "1")
        report.needs_human += 1
        logger.warning(
            "%s#%d: %d fix rounds used, labelled needs-human", rstore.repository, n, rounds
        )

    def _score(self, issue: Issue, task_type: TaskType) -> int:
        return task_score(self.rules.issue_priority(issue) or 0, task_type, issue.created_at)

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
        if kind == "conversation" and has_command(str(data.get("body") or "")):
            return None  # a `/broker` command is for the broker (commands/), not the agent
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


def _green(record: dict[str, Any] | None) -> bool:
    """A PR whose checks let its review through; not read yet: not yet."""
    return bool(record and (record.get("verdict") or {}).get("review_ok"))


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
        score=task_score(rules.issue_priority(issue) or 0, TaskType.FIX, issue.created_at),
        role=rules.issue_role(issue) or "",
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
