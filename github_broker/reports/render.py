"""Plain-text `status` and `explain` for the terminal: aligned tables, summaries first."""

from __future__ import annotations

import unicodedata
from collections import Counter

from github_broker.clock import age
from github_broker.reports.explain import Verdict
from github_broker.reports.overview import Explained, IssueRef, Overview, RepoOverview

#: Widest title shown in a table cell (terminal columns).
TITLE_WIDTH = 48
#: Rows shown per table or verdict group unless asked for all.
ROWS_SHOWN = 15
#: Verdicts in the order `explain` lists their groups.
VERDICT_ORDER = [
    "next",
    "queued",
    "held",
    "outside_bucket",
    "role",
    "cooldown",
    "review_author",
    "paused",
    "repo_paused",
    "out_of_service",
    "blocked",
    "waiting_on_person",
    "skipped",
    "waiting",
]


def width(text: str) -> int:
    """Terminal columns `text` takes: wide and full-width characters (CJK) take two,
    combining marks none."""
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


def clip(text: str, columns: int = TITLE_WIDTH) -> str:
    """`text` cut to at most `columns` terminal columns, with "…" when cut."""
    if width(text) <= columns:
        return text
    out, used = [], 1  # the ellipsis
    for c in text:
        used += width(c)
        if used > columns:
            break
        out.append(c)
    return "".join(out) + "…"


def table(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell in terminal columns; the last is not padded."""
    widths = [max(width(r[i]) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: list[str]) -> str:
        padded = [c + " " * (w - width(c)) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        return (indent + "  ".join([*padded, cells[-1]])).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def _title(ref: IssueRef) -> str:
    return clip(ref.title)


def _more(shown: int, total: int, what: str) -> list[str]:
    return [f"  … and {total - shown} more {what}"] if total > shown else []


def status_text(o: Overview, rows: int = ROWS_SHOWN) -> str:
    """`github-broker status`: per repository its bucket, leases, queue, reviews, skips."""
    quota = o.quota
    quota_text = (
        f"{quota.remaining}/{quota.limit}"
        if quota and quota.remaining is not None
        else "not seen yet"
    )
    out = [f"Poller leader: {o.leader or 'none'}    GitHub quota: {quota_text}"]
    if o.broker_paused:
        out.append(f"BROKER PAUSED by {o.broker_paused.get('by')}: nothing new is handed out")
    for problem in o.problems:
        out.append(f"! {problem}")
    if o.paused_agents:
        out.append("Paused agents:")
        out += table(
            ["AGENT", "BY", "KIND", "REASON"],
            [
                [agent, "circuit breaker" if p.kind == "breaker" else p.by, p.kind, p.reason]
                for agent, p in sorted(o.paused_agents.items())
            ],
        )
    for r in o.repositories:
        out += ["", *_repo_status(r, o.now_ms, rows)]
    return "\n".join(out)


def _repo_status(r: RepoOverview, now: int, rows: int) -> list[str]:
    out = []
    for section in (
        _headline,
        _blockers,
        _pause,
        _leases,
        _waiting,
        _blocked,
        _queue,
        _reviews,
        _skipped,
        _writes,
        _streaks,
    ):
        out += section(r, now, rows)
    return out


def _bucket(r: RepoOverview) -> str:
    return "none" if r.bucket is None else f"P{r.bucket}"


def _listed(
    title: str, header: list[str], cells: list[list[str]], total: int, noun: str
) -> list[str]:
    """A titled table of the rows shown, and how many more there are."""
    return [title, *table(header, cells), *_more(len(cells), total, noun)]


def _headline(r: RepoOverview, now: int, rows: int) -> list[str]:
    mode = "strict" if r.strict else "best effort"
    return [
        f"{r.repository}   bucket {_bucket(r)} ({mode})   last sync {age(r.last_sync_ms, now)}   "
        f"last full sync {age(r.last_full_sync_ms, now)}",
    ]


def _blockers(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.blockers:
        return []
    return _listed(
        f"Bucket {_bucket(r)} pinned by {len(r.blockers)} issue(s):",
        ["ISSUE", "TITLE", "STATE"],
        [[f"#{b.issue.number}", _title(b.issue), b.state] for b in r.blockers[:rows]],
        len(r.blockers),
        "issues",
    )


def _pause(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.paused:
        return []
    return [f"PAUSED by {r.paused.get('by')}: nothing new is handed out here"]


def _leases(r: RepoOverview, now: int, rows: int) -> list[str]:
    out = [f"Leases: {len(r.leases)}"]
    if not r.leases:
        return out
    out += table(
        ["ISSUE", "TITLE", "TASK", "AGENT", "STATE", "AGE", "PROGRESS", "EXPIRES"],
        [
            [
                f"#{lease.issue.number}",
                _title(lease.issue),
                lease.task_type,
                lease.agent,
                lease.state,
                age(lease.claimed_ms, now),
                f"{lease.progress} ({age(lease.progress_ms, now)})"
                if lease.progress_ms
                else f"none yet, {lease.heartbeats} heartbeats",
                age(lease.expires_ms, now),
            ]
            for lease in r.leases
        ],
    )
    for lease in r.leases:
        if lease.stalled:
            out.append(f"  #{lease.issue.number} stalled: {lease.stalled}")
    return out


def _waiting(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.waiting:
        return []
    return _listed(
        f"Waiting on a person: {len(r.waiting)}",
        ["ISSUE", "TITLE", "SINCE", "WHY"],
        [
            [f"#{w.issue.number}", _title(w.issue), age(w.since_ms, now), w.detail or w.code]
            for w in r.waiting[:rows]
        ],
        len(r.waiting),
        "issues",
    )


def _blocked(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.blocked:
        return []
    return _listed(
        f"Blocked: {len(r.blocked)}",
        ["ISSUE", "TITLE", "WHY"],
        [[f"#{b.issue.number}", _title(b.issue), b.detail] for b in r.blocked[:rows]],
        len(r.blocked),
        "blocked issues",
    )


def _queue(r: RepoOverview, now: int, rows: int) -> list[str]:
    claimable = sum(now_ for now_, _ in r.queue_counts.values())
    held_back = sum(later for _, later in r.queue_counts.values())
    counts = ", ".join(
        f"P{p} {a}" + (f" (+{b} held back)" if b else "") for p, (a, b) in r.queue_counts.items()
    )
    out = [
        f"Queue: {claimable} claimable now, {held_back} held back by the bucket"
        + (f"   [{counts}]" if counts else "")
    ]
    if not r.queue:
        return out
    shown = r.queue[:rows]
    out += table(
        ["ISSUE", "TITLE", "TASK", "PRIO", "ROLE", "STATE"],
        [
            [
                f"#{q.issue.number}",
                _title(q.issue),
                q.task_id.split(":")[0],
                f"P{q.priority}",
                q.role,
                f"waits for P{r.bucket}" if q.blocked else "claimable",
            ]
            for q in shown
        ],
    )
    return out + _more(len(shown), r.queue_total, "tasks")


def _reviews(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.reviews:
        return []
    out = [f"In review: {len(r.reviews)}"]
    out += table(
        ["ISSUE", "TITLE", "PR", "DUE", "STATE", "FIX ROUNDS"],
        [
            [
                f"#{v.issue.number}",
                _title(v.issue),
                f"#{v.pr}" if v.pr else "none",
                age(v.due_ms, now) if v.due_ms else "-",
                f"{v.step}: {v.state}",
                f"{v.fix_rounds} + {v.check_rounds} from checks"
                if v.check_rounds
                else str(v.fix_rounds),
            ]
            for v in r.reviews[:rows]
        ],
    )
    out += _more(min(rows, len(r.reviews)), len(r.reviews), "reviews")
    for ov in r.overlaps:
        order = " then ".join(f"#{pr}" for pr in ov.merge_order)
        others = ", ".join(f"#{pr}" for pr in ov.with_prs)
        out.append(
            f"  PR #{ov.pr} (#{ov.issue}) overlaps {others} on {', '.join(ov.files)}; "
            f"merge order: {order}"
        )
    return out


def _skipped(r: RepoOverview, now: int, rows: int) -> list[str]:
    out = [f"Skipped: {r.skipped_total}"]
    if not r.skipped:
        return out
    out += table(
        ["ISSUE", "TITLE", "REASON"],
        [[f"#{s.issue.number}", _title(s.issue), s.reason] for s in r.skipped[:rows]],
    )
    return out + _more(min(rows, len(r.skipped)), r.skipped_total, "skipped issues")


def _writes(r: RepoOverview, now: int, rows: int) -> list[str]:
    w = r.write_queue
    oldest = age(w["oldest_due_ms"], now) if w["oldest_due_ms"] else "-"
    return [
        f"GitHub writes: {w['pending']} pending (oldest due {oldest}), {w['refusing']} being "
        f"refused; so far {w['applied']} applied, {w['refused']} refused, {w['dropped']} dropped"
    ]


def _streaks(r: RepoOverview, now: int, rows: int) -> list[str]:
    if not r.streaks:
        return []
    return ["Failure streaks: " + ", ".join(f"{a} {n}" for a, n in sorted(r.streaks.items()))]


def merge_verdicts(verdicts: list[Verdict]) -> list[Verdict]:
    """One verdict per issue: an issue with several tasks keeps its first (most urgent)
    verdict and names the others in its detail."""
    merged: dict[int, Verdict] = {}
    for v in verdicts:
        first = merged.get(v.issue)
        if first is None:
            merged[v.issue] = v.model_copy()
        else:
            first.detail += f"; also {v.verdict}: {v.detail}"
    return list(merged.values())


def _blocker_names(e: Explained, limit: int = 5) -> str:
    names = ", ".join(f"#{b.issue.number}" for b in e.blockers[:limit])
    extra = len(e.blockers) - limit
    return names + (f" and {extra} more" if extra > 0 else "")


def explain_text(
    explained: list[Explained], issue: int | None = None, rows: int | None = ROWS_SHOWN
) -> str:
    """`github-broker explain`: a summary first, then each group of verdicts."""
    out: list[str] = []
    for e in explained:
        verdicts = merge_verdicts(e.verdicts)
        if issue is not None:
            verdicts = [v for v in verdicts if v.issue == issue]
            if not verdicts:
                out.append(f"{e.repository}: #{issue} is not an open work issue here")
                continue
        if out:
            out.append("")
        out += _explain_repo(e, verdicts, rows if issue is None else None)
    return "\n".join(out)


def _explain_repo(e: Explained, verdicts: list[Verdict], rows: int | None) -> list[str]:
    counts = Counter(v.verdict for v in verdicts)
    nxt = next((v for v in verdicts if v.verdict == "next"), None)
    bucket = "none" if e.bucket is None else f"P{e.bucket}"
    out = [f"{e.repository}: {len(verdicts)} issue(s)"]
    out.append(
        "  " + ", ".join(f"{counts[k]} {k.replace('_', ' ')}" for k in VERDICT_ORDER if counts[k])
    )
    if nxt is not None:
        out.append(f"  Next: #{nxt.issue} {e.titles.get(nxt.issue, '')} ({nxt.detail})")
    else:
        out.append("  Next: nothing claimable for these roles now")
    if e.bucket is not None:
        out.append(f"  Bucket {bucket} pinned by {_blocker_names(e)}")
    for kind in VERDICT_ORDER:
        group = [v for v in verdicts if v.verdict == kind]
        if not group:
            continue
        shown = group if rows is None else group[:rows]
        out.append(f"{kind.replace('_', ' ').capitalize()} ({len(group)}):")
        out += table(
            ["ISSUE", "PRIO", "TITLE", "WHY"],
            [
                [
                    f"#{v.issue}",
                    "-" if v.priority is None else f"P{v.priority}",
                    clip(e.titles.get(v.issue, "")),
                    _why(e, v),
                ]
                for v in shown
            ],
        )
        if len(shown) < len(group):
            out.append(f"  … and {len(group) - len(shown)} more (--all lists them)")
    return out


def _why(e: Explained, v: Verdict) -> str:
    if v.verdict == "outside_bucket" and e.blockers:
        return f"{v.detail}: blocked by {_blocker_names(e)}"
    return v.detail
