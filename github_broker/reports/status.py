"""What maintainers see: queues per priority, leases, skipped issues, reviews in their loop."""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from github_broker.clock import iso_from_ms, now_ms
from github_broker.models import LeaseInfo, TaskPause, TaskState, priority_of_score
from github_broker.reports import health as health_view
from github_broker.reports.blockers import blocker_words
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store


class WaitingReview(BaseModel):
    """One issue in its review loop (labelled needs-review), and the step it waits at."""

    issue: int
    url: str
    pr: int | None
    pr_url: str
    #: waiting_delay | no_linked_pr | review_ready | review_held | fix_ready | fix_held |
    #: awaiting_feedback | needs_human | not_checked | waiting_for_checks | checks_failed |
    #: conflict | checks_stale | approval_required
    step: str
    due_at: str | None
    fix_rounds: int
    detail: str
    #: The PR's checks in words (leader/checks.py): checks running, checks failed (which),
    #: conflict, green; "" while not read.
    checks: str = ""
    #: Fix and rebase rounds from checks and conflicts so far, and the cap.
    check_rounds: int = 0
    #: The issue's state in GitHub's agent-task vocabulary, with `detail` as its reason.
    state: TaskState = TaskState.QUEUED


class OverlappingPR(BaseModel):
    """An open agent PR that changes files another one changes too."""

    issue: int
    pr: int
    #: The files it shares with the others.
    files: list[str]
    with_prs: list[int]
    #: The suggested merge order of the group: smaller first, then older (docs/checks.md).
    merge_order: list[int]


class LeaseStatus(BaseModel):
    """A held task and what is known of its progress."""

    issue: int
    agent_id: str
    task_type: str
    #: in_progress | idle (stalled) | waiting_for_user (a budget reached)
    state: TaskState
    claimed_at: str
    expires_at: str
    heartbeats: int
    last_progress: str | None
    last_progress_at: str | None
    note: str
    stalled: str | None
    #: Set aside at a budget: why and since when (the lease lives on; waiting_for_user).
    paused: TaskPause | None


class EndedTask(BaseModel):
    """A task whose lease ended lately: how (its state) and why."""

    issue: int
    agent_id: str
    #: completed | failed | timed_out | cancelled
    state: TaskState
    #: How the lease ended, in the broker's words: completed, failed, abandoned, expired,
    #: revoked, issue_closed, label_removed.
    ended: str
    detail: str
    ended_at: str


class WaitingOnPerson(BaseModel):
    """Work that waits on a person: no agent can move it."""

    issue: int
    code: str
    since: str
    age_s: int
    detail: str


class BlockedIssue(BaseModel):
    """An issue a blocker keeps from being handed out (docs/dependencies.md)."""

    issue: int
    blocker: str
    #: open | not_planned | duplicate | unserved | unknown | gone (and `?hidden` / `?error`
    #: blockers: unreadable)
    state: str
    detail: str
    #: The dependency cycle it is on, if any.
    cycle: list[str] = []


class RepoStatus(BaseModel):
    repository: str
    bucket: int | None
    #: The repository's maintenance pause (its own or the broker's), if any.
    paused: dict[str, Any] | None = None
    ready_by_priority: dict[str, int]
    leases: list[LeaseStatus]
    skipped: dict[int, dict[str, str]]
    waiting_reviews: list[WaitingReview]
    waiting_on_people: list[WaitingOnPerson]
    #: The newest tasks whose leases ended (RECENT_TASKS at most), newest first.
    recent_tasks: list[EndedTask] = []
    #: Open agent PRs changing the same files, with a suggested merge order.
    overlapping_prs: list[OverlappingPR] = []
    #: Issues a blocker keeps waiting, as the leader last judged (the claim judges again).
    blocked: list[BlockedIssue] = []
    pending_github_writes: int
    #: Age in seconds of the oldest due GitHub write (0: GitHub is up to date).
    github_write_lag_s: float = 0.0
    last_full_sync: str | None
    sync_cursor: str | None


async def repo_status(rstore: RepoStore, settings: Settings) -> RepoStatus:
    ready = await rstore.ready_tasks()
    by_priority: dict[str, int] = {}
    for _, score in ready:
        key = f"P{priority_of_score(score)}"
        by_priority[key] = by_priority.get(key, 0) + 1
    state = await rstore.sync_state()
    full_at = state.get("full_at")
    leases = await rstore.leases()
    now = now_ms()
    return RepoStatus(
        repository=rstore.repository,
        bucket=await rstore.bucket(),
        paused=await rstore.repo_pause(),
        ready_by_priority=dict(sorted(by_priority.items(), key=lambda kv: int(kv[0][1:]))),
        leases=[lease_status(lease) for lease in leases],
        skipped={n: r.model_dump() for n, r in sorted((await rstore.skipped()).items())},
        waiting_reviews=list(
            (await waiting_reviews(rstore, settings, dict(ready), leases)).values()
        ),
        waiting_on_people=[
            WaitingOnPerson(
                issue=n,
                code=w.code,
                since=iso_from_ms(w.since_ms),
                age_s=max(0, now - w.since_ms) // 1000,
                detail=w.detail,
            )
            for n, w in sorted((await rstore.waiting()).items())
        ],
        recent_tasks=await recent_tasks(rstore),
        overlapping_prs=overlapping(await rstore.checks_records()),
        blocked=await blocked_issues(rstore),
        pending_github_writes=await rstore.outbox_size(),
        github_write_lag_s=round(await rstore.outbox_lag_s(), 3),
        last_full_sync=iso_from_ms(int(float(full_at) * 1000)) if full_at else None,
        sync_cursor=state.get("since"),
    )


async def blocked_issues(rstore: RepoStore) -> list[BlockedIssue]:
    cycles = await rstore.cycles()
    return [
        BlockedIssue(
            issue=n,
            blocker=b.ref,
            state=b.state,
            detail=blocker_words(b.ref, b.state, cycles.get(n)),
            cycle=cycles.get(n, []),
        )
        for n, b in sorted((await rstore.blocked()).items())
    ]


def lease_status(lease: LeaseInfo) -> LeaseStatus:
    return LeaseStatus(
        issue=lease.issue,
        agent_id=lease.agent_id,
        task_type=lease.task_type,
        state=lease.state,
        claimed_at=iso_from_ms(lease.claimed_ms),
        expires_at=iso_from_ms(lease.expires_ms),
        heartbeats=lease.beats,
        last_progress=lease.progress or None,
        last_progress_at=iso_from_ms(lease.progress_ms) if lease.progress_ms else None,
        note=lease.note,
        stalled=lease.stalled or None,
        paused=pause_of_lease(lease.paused),
    )


def pause_of_lease(raw: str) -> TaskPause | None:
    """A lease's `paused` field (JSON written by set_aside in _lib.lua) as a TaskPause."""
    if not raw:
        return None
    data = json.loads(raw)
    return TaskPause(
        code=str(data.get("code", "")),
        detail=str(data.get("detail", "")),
        at=iso_from_ms(int(data.get("at_ms", 0))),
    )


#: Ended tasks /status shows per repository, and timeline events read to find them.
RECENT_TASKS = 20
RECENT_EVENTS_READ = 200


async def recent_tasks(rstore: RepoStore) -> list[EndedTask]:
    ended = [e for e in await rstore.timeline(RECENT_EVENTS_READ) if e.state is not None]
    return [
        EndedTask(
            issue=e.issue or 0,
            agent_id=e.agent,
            state=e.state,
            ended=e.kind,
            detail=e.detail,
            ended_at=iso_from_ms(e.at_ms),
        )
        for e in ended[:RECENT_TASKS]
        if e.state is not None
    ]


async def status(
    store: Store, settings: Settings, repositories: Collection[str] | None = None
) -> dict[str, Any]:
    """The deployment's status; `repositories`: only those (a maintainer's view: agents
    paused deployment-wide are shown only where they hold a task there)."""
    quota = await store.quota()
    shown = [r for n, r in store.repos.items() if repositories is None or n in repositories]
    rows = [await repo_status(r, settings) for r in shown]
    paused = await store.paused_agents()
    if repositories is not None:
        holders = {lease.agent_id for row in rows for lease in row.leases}
        paused = {agent: pause for agent, pause in paused.items() if agent in holders}
    return {
        "repositories": [row.model_dump() for row in rows],
        "github_quota": quota.model_dump() if quota else None,
        "poller_leader": await store.leader_id(),
        "broker_paused": await store.broker_pause(),
        "paused_agents": {agent: pause.model_dump() for agent, pause in paused.items()},
        "health": (await health_view.health(store, settings, repositories)).model_dump(),
    }


async def waiting_reviews(
    rstore: RepoStore,
    settings: Settings,
    ready: dict[str, float],
    leases: list[LeaseInfo],
) -> dict[int, WaitingReview]:
    """Every needs-review issue by number, with the step of the review loop it waits at."""
    numbers = await rstore.reviewing()
    states = await rstore.review_states(numbers)
    issues = {i.number: i for i in await rstore.get_issues(numbers)}
    held = {lease.issue: lease for lease in leases}
    checks = await rstore.checks_records(numbers)
    needs_human = settings.labels.needs_human
    out = {}
    for n in numbers:
        detected, state = states[n]
        issue = issues.get(n)
        link = json.loads(state.get("link") or "{}")
        due_ms = link.get("due_ms")
        verdict = (checks.get(n) or {}).get("verdict") or {}
        step, detail = _review_step(n, state, link, ready, held.get(n))
        step, detail = _checks_step(step, detail, state, verdict, settings)
        if issue is not None and needs_human in issue.labels:
            step, detail = "needs_human", "labelled needs-human: no review or fix is handed out"
        if detected is None:
            step, detail = "not_checked", "needs-review not seen by a sync yet"
        out[n] = WaitingReview(
            issue=n,
            url=issue.html_url if issue else "",
            pr=link.get("pr"),
            pr_url=link.get("pr_url") or "",
            step=step,
            due_at=iso_from_ms(int(due_ms)) if due_ms else None,
            fix_rounds=int(state.get("fix_rounds", "0")),
            detail=detail,
            checks=str(verdict.get("detail") or ""),
            check_rounds=int(state.get("ci_rounds") or 0),
            state=STEP_STATES.get(step, TaskState.QUEUED),
        )
    return out


#: A review loop's step in GitHub's agent-task vocabulary.
STEP_STATES = {
    "review_held": TaskState.IN_PROGRESS,
    "fix_held": TaskState.IN_PROGRESS,
    "waiting_for_checks": TaskState.IN_PROGRESS,
    "awaiting_feedback": TaskState.WAITING_FOR_USER,
    "needs_human": TaskState.WAITING_FOR_USER,
    "checks_stale": TaskState.WAITING_FOR_USER,
    "approval_required": TaskState.WAITING_FOR_USER,
    "checks_capped": TaskState.WAITING_FOR_USER,
    "no_linked_pr": TaskState.WAITING_FOR_USER,
}
#: A checks verdict (leader/checks.py) -> the review loop's step while the review waits on it.
CHECK_STEPS = {
    "running": "waiting_for_checks",
    "failed": "checks_failed",
    "conflict": "conflict",
    "stale": "checks_stale",
    "approval": "approval_required",
}


def _checks_step(
    step: str,
    detail: str,
    state: dict[str, str],
    verdict: dict[str, Any],
    settings: Settings,
) -> tuple[str, str]:
    """What the PR's checks add to the review loop's step: a fix round from them, or the
    checks the review waits for."""
    rounds = int(state.get("ci_rounds") or 0)
    of = settings.checks.max_rounds
    if (
        step in ("fix_ready", "fix_held")
        and rounds
        and verdict.get("status")
        in (
            "failed",
            "conflict",
        )
    ):
        kind = "rebase" if verdict["status"] == "conflict" else "fix"
        return step, f"{kind} round {rounds} of {of}: {verdict['detail']}; {detail}"
    waits = step in ("waiting_delay", "review_ready") or step.startswith("checks")
    if not verdict or verdict.get("review_ok") or not waits:
        return step, detail
    if verdict.get("status") == "failed" and rounds >= of:
        return "checks_capped", f"{rounds} of {of} fix rounds used: {verdict['detail']}"
    return CHECK_STEPS.get(str(verdict.get("status")), step), str(verdict.get("detail"))


def overlapping(records: dict[int, dict[str, Any]]) -> list[OverlappingPR]:
    """The tracked PRs whose files overlap (leader/checks.py records them)."""
    out = []
    for n, rec in sorted(records.items()):
        overlap = rec.get("overlap")
        if not overlap:
            continue
        files = sorted({f for o in overlap["with"] for f in o["files"]})
        out.append(
            OverlappingPR(
                issue=n,
                pr=int(rec["pr"]),
                files=files,
                with_prs=[int(o["pr"]) for o in overlap["with"]],
                merge_order=[int(pr) for pr in overlap["order"]],
            )
        )
    return out


def _review_step(
    n: int,
    state: dict[str, str],
    link: dict[str, Any],
    ready: dict[str, float],
    lease: LeaseInfo | None,
) -> tuple[str, str]:
    if not link:
        return "not_checked", "the review upkeep has not looked at it yet"
    if link.get("pr") is None:
        return "no_linked_pr", "needs-review but no open PR has its branch or closes it"
    if lease is not None:
        return f"{lease.task_type}_held", f"{lease.task_type} held by {lease.agent_id}"
    if f"fix:{n}" in ready:
        return "fix_ready", f"fix round {state.get('fix_rounds', '?')} waits for an agent"
    if f"review:{n}" in ready:
        return "review_ready", "review waits for an agent"
    if state.get("reviewed") == "1":
        return "awaiting_feedback", "reviewed; a fix round starts when new feedback settles"
    due_ms = int(link.get("due_ms") or 0)
    if due_ms > time.time() * 1000:
        return "waiting_delay", f"review waits until {iso_from_ms(due_ms)}"
    return "waiting_delay", "review is due; offered by the next review upkeep pass"
