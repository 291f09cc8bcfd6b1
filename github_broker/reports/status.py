"""What maintainers see: queues per priority, leases, skipped issues, reviews in their loop."""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from typing import Any

from pydantic import BaseModel

from github_broker.clock import iso_from_ms, now_ms
from github_broker.models import LeaseInfo, TaskState, priority_of_score
from github_broker.reports import health as health_view
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store


class WaitingReview(BaseModel):
    """One issue in its review loop (labelled needs-review), and the step it waits at."""

    issue: int
    url: str
    pr: int | None
    pr_url: str
    #: waiting_delay | no_linked_pr | review_ready | review_held | fix_ready | fix_held |
    #: awaiting_feedback | needs_human | not_checked
    step: str
    due_at: str | None
    fix_rounds: int
    detail: str


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
    paused: str | None


class WaitingOnPerson(BaseModel):
    """Work that waits on a person: no agent can move it."""

    issue: int
    code: str
    since: str
    age_s: int
    detail: str


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
        pending_github_writes=await rstore.outbox_size(),
        github_write_lag_s=round(await rstore.outbox_lag_s(), 3),
        last_full_sync=iso_from_ms(int(float(full_at) * 1000)) if full_at else None,
        sync_cursor=state.get("since"),
    )


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
        paused=lease.paused or None,
    )


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
    needs_human = settings.labels.needs_human
    out = {}
    for n in numbers:
        detected, state = states[n]
        issue = issues.get(n)
        link = json.loads(state.get("link") or "{}")
        due_ms = link.get("due_ms")
        step, detail = _review_step(n, state, link, ready, held.get(n))
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
