"""What maintainers see: queues, leases, skipped issues, and why an agent gets what it gets."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel

from github_broker.clock import iso_from_ms
from github_broker.models import Issue, LeaseInfo
from github_broker.rules import priority_of_score
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

#: Blocking issues named per "waits" verdict (the rest are counted, not listed).
MAX_BLOCKERS = 10


class Blocker(BaseModel):
    """An issue another one waits for."""

    issue: int
    url: str


class Verdict(BaseModel):
    issue: int
    url: str = ""
    priority: int | None
    verdict: str  # next | queued | held | skipped | outside_bucket | role | waiting
    detail: str
    #: The issues this one waits for (outside_bucket: the open work that holds the bucket).
    blocking: list[Blocker] = []


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


class RepoStatus(BaseModel):
    repository: str
    bucket: int | None
    ready_by_priority: dict[str, int]
    leases: list[dict[str, Any]]
    skipped: dict[int, dict[str, str]]
    waiting_reviews: list[WaitingReview]
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
    return RepoStatus(
        repository=rstore.repository,
        bucket=await rstore.bucket(),
        ready_by_priority=dict(sorted(by_priority.items(), key=lambda kv: int(kv[0][1:]))),
        leases=[
            {
                "issue": lease.issue,
                "agent_id": lease.agent_id,
                "task_type": lease.task_type,
                "claimed_at": iso_from_ms(lease.claimed_ms),
                "expires_at": iso_from_ms(lease.expires_ms),
            }
            for lease in leases
        ],
        skipped={n: r.model_dump() for n, r in sorted((await rstore.skipped()).items())},
        waiting_reviews=list(
            (await waiting_reviews(rstore, settings, dict(ready), leases)).values()
        ),
        pending_github_writes=await rstore.outbox_size(),
        github_write_lag_s=round(await rstore.outbox_lag_s(), 3),
        last_full_sync=iso_from_ms(int(float(full_at) * 1000)) if full_at else None,
        sync_cursor=state.get("since"),
    )


async def status(store: Store, settings: Settings) -> dict[str, Any]:
    quota = await store.quota()
    return {
        "repositories": [
            (await repo_status(r, settings)).model_dump() for r in store.repos.values()
        ],
        "github_quota": quota.model_dump() if quota else None,
        "poller_leader": await store.leader_id(),
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


async def explain(rstore: RepoStore, settings: Settings, roles: list[str] | None) -> list[Verdict]:
    """For an agent with `roles`, what each open work issue would do for it, in order."""
    work = await rstore.work_priorities()
    tasks = await rstore.task_index()
    ready = dict(await rstore.ready_tasks())
    leases = await rstore.leases()
    skipped = await rstore.skipped()
    bucket = await rstore.bucket()
    reviews = await waiting_reviews(rstore, settings, ready, leases)
    blockers = await _bucket_blockers(rstore, work, bucket)
    strict = settings.priority_mode == "strict"
    verdicts: list[Verdict] = []
    listed: set[int] = set()
    for task_id, score in sorted(ready.items(), key=lambda kv: (kv[1], kv[0])):
        n = int(task_id.split(":")[1])
        if n in listed:
            continue  # a review and a fix of one issue: the first one is what it offers
        listed.add(n)
        prio = priority_of_score(score)
        role = tasks.get(task_id, (0.0, "", ""))[1]
        if roles and role not in roles:
            verdicts.append(_v(n, prio, "role", f"needs role {role}, not one of yours"))
        elif strict and bucket is not None and prio > bucket:
            verdict = _v(n, prio, "outside_bucket", f"P{prio} waits while P{bucket} work is open")
            verdict.blocking = blockers
            verdicts.append(verdict)
        elif not any(v.verdict == "next" for v in verdicts):
            verdicts.append(_v(n, prio, "next", f"{task_id.split(':')[0]} task you would get now"))
        else:
            ahead = next(v.issue for v in verdicts if v.verdict == "next")
            verdict = _v(n, prio, "queued", f"claimable, behind #{ahead} and the tasks above")
            verdict.blocking = [Blocker(issue=ahead, url="")]
            verdicts.append(verdict)
    for lease in sorted(leases, key=lambda lease: lease.issue):
        if lease.issue not in listed:
            until = iso_from_ms(lease.expires_ms)
            detail = f"{lease.task_type} held by {lease.agent_id} until {until}"
            verdicts.append(_v(lease.issue, work.get(lease.issue), "held", detail))
            listed.add(lease.issue)
    for n, reason in sorted(skipped.items()):
        if n not in listed:
            verdicts.append(_v(n, work.get(n), "skipped", f"{reason.code}: {reason.reason}"))
            listed.add(n)
    for n, review in sorted(reviews.items()):
        if n not in listed:
            verdicts.append(_v(n, work.get(n), "waiting", f"{review.step}: {review.detail}"))
            listed.add(n)
    rest = [n for n in sorted(work) if n not in listed]
    for issue in await rstore.get_issues(rest):
        labels = ", ".join(issue.labels)
        detail = f"no claimable task for it now ({labels})"
        verdicts.append(_v(issue.number, work.get(issue.number), "waiting", detail))
    urls = {i.number: i.html_url for i in await rstore.get_issues(sorted(listed | set(rest)))}
    for verdict in verdicts:
        verdict.url = urls.get(verdict.issue, "")
        for blocker in verdict.blocking:
            blocker.url = blocker.url or urls.get(blocker.issue, "")
    return verdicts


def _v(n: int, priority: int | None, verdict: str, detail: str) -> Verdict:
    return Verdict(issue=n, priority=priority, verdict=verdict, detail=detail)


async def _bucket_blockers(
    rstore: RepoStore, work: dict[int, int], bucket: int | None
) -> list[Blocker]:
    """The open work issues at the bucket's priority: what everything below it waits for."""
    if bucket is None:
        return []
    numbers = sorted(n for n, p in work.items() if p == bucket)[:MAX_BLOCKERS]
    issues: list[Issue] = await rstore.get_issues(numbers)
    return [Blocker(issue=i.number, url=i.html_url) for i in issues]
