"""One snapshot of everything maintainers look at: read by the dashboard and `status`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from github_broker.clock import ms_from_iso, now_ms
from github_broker.models import (
    AgentPause,
    AuditEntry,
    Event,
    Issue,
    LeaseInfo,
    Quota,
    SkipReason,
    Waiting,
    priority_of_score,
)
from github_broker.reports.explain import Verdict, explain, no_task_detail
from github_broker.reports.health import RepoHealth, health, repo_health
from github_broker.reports.status import (
    BlockedIssue,
    OverlappingPR,
    blocked_issues,
    overlapping,
    waiting_reviews,
)
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: Queue rows shown with titles per repository; the rest are only counted.
QUEUE_SHOWN = 50
#: Skipped issues shown with titles per repository; the rest are only counted.
SKIPPED_SHOWN = 100
#: Timeline entries shown.
TIMELINE_SHOWN = 50
#: Audit entries shown.
AUDIT_SHOWN = 30


@dataclass
class IssueRef:
    number: int
    title: str
    url: str
    #: Its place in the dependency graph, shown on its row: blocker, sub-issue progress.
    graph: str = ""


@dataclass
class LeaseRow:
    issue: IssueRef
    task_type: str
    agent: str
    claimed_ms: int
    #: When the agent last renewed the lease; None while it has not yet.
    heartbeat_ms: int | None
    expires_ms: int
    #: in_progress | idle (stalled) | waiting_for_user (a budget reached)
    state: str = "in_progress"
    heartbeats: int = 0
    #: The last progress (push, PR, review reply, a new note) and when; "" / None: none yet.
    progress: str = ""
    progress_ms: int | None = None
    #: The agent's own progress note.
    note: str = ""
    #: Evidence of a stall, when flagged.
    stalled: str = ""


@dataclass
class WaitingRow:
    """Work that waits on a person, with its age."""

    issue: IssueRef
    code: str
    since_ms: int
    detail: str


@dataclass
class QueueRow:
    issue: IssueRef
    task_id: str
    priority: int
    role: str
    #: Claimable by priority, but the strict bucket holds it back.
    blocked: bool


@dataclass
class Blocker:
    """An open issue of the bucket's priority: it keeps lower priorities waiting."""

    issue: IssueRef
    state: str


@dataclass
class SkippedRow:
    issue: IssueRef
    code: str
    reason: str


@dataclass
class BlockedRow:
    """An issue a blocker keeps from being handed out (docs/dependencies.md)."""

    issue: IssueRef
    blocker: str
    state: str
    detail: str


@dataclass
class ReviewRow:
    issue: IssueRef
    pr: int | None
    pr_url: str
    #: When the review is offered (PR linked + review.delay_s); None if not known yet.
    due_ms: int | None
    #: The review loop's step (status.WaitingReview.step) and what it means.
    step: str
    state: str
    fix_rounds: int
    #: The PR's checks in words (running, failed, conflict, green), "" while not read.
    checks: str = ""
    #: Fix and rebase rounds from checks and conflicts so far.
    check_rounds: int = 0


@dataclass
class RepoOverview:
    repository: str
    strict: bool
    bucket: int | None
    blockers: list[Blocker]
    leases: list[LeaseRow]
    queue: list[QueueRow]
    queue_total: int
    #: Per priority: (claimable now, held back by the strict bucket).
    queue_counts: dict[int, tuple[int, int]]
    skipped: list[SkippedRow]
    skipped_total: int
    reviews: list[ReviewRow]
    write_queue: dict[str, int | None]
    streaks: dict[str, int]
    last_sync_ms: int | None
    last_full_sync_ms: int | None
    #: Work that waits on a person (out of the strict bucket unless bucket_holds_for_people).
    waiting: list[WaitingRow] = field(default_factory=list)
    #: The repository's maintenance pause (its own or the broker's), if any.
    paused: dict[str, Any] | None = None
    health: RepoHealth | None = None
    #: Open agent PRs changing the same files, with a suggested merge order.
    overlaps: list[OverlappingPR] = field(default_factory=list)
    #: Issues a blocker keeps waiting (open, unreadable, not planned, on a cycle).
    blocked: list[BlockedRow] = field(default_factory=list)


@dataclass
class Overview:
    now_ms: int
    leader: str | None
    quota: Quota | None
    repositories: list[RepoOverview]
    timeline: list[Event] = field(default_factory=list)
    #: Paused agents: by a maintainer (pause, stop) or by the circuit breaker.
    paused_agents: dict[str, AgentPause] = field(default_factory=dict)
    broker_paused: dict[str, Any] | None = None
    #: What is wrong with the integrations, each with what to do (the dashboard's warning).
    problems: list[str] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)


def _ref(rstore: RepoStore, issues: dict[int, Issue], n: int) -> IssueRef:
    issue = issues.get(n)
    url = issue.html_url if issue and issue.html_url else ""
    return IssueRef(n, issue.title if issue else "(not mirrored)", url)


def _secs_ms(value: str | None) -> int | None:
    return int(float(value) * 1000) if value else None


async def repo_overview(rstore: RepoStore, settings: Settings) -> RepoOverview:
    strict = settings.priority_mode == "strict"
    work = await rstore.work_priorities()
    bucket = min(work.values()) if work else None
    pinning = sorted(n for n, p in work.items() if p == bucket)
    leases = await rstore.leases()
    held = {lease.issue: lease for lease in leases}
    ready = sorted(await rstore.ready_tasks(), key=lambda kv: (kv[1], kv[0]))
    tasks = await rstore.task_index()
    skipped = await rstore.skipped()
    reviewing = await rstore.reviewing()
    counts, rows = _queue(ready, tasks, bucket if strict else None)
    skipped_shown = sorted(skipped)[:SKIPPED_SHOWN]
    waiting = await rstore.waiting()
    wanted = {n for _, n, *_ in rows} | set(held) | set(pinning) | set(skipped_shown)
    wanted |= set(reviewing) | set(waiting)
    issues = {i.number: i for i in await rstore.get_issues(sorted(wanted))}
    ready_ids = {t for t, _ in ready}
    ref = partial(_ref, rstore, issues)
    states = {n: _blocker_state(n, held, ready_ids, skipped, set(reviewing)) for n in pinning}
    view = RepoOverview(
        repository=rstore.repository,
        strict=strict,
        bucket=bucket,
        blockers=[
            Blocker(ref(n), states[n] or await _no_task(rstore, settings, issues.get(n)))
            for n in pinning
        ],
        leases=[_lease_row(rstore, issues, lease, settings) for lease in leases],
        queue=_queue_rows(ref, rows),
        queue_total=len(ready),
        queue_counts=dict(sorted(counts.items())),
        skipped=[SkippedRow(ref(n), skipped[n].code, skipped[n].reason) for n in skipped_shown],
        skipped_total=len(skipped),
        reviews=await _reviews(rstore, issues, dict(ready), leases, settings),
        waiting=_waiting_rows(ref, waiting),
        **await _repo_state(rstore, settings),
    )
    await _add_graph(rstore, view, issues)
    return view


async def _repo_state(rstore: RepoStore, settings: Settings) -> dict[str, Any]:
    """What the overview shows of the repository beside its issues: the writes owed, the
    agents' streaks, the last syncs, a pause, the integrations' health, overlapping PRs."""
    state = await rstore.sync_state()
    return {
        "write_queue": await rstore.write_queue(),
        "streaks": await rstore.agent_streaks(),
        "last_sync_ms": _secs_ms(state.get("synced_at")),
        "last_full_sync_ms": _secs_ms(state.get("full_at")),
        "paused": await rstore.repo_pause(),
        "health": await repo_health(rstore, settings),
        "overlaps": overlapping(await rstore.checks_records()),
    }


def _queue_rows(
    ref: Callable[[int], IssueRef], rows: list[tuple[str, int, int, str, bool]]
) -> list[QueueRow]:
    return [
        QueueRow(ref(n), task_id, prio, role, blocked) for task_id, n, prio, role, blocked in rows
    ]


def _waiting_rows(ref: Callable[[int], IssueRef], waiting: dict[int, Waiting]) -> list[WaitingRow]:
    """The issues waiting on a person, longest-waiting first."""
    return [
        WaitingRow(ref(n), w.code, w.since_ms, w.detail)
        for n, w in sorted(waiting.items(), key=lambda kv: kv[1].since_ms)
    ]


async def _add_graph(rstore: RepoStore, view: RepoOverview, issues: dict[int, Issue]) -> None:
    """The issues a blocker keeps waiting, and on every row the issue's place in the graph."""
    found = await blocked_issues(rstore)
    missing = [b.issue for b in found if b.issue not in issues]
    issues.update({i.number: i for i in await rstore.get_issues(missing)})
    view.blocked = [
        BlockedRow(_ref(rstore, issues, b.issue), b.blocker, b.state, b.detail) for b in found
    ]
    _graph_notes(view, issues, {b.issue: b for b in found})


def _graph_notes(
    view: RepoOverview, issues: dict[int, Issue], blocked: dict[int, BlockedIssue]
) -> None:
    """Each row's issue with its blocker and its sub-issues' progress."""
    rows: list[Any] = [
        *view.leases,
        *view.queue,
        *view.skipped,
        *view.reviews,
        *view.waiting,
        *view.blocked,
    ]
    for row in rows:
        n = row.issue.number
        parts = []
        if n in blocked:
            parts.append(f"blocked by {blocked[n].blocker} ({blocked[n].state})")
        issue = issues.get(n)
        if issue is not None and issue.sub_issues:
            parts.append(f"sub-issues {issue.sub_issues_done}/{issue.sub_issues} closed")
        if issue is not None and issue.parent:
            parts.append(f"sub-issue of {issue.parent}")
        row.issue.graph = "; ".join(parts)


def _queue(
    ready: list[tuple[str, float]], tasks: dict[str, tuple[float, str, str]], bucket: int | None
) -> tuple[dict[int, tuple[int, int]], list[tuple[str, int, int, str, bool]]]:
    """The ready tasks, most urgent first: per priority (claimable now, held back by the
    strict `bucket`), and the first QUEUE_SHOWN as rows (task id, issue, priority, role,
    held back)."""
    counts: dict[int, tuple[int, int]] = {}
    rows: list[tuple[str, int, int, str, bool]] = []
    for task_id, score in ready:
        prio = priority_of_score(score)
        blocked = bucket is not None and prio > bucket
        now, later = counts.get(prio, (0, 0))
        counts[prio] = (now, later + 1) if blocked else (now + 1, later)
        if len(rows) < QUEUE_SHOWN:
            role = tasks.get(task_id, (0.0, "", ""))[1]
            rows.append((task_id, int(task_id.split(":")[1]), prio, role, blocked))
    return counts, rows


def _lease_row(
    rstore: RepoStore, issues: dict[int, Issue], lease: LeaseInfo, settings: Settings
) -> LeaseRow:
    # A heartbeat sets the expiry to now + the lease TTL, so the expiry tells when it came.
    renewed = lease.expires_ms - settings.leases.lease_ttl_s * 1000
    return LeaseRow(
        issue=_ref(rstore, issues, lease.issue),
        task_type=lease.task_type,
        agent=lease.agent_id,
        claimed_ms=lease.claimed_ms,
        heartbeat_ms=renewed if renewed > lease.claimed_ms else None,
        expires_ms=lease.expires_ms,
        state=lease.state.value,
        heartbeats=lease.beats,
        progress=lease.progress,
        progress_ms=lease.progress_ms,
        note=lease.note,
        stalled=lease.stalled,
    )


def _blocker_state(
    n: int,
    held: dict[int, LeaseInfo],
    ready_ids: set[str],
    skipped: dict[int, SkipReason],
    reviewing: set[int],
) -> str:
    """What a bucket blocker is doing; "" when it has no task, lease, review or skip."""
    if n in held:
        return f"{held[n].task_type} held by {held[n].agent_id}"
    kinds = sorted(t.split(":")[0] for t in ready_ids if t.endswith(f":{n}"))
    if kinds:
        return f"ready ({' and '.join(kinds)} task{'s' if len(kinds) > 1 else ''})"
    if n in reviewing:
        return "waiting for review"
    if n in skipped:
        return f"skipped: {skipped[n].code}"
    return ""


async def _no_task(rstore: RepoStore, settings: Settings, issue: Issue | None) -> str:
    if issue is None:
        return "not mirrored yet: the broker's next sync pass reads it"
    return await no_task_detail(rstore, settings, issue)


async def _reviews(
    rstore: RepoStore,
    issues: dict[int, Issue],
    ready: dict[str, float],
    leases: list[LeaseInfo],
    settings: Settings,
) -> list[ReviewRow]:
    rows = []
    for n, review in (await waiting_reviews(rstore, settings, ready, leases)).items():
        rows.append(
            ReviewRow(
                issue=_ref(rstore, issues, n),
                pr=review.pr,
                pr_url=review.pr_url,
                due_ms=ms_from_iso(review.due_at) if review.due_at else None,
                step=review.step,
                state=review.detail,
                fix_rounds=review.fix_rounds,
                checks=review.checks,
                check_rounds=review.check_rounds,
            )
        )
    return rows


async def overview(
    store: Store, settings: Settings, only: Collection[str] | None = None, by: str = ""
) -> Overview:
    """The whole deployment, or (`only`) a maintainer's repositories: their rows, events and
    audit entries (with the deployment's entries `by` them), and the paused agents that hold
    a task there or were paused by them."""
    shown = [r for n, r in store.repos.items() if only is None or n in only]
    repositories = [await repo_overview(r, settings) for r in shown]
    deployment = await health(store, settings, only)
    paused = await store.paused_agents()
    if only is not None:
        holders = {lease.agent for r in repositories for lease in r.leases}
        paused = {a: p for a, p in paused.items() if a in holders or p.by == by}
    return Overview(
        now_ms=now_ms(),
        leader=await store.leader_id(),
        quota=await store.quota(),
        repositories=repositories,
        timeline=await store.timeline(TIMELINE_SHOWN, only),
        paused_agents=paused,
        broker_paused=await store.broker_pause(),
        problems=deployment.problems,
        audit=await store.audit_log(AUDIT_SHOWN, repositories=only, also_by=by or None),
    )


@dataclass
class Explained:
    """One repository's verdicts for an agent, with what names the bucket's blockers."""

    repository: str
    bucket: int | None
    blockers: list[Blocker]
    verdicts: list[Verdict]
    titles: dict[int, str]


async def explained(
    store: Store,
    settings: Settings,
    roles: list[str] | None,
    repository: str | None = None,
    agent_id: str | None = None,
) -> list[Explained]:
    """`explain` per repository (in the claim's order) with titles and the bucket's blockers."""
    verdicts_by_repo = await explain(
        store,
        settings,
        agent_id=agent_id,
        roles=roles,
        repositories=[repository] if repository else None,
    )
    out = []
    for name, verdicts in verdicts_by_repo.items():
        rstore = store.repo(name)
        numbers = sorted({v.issue for v in verdicts})
        issues = {i.number: i for i in await rstore.get_issues(numbers)}
        work = await rstore.work_priorities()
        bucket = min(work.values()) if work else None
        states = {v.issue: v for v in verdicts}
        blockers = [
            Blocker(_ref(rstore, issues, n), states[n].verdict if n in states else "open")
            for n in sorted(n for n, p in work.items() if p == bucket)
        ]
        titles = {n: i.title for n, i in issues.items()}
        out.append(Explained(name, bucket, blockers, verdicts, titles))
    return out
