"""Trends over the last hour or day, from the repositories' history (store/history.py):
throughput, the queue by priority, how long work waits for an agent and for its PR, and
each agent's success rate and mean task time. Summed over every repository."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from github_broker.clock import now_ms as clock_now_ms
from github_broker.store import Store
from github_broker.store.history import DURATION_BOUNDS_S, HOUR_MS, MINUTE_MS

#: The time ranges a maintainer can pick: name -> (buckets, minutes per bucket).
RANGES: dict[str, tuple[int, int]] = {"1h": (12, 5), "24h": (24, 60)}
DEFAULT_RANGE = "1h"
#: Lease ends counted as failures of the agent, and as taken away from it.
FAILED = ("failed", "abandoned", "expired")
REVOKED = ("revoked", "issue_closed", "label_removed")
#: Agents shown, the busiest first.
AGENTS_SHOWN = 12


@dataclass
class Bucket:
    """Counts of one time bucket (start inclusive)."""

    start_ms: int
    handouts: dict[str, int] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    revoked: int = 0


@dataclass
class DepthPoint:
    """The queue at one point: ready tasks per priority and work waiting on a person
    (an hour's point: the mean of its samples); `sampled` False: no sample there."""

    at_ms: int
    sampled: bool
    ready: dict[int, float] = field(default_factory=dict)
    waiting: float = 0.0


@dataclass
class Duration:
    """A duration's count, quantiles and mean (seconds) over the range; None when empty.
    Quantiles are interpolated inside the history's buckets, as Prometheus does."""

    count: int
    p50_s: float | None
    p90_s: float | None
    mean_s: float | None


@dataclass
class AgentTrend:
    agent: str
    completed: int
    failed: int
    #: completed / (completed + failed)
    success: float
    #: Mean time of its completed tasks (seconds), None without any.
    mean_task_s: float | None


@dataclass
class Trends:
    range: str
    now_ms: int
    buckets: list[Bucket]
    depth: list[DepthPoint]
    #: Labelled (claimable) -> claimed, development tasks.
    to_claim: Duration
    #: Claimed -> completed with its PR open (needs-review), development tasks.
    to_pr: Duration
    agents: list[AgentTrend]

    @property
    def handouts(self) -> int:
        return sum(sum(b.handouts.values()) for b in self.buckets)

    @property
    def completed(self) -> int:
        return sum(b.completed for b in self.buckets)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.buckets)

    @property
    def priorities(self) -> list[int]:
        return sorted({p for point in self.depth for p in point.ready})


async def trends(store: Store, range_name: str = DEFAULT_RANGE, now: int | None = None) -> Trends:
    """The trends of `range_name` ("1h": twelve 5-minute buckets of minutes; "24h": 24 hours)
    up to `now`, summed over every repository; the queue's last point is read now."""
    now = clock_now_ms() if now is None else now
    count, minutes_each = RANGES[range_name]
    unit_ms = minutes_each * MINUTE_MS
    last = now // unit_ms
    slots = await _slots(store, range_name, last - count + 1, last)
    sampled = await store.samples.minutes(
        (last - count + 1) * minutes_each, (last + 1) * minutes_each - 1
    )
    buckets: list[Bucket] = []
    window: Counter[str] = Counter()
    for i, counts in enumerate(_group(slots, minutes_each if range_name == "1h" else 1)):
        start = (last - count + 1 + i) * unit_ms
        buckets.append(_bucket(start, counts))
        window.update(counts)
    depth = _depth(slots, sampled, last - count + 1, minutes_each, range_name)
    depth.append(await _depth_now(store, now))
    return Trends(
        range=range_name,
        now_ms=now,
        buckets=buckets,
        depth=depth,
        to_claim=duration(window, "wait"),
        to_pr=duration(window, "pr"),
        agents=agent_trends(window),
    )


async def _slots(store: Store, range_name: str, first: int, last: int) -> list[Counter[str]]:
    """Per slot (a minute for 1h, an hour for 24h), every repository's counts summed."""
    if range_name == "1h":
        minutes_each = RANGES[range_name][1]
        lo, hi = first * minutes_each, (last + 1) * minutes_each - 1
    else:
        lo, hi = first, last
    slots = [Counter[str]() for _ in range(hi - lo + 1)]
    for rstore in store.repos.values():
        read = rstore.history_minutes if range_name == "1h" else rstore.history_hours
        for slot, counts in zip(slots, await read(lo, hi), strict=True):
            slot.update(counts)
    return slots


def _group(slots: list[Counter[str]], size: int) -> list[Counter[str]]:
    out = []
    for i in range(0, len(slots), size):
        total: Counter[str] = Counter()
        for slot in slots[i : i + size]:
            total.update(slot)
        out.append(total)
    return out


def _bucket(start_ms: int, counts: Counter[str]) -> Bucket:
    return Bucket(
        start_ms=start_ms,
        handouts={k[6:]: v for k, v in sorted(counts.items()) if k.startswith("claim:")},
        completed=counts["ev:completed"],
        failed=sum(counts[f"ev:{k}"] for k in FAILED),
        revoked=sum(counts[f"ev:{k}"] for k in REVOKED),
    )


def _depth(
    slots: list[Counter[str]], sampled: set[int], first: int, minutes_each: int, range_name: str
) -> list[DepthPoint]:
    """Per minute (1h) or hour (24h): the queue sample, or the mean of the hour's samples."""
    out = []
    for i, counts in enumerate(slots):
        if range_name == "1h":
            minute = first * minutes_each + i
            start, n = minute * MINUTE_MS, int(minute in sampled)
        else:
            hour = first + i
            start = hour * HOUR_MS
            n = sum(1 for m in sampled if m * MINUTE_MS // HOUR_MS == hour)
        ready = {int(k[3:]): v / n for k, v in counts.items() if k.startswith("q:P") and n}
        out.append(DepthPoint(start, n > 0, ready, counts["waiting"] / n if n else 0.0))
    return out


async def _depth_now(store: Store, now: int) -> DepthPoint:
    point = DepthPoint(now, True)
    for rstore in store.repos.values():
        ready, waiting = await rstore.queue_sample()
        for p, n in ready.items():
            point.ready[p] = point.ready.get(p, 0) + n
        point.waiting += waiting
    return point


def duration(counts: Counter[str], name: str) -> Duration:
    """The `name` histogram's (wait, pr) count, p50, p90 and mean from its bucket fields."""
    per_bucket = [counts[f"{name}:{le}"] for le in DURATION_BOUNDS_S] + [counts[f"{name}:+Inf"]]
    total = sum(per_bucket)
    if not total:
        return Duration(0, None, None, None)
    return Duration(
        count=total,
        p50_s=quantile(0.5, per_bucket),
        p90_s=quantile(0.9, per_bucket),
        mean_s=counts[f"{name}:ms"] / total / 1000,
    )


def quantile(q: float, per_bucket: list[int]) -> float:
    """Prometheus's `histogram_quantile` over the history's buckets: linear inside the
    bucket that holds the q-th observation; the last finite bound for the +Inf bucket."""
    rank = q * sum(per_bucket)
    seen = 0
    lower = 0.0
    for upper, n in zip(DURATION_BOUNDS_S, per_bucket, strict=False):
        if n and seen + n >= rank:
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        lower = float(upper)
    return float(DURATION_BOUNDS_S[-1])


def agent_trends(counts: Counter[str]) -> list[AgentTrend]:
    """Each agent that ended a lease in the range, the busiest first (AGENTS_SHOWN)."""
    agents = {k[2:].rsplit(":", 1)[0] for k in counts if k.startswith("a:")}
    out = []
    for agent in agents:
        ok, bad = counts[f"a:{agent}:ok"], counts[f"a:{agent}:fail"]
        if not ok + bad:
            continue
        mean = counts[f"a:{agent}:ms"] / ok / 1000 if ok else None
        out.append(AgentTrend(agent, ok, bad, ok / (ok + bad), mean))
    out.sort(key=lambda a: (-(a.completed + a.failed), a.agent))
    return out[:AGENTS_SHOWN]
