"""The dashboard's trend charts, drawn from `reports/trends.py`: throughput, the queue,
waiting times, agents."""

from __future__ import annotations

import time

from markupsafe import Markup

from github_broker.clock import span
from github_broker.reports.trends import Duration, Trends
from github_broker.ui.charts import PALETTE, Row, Series, bar_chart, hbar_chart, line_chart

#: What each range's buckets are called in words.
RANGE_WORDS = {"1h": ("the last hour", "5 minutes"), "24h": ("the last 24 hours", "hour")}


def _hhmm(ms: int) -> str:
    return time.strftime("%H:%M", time.gmtime(ms // 1000))


def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return "<1s" if s < 1 else span(round(s))


def throughput(t: Trends) -> Markup:
    words, each = RANGE_WORDS[t.range]
    labels = [_hhmm(b.start_ms) for b in t.buckets]
    by_type = {
        k: sum(b.handouts.get(k, 0) for b in t.buckets) for k in ("development", "review", "fix")
    }
    types = ", ".join(f"{n} {k}" for k, n in by_type.items() if n) or "none"
    series = [
        Series("hand-outs", "handouts", [sum(b.handouts.values()) for b in t.buckets], PALETTE[0]),
        Series("completions", "completed", [b.completed for b in t.buckets], PALETTE[1]),
        Series("failures", "failed", [b.failed for b in t.buckets], PALETTE[2]),
    ]
    desc = (
        f"Per {each} over {words} (UTC): {t.handouts} hand-outs ({types}), {t.completed} "
        f"completions, {t.failed} failures (failed, abandoned, expired)."
    )
    return bar_chart(
        "chart-throughput",
        "Throughput",
        desc,
        labels,
        series,
        handouts=t.handouts,
        completed=t.completed,
        failed=t.failed,
    )


def queue(t: Trends) -> Markup:
    words, _ = RANGE_WORDS[t.range]
    labels = [_hhmm(p.at_ms) for p in t.depth[:-1]] + ["now"]
    series = [
        Series(
            f"P{p} ready",
            f"P{p}",
            [p_.ready.get(p, 0) if p_.sampled else None for p_ in t.depth],
            PALETTE[i % len(PALETTE)],
        )
        for i, p in enumerate(t.priorities)
    ]
    series.append(
        Series(
            "waiting on a person",
            "waiting",
            [p.waiting if p.sampled else None for p in t.depth],
            PALETTE[-1],
            dashed=True,
        )
    )
    now = t.depth[-1]
    ready_now = ", ".join(f"P{p} {n:.0f}" for p, n in sorted(now.ready.items())) or "none"
    sampled = "each minute" if t.range == "1h" else "hourly means of the minute samples"
    desc = (
        f"Ready tasks per priority and work waiting on a person over {words} ({sampled}); "
        f"now: {ready_now} ready, {now.waiting:.0f} waiting on a person."
    )
    return line_chart(
        "chart-queue",
        "Queue by priority",
        desc,
        labels,
        series,
        **{"ready-now": int(sum(now.ready.values())), "waiting-now": int(now.waiting)},
    )


def _duration_rows(name: str, d: Duration, color: str) -> list[Row]:
    mean = f" (mean {_seconds(d.mean_s)})" if d.count else ""
    return [
        Row(f"{name} median", d.p50_s or 0, _seconds(d.p50_s) + mean, color),
        Row(f"{name} p90", d.p90_s or 0, _seconds(d.p90_s), color),
    ]


def waits(t: Trends) -> Markup:
    words, _ = RANGE_WORDS[t.range]
    rows = _duration_rows("labelled → claimed", t.to_claim, PALETTE[0])
    rows += _duration_rows("claimed → PR", t.to_pr, PALETTE[4])
    top = max((r.value for r in rows), default=0)
    desc = (
        f"Development tasks over {words}: labelled → claimed median {_seconds(t.to_claim.p50_s)}"
        f", p90 {_seconds(t.to_claim.p90_s)} ({t.to_claim.count} hand-outs); claimed → PR "
        f"median {_seconds(t.to_pr.p50_s)}, p90 {_seconds(t.to_pr.p90_s)} ({t.to_pr.count} "
        "completed with their PR open)."
    )
    return hbar_chart(
        "chart-waits",
        "Time to claim and to PR",
        desc,
        rows,
        top,
        **{"to-claim-count": t.to_claim.count, "to-pr-count": t.to_pr.count},
    )


def agents(t: Trends) -> Markup:
    words, _ = RANGE_WORDS[t.range]
    rows = [
        Row(
            a.agent,
            a.success,
            f"{a.success:.0%} of {a.completed + a.failed} · mean {_seconds(a.mean_task_s)}",
            PALETTE[1] if a.success >= 0.5 else PALETTE[2],
        )
        for a in t.agents
    ]
    if rows:
        desc = (
            f"Success rate (completed of completed and failed) and mean task time over {words}: "
            + "; ".join(f"{r.label} {r.text}" for r in rows)
        )
    else:
        desc = f"No agent finished a task over {words}."
    return hbar_chart(
        "chart-agents",
        "Agents: success rate and mean task time",
        desc,
        rows,
        1.0,
        agents=len(rows),
        completed=sum(a.completed for a in t.agents),
    )


def charts(t: Trends) -> list[Markup]:
    """Every trend chart of the dashboard, in the order shown."""
    return [throughput(t), queue(t), waits(t), agents(t)]
