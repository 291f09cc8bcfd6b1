"""Prometheus metrics: counters and histograms of every process, gauges read from Redis.

`serve` runs prometheus-client in multiprocess mode (`PROMETHEUS_MULTIPROC_DIR`, set by
`processes/serve.py` before anything imports this module): each worker writes its values
to files there and whichever worker answers `/metrics` adds them all up. Queue
sizes, leases, write-queue lag and the GitHub quota are read from Redis at scrape time, so
they are the same whichever process answers.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector

from github_broker.clock import now_ms
from github_broker.models import priority_of_score
from github_broker.store.history import DURATION_BOUNDS_S

if TYPE_CHECKING:
    from github_broker.store import Store

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Upper bounds (seconds) of the latency histograms; request-task includes long-poll waits.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
GITHUB_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
LAG_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

#: Outcomes of a lease's end, as the timeline names them.
LEASE_END_OUTCOMES = frozenset(
    {"completed", "failed", "abandoned", "expired", "revoked", "issue_closed", "label_removed"}
)

#: Instruments fed outside the HTTP layer (gateway, write queue): one set per process.
PROCESS_REGISTRY = CollectorRegistry(auto_describe=True)
GITHUB_SECONDS = Histogram(
    "gb_github_request_seconds",
    "GitHub REST calls by method, route and status (error: no answer).",
    ["method", "route", "status"],
    buckets=GITHUB_BUCKETS,
    registry=PROCESS_REGISTRY,
)
WRITE_LAG_SECONDS = Histogram(
    "gb_github_write_lag_seconds",
    "Seconds from a queued GitHub write being due to it being applied.",
    buckets=LAG_BUCKETS,
    registry=PROCESS_REGISTRY,
)

#: GitHub paths whose numbers, names and refs become placeholders (bounded label values).
_ROUTE_PARTS = [
    (re.compile(r"^/repos/[^/]+/[^/]+"), "/repos/{owner}/{repo}"),
    # The gateway addresses a repository by id once it knows it (renames keep the id).
    (re.compile(r"^/repositories/\d+"), "/repos/{owner}/{repo}"),
    (re.compile(r"/git/(refs|ref|matching-refs)/.+$"), r"/git/\1/{ref}"),
    (re.compile(r"/labels/[^/]+$"), "/labels/{name}"),
    (re.compile(r"/branches/.+$"), "/branches/{branch}"),
    (re.compile(r"/\d+(?=/|$)"), "/{n}"),
    (re.compile(r"\?.*$"), ""),
]


def github_route(path: str) -> str:
    """`/repos/acme/widgets/issues/12/labels` -> `/repos/{owner}/{repo}/issues/{n}/labels`."""
    for pattern, replacement in _ROUTE_PARTS:
        path = pattern.sub(replacement, path)
    return path


def observe_github(method: str, path: str, status: str, started_s: float) -> None:
    """Record one GitHub call that started at `started_s` (time.perf_counter())."""
    GITHUB_SECONDS.labels(method, github_route(path), status).observe(
        time.perf_counter() - started_s
    )


def observe_write_lag(due_ms: int) -> None:
    WRITE_LAG_SECONDS.observe(max(0, now_ms() - due_ms) / 1000)


class _Counts:
    """`counts[label] += 1` on a labelled prometheus Counter (how the routes count)."""

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        #: label -> child: `labels()` looks it up under a lock, once per request otherwise.
        self._children: dict[str, Any] = {}

    def __getitem__(self, label: str) -> float:
        return 0.0

    def __setitem__(self, label: str, value: float) -> None:
        child = self._children.get(label)
        if child is None:
            child = self._children[label] = self.counter.labels(label)
        child.inc(value)


class Metrics:
    """The HTTP layer's instruments and the `/metrics` exposition of one app."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._task_requests = Counter(
            "gb_task_requests",
            "request-task answers, by result.",
            ["result"],
            registry=self.registry,
        )
        self._lease_refusals = Counter(
            "gb_lease_refusals", "409 answers, by reason.", ["reason"], registry=self.registry
        )
        self.request_task_seconds = Histogram(
            "gb_request_task_seconds",
            "request-task latency (long-poll waits included), by HTTP status.",
            ["status"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.task_requests = _Counts(self._task_requests)
        self.lease_refusals = _Counts(self._lease_refusals)
        self._request_task_by_status: dict[int, Any] = {}

    def observe_request_task(self, status: int, seconds: float) -> None:
        """One `/request-task` answer with this HTTP status took `seconds`."""
        child = self._request_task_by_status.get(status)
        if child is None:
            child = self.request_task_seconds.labels(str(status))
            self._request_task_by_status[status] = child
        child.observe(seconds)

    async def render(self, store: Store) -> str:
        gauges = await _deployment_gauges(store)
        registry = CollectorRegistry(auto_describe=False)
        if os.environ.get(MULTIPROC_ENV):
            # Every process's counters and histograms (prometheus-client is untyped).
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            pids = _multiprocess_pids(Path(os.environ[MULTIPROC_ENV]))
        else:
            registry.register(_Merged(self.registry, PROCESS_REGISTRY))
            pids = [os.getpid()]
        registry.register(_Processes(pids))
        PlatformCollector(registry=registry)
        registry.register(_Snapshot(gauges))
        return generate_latest(registry).decode()


def serve_process_metrics(host: str, port: int) -> None:
    """`poll --metrics-port`: this process's GitHub and write-queue histograms over HTTP
    (a daemon thread), for a poller that runs apart from any `serve`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(PROCESS_REGISTRY))
    registry.register(_Processes([os.getpid()]))
    PlatformCollector(registry=registry)
    start_http_server(port, addr=host, registry=registry)


class RequestTaskTimer:
    """Times every `/request-task` answer into the app's `request_task_seconds` (pure ASGI,
    wrapped around the hot path; see `github_broker.api.hotpath`)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        status = 500

        async def send_noting_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            services = getattr(scope["app"].state, "services", None)
            if services is not None:
                services.metrics.observe_request_task(status, time.perf_counter() - started)


class _Merged:
    def __init__(self, *registries: CollectorRegistry) -> None:
        self.registries = registries

    def collect(self) -> Iterator[Metric]:
        for registry in self.registries:
            yield from registry.collect()


class _Snapshot:
    """Gauges computed (asynchronously, from Redis) before the exposition is written."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class _Processes:
    """CPU, memory and file descriptors of each live broker process, labelled by pid."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for pid in self.pids:
            collector = ProcessCollector(pid=lambda p=pid: p, registry=None)  # type: ignore[misc]
            for family in collector.collect():
                into = merged.setdefault(
                    family.name, Metric(family.name, family.documentation, family.type)
                )
                for sample in family.samples:
                    into.add_sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value)
        yield from merged.values()


def _multiprocess_pids(path: Path) -> list[int]:
    pids = set()
    for file in path.glob("*.db"):
        tail = file.stem.rsplit("_", 1)[-1]
        if tail.isdigit() and Path(f"/proc/{tail}").exists():
            pids.add(int(tail))
    return sorted(pids)


async def _deployment_gauges(store: Store) -> list[Metric]:
    queue = _queue_families()
    health = _health_families()
    now = now_ms()
    for name, rstore in store.repos.items():
        await _add_health(health, name, rstore, now)
        await _add_queue(queue, health, name, rstore, now)
    return [
        *queue.values(),
        *health.values(),
        *await _deployment_wide(store),
        *await _history_families(store),
        *await _quota_family(store),
    ]


def _per_repo(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=["repository"])


def _queue_families() -> dict[str, GaugeMetricFamily]:
    """The work queue per repository: what is claimable, held, blocked, and the writes owed."""
    return {
        "ready": GaugeMetricFamily(
            "gb_ready_tasks",
            "Claimable tasks per repository and priority.",
            labels=["repository", "priority"],
        ),
        "leases": _per_repo("gb_leases", "Live leases."),
        "writes": _per_repo("gb_pending_github_writes", "Queued GitHub writes."),
        "lag": _per_repo(
            "gb_github_write_queue_lag_seconds",
            "How long the longest-waiting due GitHub write has waited.",
        ),
        "skipped": _per_repo("gb_skipped_issues", "Work issues that cannot be handed out."),
        "bucket": _per_repo("gb_priority_bucket", "Most urgent open priority (0 = P0)."),
        "blocked": _per_repo(
            "gb_blocked_issues",
            "Open issues a blocker keeps from being handed out (open, unreadable, not planned).",
        ),
    }


async def _add_queue(
    families: dict[str, GaugeMetricFamily],
    health: dict[str, GaugeMetricFamily],
    name: str,
    rstore: Any,
    now: int,
) -> None:
    per_priority: dict[int, int] = {}
    for _, score in await rstore.ready_tasks():
        p = priority_of_score(score)
        per_priority[p] = per_priority.get(p, 0) + 1
    for p, n in sorted(per_priority.items()):
        families["ready"].add_metric([name, f"P{p}"], n)
    held = await rstore.leases()
    families["leases"].add_metric([name], len(held))
    health["stalled"].add_metric([name], sum(1 for lease in held if lease.stalled))
    families["writes"].add_metric([name], await rstore.outbox_size())
    oldest = await rstore.outbox_oldest_due_ms()
    families["lag"].add_metric([name], 0 if oldest is None else max(0, now - oldest) / 1000)
    families["skipped"].add_metric([name], len(await rstore.skipped()))
    families["blocked"].add_metric([name], await rstore.blocked_count())
    current = await rstore.bucket()
    if current is not None:
        families["bucket"].add_metric([name], current)


async def _deployment_wide(store: Store) -> list[Metric]:
    """Gauges of the whole deployment: refused webhook deliveries, paused agents."""
    refused = await store.webhook_refused()
    refused_total = GaugeMetricFamily(
        "gb_webhook_deliveries_refused", "Webhook deliveries refused (bad signature, ...)."
    )
    refused_total.add_metric([], refused[2] if refused else 0)
    paused = GaugeMetricFamily("gb_paused_agents", "Agents paused (maintainer or breaker).")
    paused.add_metric([], len(await store.paused_agents()))
    return [refused_total, paused]


async def _quota_family(store: Store) -> list[Metric]:
    """GitHub's REST quota left, once a response has told it."""
    quota = await store.quota()
    if not quota or quota.remaining is None:
        return []
    remaining = GaugeMetricFamily("gb_github_quota_remaining", "GitHub REST calls left this hour.")
    remaining.add_metric([], quota.remaining)
    return [remaining]


#: Lease ends an agent is charged with (`a:<agent>:fail` in the history).
_AGENT_RESULTS = {"ok": "completed", "fail": "failed"}


async def _history_families(store: Store) -> list[Metric]:
    """The history's running totals (store/history.py): the same counts as the dashboard's
    charts, counted by the Lua scripts in the step that wrote each timeline event."""
    handouts = CounterMetricFamily(
        "gb_handouts", "Tasks handed out, by task type.", labels=["repository", "task_type"]
    )
    ends = CounterMetricFamily(
        "gb_lease_ends", "Leases ended, by outcome.", labels=["repository", "outcome"]
    )
    waits = {
        "wait": HistogramMetricFamily(
            "gb_time_to_claim_seconds",
            "Development tasks: seconds from claimable (labelled) to handed out.",
            labels=["repository"],
        ),
        "pr": HistogramMetricFamily(
            "gb_time_to_pr_seconds",
            "Development tasks: seconds from the claim to completion with the PR open.",
            labels=["repository"],
        ),
    }
    per_agent: dict[tuple[str, str], int] = {}
    for name, rstore in store.repos.items():
        totals = await rstore.history_totals()
        for field, n in sorted(totals.items()):
            kind, _, rest = field.partition(":")
            if kind == "claim":
                handouts.add_metric([name, rest], n)
            elif kind == "ev" and rest in LEASE_END_OUTCOMES:
                ends.add_metric([name, rest], n)
            elif kind == "a":
                agent, _, stat = rest.rpartition(":")
                per_agent[agent, stat] = per_agent.get((agent, stat), 0) + n
        for prefix, family in waits.items():
            family.add_metric([name], *_histogram(totals, prefix))
    return [handouts, ends, *waits.values(), *_agent_families(per_agent)]


def _histogram(totals: dict[str, int], prefix: str) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum (seconds) of the history's `prefix` fields."""
    buckets, seen = [], 0
    for le in DURATION_BOUNDS_S:
        seen += totals.get(f"{prefix}:{le}", 0)
        buckets.append((str(float(le)), float(seen)))
    buckets.append(("+Inf", float(seen + totals.get(f"{prefix}:+Inf", 0))))
    return buckets, totals.get(f"{prefix}:ms", 0) / 1000


def _agent_families(per_agent: dict[tuple[str, str], int]) -> list[Metric]:
    tasks = CounterMetricFamily(
        "gb_agent_tasks",
        "Leases ended per agent (all repositories): completed, or failed (failed, "
        "abandoned, expired).",
        labels=["agent", "result"],
    )
    seconds = CounterMetricFamily(
        "gb_agent_task_seconds",
        "Seconds the agent's completed tasks took, from claim to completion.",
        labels=["agent"],
    )
    for (agent, stat), n in sorted(per_agent.items()):
        if stat in _AGENT_RESULTS:
            tasks.add_metric([agent, _AGENT_RESULTS[stat]], n)
        elif stat == "ms":
            seconds.add_metric([agent], n / 1000)
    return [tasks, seconds]


def _health_families() -> dict[str, GaugeMetricFamily]:
    """The integrations' health per repository (see reports/health.py)."""
    return {
        "sync_failing": _per_repo(
            "gb_sync_failing", "1 while the leader's sync of the repository keeps failing."
        ),
        "rebuilding": _per_repo(
            "gb_mirror_rebuilding", "1 while the mirror is being rebuilt from GitHub."
        ),
        "queued": _per_repo(
            "gb_webhook_queue", "Verified webhook deliveries waiting for the worker."
        ),
        "inflight": _per_repo(
            "gb_webhook_inflight", "Deliveries the worker took and has not finished."
        ),
        "age": _per_repo(
            "gb_webhook_last_delivery_age_seconds",
            "Seconds since the last verified delivery (absent: none yet).",
        ),
        "stalled": _per_repo("gb_stalled_leases", "Live leases flagged stalled (no progress)."),
        "waiting": _per_repo("gb_waiting_on_people", "Work issues that wait on a person."),
    }


async def _add_health(
    families: dict[str, GaugeMetricFamily], name: str, rstore: Any, now: int
) -> None:
    families["sync_failing"].add_metric([name], int(await rstore.sync_failing() is not None))
    families["rebuilding"].add_metric([name], int(not await rstore.mirror_rebuilt()))
    families["queued"].add_metric([name], await rstore.webhook_backlog())
    families["inflight"].add_metric([name], await rstore.webhook_inflight())
    seen = await rstore.webhooks_seen_ms()
    if seen is not None:
        families["age"].add_metric([name], max(0, now - seen) / 1000)
    families["waiting"].add_metric([name], len(await rstore.waiting()))
