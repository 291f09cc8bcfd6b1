"""The figures: each scenario starts what it needs, measures, and returns table rows."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import costs, polling, profiling, webhooks
from benchmarks.baseline import KINDS as BASELINE_KINDS
from benchmarks.load import LoadResult, run_load, run_sequential
from benchmarks.servers import (
    KEYS,
    HTTPServer,
    Process,
    RedisServer,
    SimulatorProcess,
    baseline_argv,
    broker_env,
    connection_split,
    machine_busy_s,
    script_shas,
    serve_argv,
    size,
    wait_for_ready,
)
from github_broker.keys import RepoKeys

#: Figure groups, each reproducible alone with `--only`.
GROUPS = (
    "sync",
    "costs",
    "latency",
    "backlog",
    "throughput",
    "webhooks",
    "repositories",
    "after-handout",
    "durability",
    "checks",
    "graph",
    "script",
)
#: Generator CPU (% of one core) above which its own speed may cap the measured rate.
GENERATOR_LIMIT_PCT = 80.0
#: Issues sent to review before a backlog run: production always has some, and the poller's
#: review upkeep only runs when there are.
IN_REVIEW = 10
#: Seconds the write queue and a sync pass may take to show those issues in review.
REVIEW_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Options:
    agents: int = 50
    warmup_s: float = 1.0
    duration_s: float = 5.0
    client: str = "raw"
    sync_issues: int = 10_000
    big_backlog: int = 100_000
    #: The throughput runs' backlog: every repetition of the completing flows retires issues
    #: (about 370,000 over the 1- and 2-worker runs at 3,000-4,000 claims/s; 300,000 ran dry).
    throughput_issues: int = 800_000
    small_backlog: int = 100
    #: Sequential requests per latency row.
    latency_samples: int = 300
    lifecycles: int = 50
    redis_claims: int = 100
    #: Alternating repetitions of every throughput and latency comparison (medians reported).
    repeats: int = 5
    #: Label changes timed with webhooks, and with polling alone (each waits for a pass).
    webhook_samples: int = 100
    poll_samples: int = 20
    #: poll.interval_s of the polling-only row (production's default is 60 s).
    poll_interval_s: float = 5.0
    #: Configured repositories of the many-repository rows (`repositories.py`), and of the
    #: first sync with an agent waiting.
    repo_counts: tuple[int, ...] = (1, 30, 100, 300, 1000)
    strict_repo_counts: tuple[int, ...] = (1, 300, 1000)
    first_sync_repos: int = 300
    #: Reviews timed from submission until their fix is claimable (`after_handout.py`).
    fix_samples: int = 30
    #: How many times faster than production the progress intervals run in the progress
    #: figure, and its measured window (real seconds).
    progress_speedup: float = 30.0
    progress_window_s: float = 30.0
    #: The durability runs' backlog when the throughput data set is not built in the same
    #: run (both flows retire an issue per claim, with every setting, in every repetition).
    durability_issues: int = 300_000
    quick: bool = False
    profile: bool = False
    only: tuple[str, ...] = GROUPS
    #: Merge this run's groups into results/latest.json and docs/benchmarks.md (`--merge`).
    merge: bool = False

    def quick_version(self) -> Options:
        return replace(
            self,
            warmup_s=0.5,
            duration_s=2.0,
            big_backlog=30_000,
            throughput_issues=60_000,
            latency_samples=100,
            lifecycles=20,
            redis_claims=30,
            repeats=2,
            webhook_samples=20,
            poll_samples=5,
            repo_counts=(1, 100, 1000),
            strict_repo_counts=(1, 1000),
            fix_samples=8,
            progress_speedup=60.0,
            progress_window_s=10.0,
            durability_issues=60_000,
            quick=True,
        )

    def reproduce(self, group: str, *extra: str) -> str:
        parts = [".venv/bin/python -m benchmarks.run", f"--only {group}"]
        if self.quick:
            parts.append("--quick")
        if self.agents != Options.agents:
            parts.append(f"--agents {self.agents}")
        if self.client != Options.client:
            parts.append(f"--client {self.client}")
        return " ".join([*parts, *extra])


@dataclass
class Bench:
    """One run: its Redis, its log directory, the figures gathered so far."""

    options: Options
    workdir: Path
    redis: RedisServer
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, section: str, row: Any) -> None:
        self.figures.setdefault(section, []).append(row)

    @contextmanager
    def dataset(
        self, issues: int, *, people: bool = False
    ) -> Iterator[tuple[SimulatorProcess, dict[str, str], dict]]:
        """Empty Redis, a simulator holding `issues` open P1 issues (`people`: with a
        maintainer's and an agent's token), and the first full sync."""
        self.redis.flush()
        sim = SimulatorProcess(self.workdir, issues, people=people).start()
        try:
            env = broker_env(self.redis.url, sim.base_url, self.workdir / "no-config")
            first = polling.sync_pass(self.redis, sim, env, full=True, issues=issues)
            wait_for_ready(self.redis.client(), issues, timeout_s=30)
            first["issues"] = issues
            yield sim, env, first
        finally:
            sim.stop()

    @contextmanager
    def companion(self) -> Iterator[Bench]:
        """A second bench with a Redis of its own (its own log directory), adding to the same
        figures: a data set that runs beside this one's."""
        workdir = self.workdir / f"companion-{time.monotonic_ns()}"
        workdir.mkdir()
        redis_server = RedisServer(workdir).start()
        try:
            yield Bench(self.options, workdir, redis_server, self.figures)
        finally:
            redis_server.stop()

    @contextmanager
    def server(self, name: str, argv: list[str], env: dict[str, str]) -> Iterator[HTTPServer]:
        server = HTTPServer(name, self.workdir, argv, env).start()
        try:
            yield server
        finally:
            server.stop()

    def serve(
        self, env: dict[str, str], workers: int, profile: Path | None = None, **extra: str
    ) -> Any:
        return self.server(
            f"serve-{workers}w-{time.monotonic_ns()}",
            serve_argv(workers, profile),
            {**env, **extra},
        )

    def baseline(self, workers: int, kind: str = "fastapi") -> Any:
        env = {**os.environ, "BENCH_REDIS_URL": self.redis.url}
        return self.server(f"baseline-{kind}-{workers}w", baseline_argv(workers, kind), env)

    @contextmanager
    def baselines(self, workers: int) -> Iterator[dict[str, HTTPServer]]:
        """Every baseline (`benchmarks/baseline.py`), named `baseline-<kind>`."""
        with ExitStack() as stack:
            yield {
                f"baseline-{kind}": stack.enter_context(self.baseline(workers, kind))
                for kind in BASELINE_KINDS
            }

    def load(
        self,
        server: HTTPServer,
        sim: SimulatorProcess,
        flow: str,
        client: str | None = None,
        *,
        agents: int | None = None,
        keys: RepoKeys = KEYS,
        watch: dict[str, Process] | None = None,
    ) -> dict[str, Any]:
        """`agents` (default `options.agents`) agents doing `flow`, with the CPU of every
        process involved (`watch`: more processes, by name); `keys`: the repository whose
        write queue and leases are watched."""
        o = self.options
        more = watch or {}

        def probe() -> dict[str, Any]:
            return {
                "cpu": {
                    "server": server.cpu_s(),
                    "redis": self.redis.cpu_s(),
                    "simulator": sim.cpu_s(),
                    **{name: process.cpu_s() for name, process in more.items()},
                },
                "machine_busy_s": machine_busy_s(),
                "split": sorted(connection_split(server.pid, server.port).values(), reverse=True),
                "scripts": self.redis.script_usec(),
                "github_calls": sim.stats()["total"],
                "outbox": size(self.redis.client(), keys.outbox),
                "outbox_lag_s": _oldest_due_age_s(self.redis.client(), keys),
            }

        result = run_load(
            server.url,
            agents=agents or o.agents,
            flow=flow,
            warmup_s=o.warmup_s,
            duration_s=o.duration_s,
            client=client or o.client,
            probe=probe,
        )
        row = {**_row(result, o.duration_s), "client": client or o.client}
        # Every agent gives its task back when the window ends: a lease left behind would
        # shrink the pool of the next run (a 100-issue backlog ran dry after two runs).
        row["leases_after"] = size(self.redis.client(), keys.leases)
        if row["leases_after"]:
            held = f"{row['leases_after']} leases still held after the run"
            row["warning"] = "; ".join(filter(None, [row["warning"], held]))
        return row


def _oldest_due_age_s(client: Any, keys: RepoKeys = KEYS) -> float:
    """The write queue's lag: seconds since the oldest due job fell due (0 when none is)."""
    head = client.zrange(keys.outbox, 0, 0, withscores=True)
    if not head:
        return 0.0
    return max(0.0, time.time() - head[0][1] / 1000)


def _row(result: LoadResult, window_s: float) -> dict[str, Any]:
    summary = result.summary()
    before, after = summary.pop("probe").values()
    summary["cpu_pct"] = {
        name: 100 * (after["cpu"][name] - before["cpu"][name]) / window_s for name in before["cpu"]
    }
    # Everything else the machine did meanwhile (other processes: the foreign load).
    busy_pct = 100 * (after["machine_busy_s"] - before["machine_busy_s"]) / window_s
    summary["foreign_cpu_pct"] = max(
        0.0, busy_pct - sum(summary["cpu_pct"].values()) - summary["generator_cpu_pct"]
    )
    summary["connection_split"] = before["split"]  # at the window's start, all connected
    calls = after["scripts"][0] - before["scripts"][0]
    summary["lua_us_per_call"] = (
        (after["scripts"][1] - before["scripts"][1]) / calls if calls else None
    )
    summary["github_calls_per_s"] = (after["github_calls"] - before["github_calls"]) / window_s
    summary["outbox_growth_per_s"] = (after["outbox"] - before["outbox"]) / window_s
    summary["outbox_after"] = after["outbox"]
    summary["outbox_lag_s_after"] = after["outbox_lag_s"]
    summary["requests_per_s"] = sum(op["count"] for op in summary["ops"].values()) / window_s
    warnings = []
    if summary["generator_cpu_pct"] > GENERATOR_LIMIT_PCT:
        warnings.append(f"generator at {summary['generator_cpu_pct']:.0f} % of a core")
    if summary["no_task_204"]:
        warnings.append(f"{summary['no_task_204']} answers were 204 (backlog ran dry)")
    if summary["errors"]:
        warnings.append(f"{summary['errors']} errors, e.g. {summary['error_samples'][:1]}")
    if summary["handed_out_twice"]:
        warnings.append(f"{summary['handed_out_twice']} issues handed out twice")
    summary["warning"] = "; ".join(warnings)
    return summary


# --- the 10,000-issue data set: sync, costs, latency, backlog -----------------------------


def sync_figures(
    bench: Bench, sim: SimulatorProcess, env: dict[str, str], first: dict[str, Any]
) -> None:
    o = bench.options
    rep = o.reproduce("sync")
    bench.add(
        "sync",
        {
            "figure": f"first sync, {o.sync_issues:,} issues (`sync --full`)",
            **first,
            "reproduce": rep,
        },
    )
    passes = polling.poll_passes(bench.redis, sim, env, o.sync_issues)
    unchanged, changed = passes["unchanged"], passes["one_percent_changed"]
    bench.add(
        "sync", {"figure": "poll pass, nothing changed (`sync`)", **unchanged, "reproduce": rep}
    )
    bench.add(
        "sync",
        {
            "figure": f"poll pass, 1 % changed ({changed['issues_changed']} "
            f"of {o.sync_issues:,} edited)",
            **changed,
            "reproduce": rep,
        },
    )
    answers = ", ".join(f"{n}x {code}" for code, n in unchanged["github_by_status"].items())
    bench.add(
        "poll_costs",
        {
            "figure": "GitHub calls per unchanged poll pass",
            "value": unchanged["github_calls"],
            "detail": f"answers: {answers}",
            "reproduce": rep,
        },
    )
    bench.add(
        "poll_costs",
        {
            "figure": "GitHub calls per poll pass with 1 % of issues changed",
            "value": changed["github_calls"],
            "detail": f"{changed['issues_changed']} of {o.sync_issues:,} "
            f"edited; {_pass_summary(changed['report'])}",
            "reproduce": rep,
        },
    )


def _pass_summary(report: str) -> str:
    # "acme/widgets: incremental pass, 3 page(s) (0 unchanged), 201 issue(s) seen, ..."
    parts = report.split(": ", 1)[-1].split(", ")
    return ", ".join(p for p in parts[1:5] if not p.startswith("0 "))


def cost_figures(bench: Bench, sim: SimulatorProcess, env: dict[str, str]) -> None:
    o = bench.options
    rep = o.reproduce("costs")
    # No poller: every Redis command and GitHub call counted comes from the requests.
    with bench.serve(env, 1, GITHUB_BROKER_SERVER__RUN_POLLER="false") as server:
        red = costs.redis_per_claim(bench.redis, sim, server.url, o.redis_claims)
    original, explicit = red["request_task_flow"], red["explicit_flow"]
    top = ", ".join(
        f"{n} {c / original['claims']:.1f}"
        for n, c in list(original["commandstats_delta"].items())[:6]
    )
    bench.add(
        "costs",
        {
            "figure": "Redis commands per claim (request-task: settle held + claim)",
            "value": original["commands_per_claim"],
            "detail": f"INFO commandstats delta over {original['claims']} claims, "
            f"Lua's own calls included: {top} ...",
            "reproduce": rep,
        },
    )
    bench.add(
        "costs",
        {
            "figure": "Redis round trips per claim",
            "value": original["round_trips_per_claim"],
            "detail": "client commands seen by MONITOR (Lua calls excluded)",
            "reproduce": rep,
        },
    )
    for op in ("claim", "complete"):
        script = explicit["per_script"].get(op, {})
        bench.add(
            "costs",
            {
                "figure": f"Redis commands per explicit {op} (EVALSHA + inside)",
                "value": 1 + script.get("inner_commands_per_call", 0),
                "detail": f"{script.get('calls', 0)} calls; 1 round trip each",
                "reproduce": rep,
            },
        )
    bench.add(
        "costs",
        {
            "figure": "GitHub calls made while answering a claim",
            "value": original["github_calls_during_claims"],
            "detail": f"over {original['claims']} claims: writes are queued "
            "(outbox), never made on the request path",
            "reproduce": rep,
        },
    )
    bench.figures["redis_costs"] = red
    # The periodic sync is pushed out of the window so only the write queue talks to GitHub.
    with bench.serve(env, 1, GITHUB_BROKER_POLL__INTERVAL_S="3600") as server:
        time.sleep(1.0)  # the start-up sync pass
        life = costs.github_per_lifecycle(bench.redis.client(), sim, server.url, o.lifecycles)
    bench.figures["github_costs"] = life
    claim_routes = ", ".join(
        f"{k} {v / o.lifecycles:g}" for k, v in life["claim_writes"]["by_route"].items()
    )
    done_routes = ", ".join(
        f"{k} {v / o.lifecycles:g}" for k, v in life["complete_writes"]["by_route"].items()
    )
    bench.add(
        "costs",
        {
            "figure": "GitHub calls per claim (its queued writes drained)",
            "value": life["per_claim"],
            "detail": claim_routes,
            "reproduce": rep,
        },
    )
    bench.add(
        "costs",
        {
            "figure": "GitHub calls per completion (writes drained)",
            "value": life["per_complete"],
            "detail": done_routes,
            "reproduce": rep,
        },
    )
    bench.add(
        "costs",
        {
            "figure": "GitHub calls per issue lifecycle (claim → complete)",
            "value": life["per_lifecycle"],
            "detail": f"{o.lifecycles} issues; outbox empty after each phase",
            "reproduce": rep,
        },
    )
    bench.add(
        "costs",
        {
            "figure": "Counted GitHub calls per issue lifecycle (304s are free)",
            "value": life["counted_per_lifecycle"],
            "detail": f"{life['not_found']} calls answered 404 over {o.lifecycles} lifecycles",
            "reproduce": rep,
        },
    )


#: GitHub's real write pace (about 80 content writes a minute, the setting's default): in the
#: throughput and latency runs serve's write queue drains as in production. Unpaced, it
#: wrote about 150 labels a second during a single-agent run, and the sync passes mirroring
#: those changes back (200-issue upserts of about 5 ms in Redis) set the claims' p99.
PACED = {"GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES": "0.75"}

#: Single-agent latency comparisons: (server, flow), alternating like the throughput runs.
LATENCY_VARIANTS = (
    ("baseline-fastapi", "baseline"),
    ("baseline-asgi", "baseline"),
    ("baseline-asgi-pipelined", "baseline"),
    ("serve", "request-task"),
    ("serve", "claim-complete"),
)
_OP_NAMES = {
    "baseline": {"claim": "request"},
    "request-task": {"claim": "claim (settles the held task)"},
    "claim-complete": {"claim": "explicit claim", "complete": "explicit complete"},
}


def latency_figures(bench: Bench, env: dict[str, str]) -> None:
    o = bench.options
    rep = o.reproduce("latency")
    for workers in (1, 2):
        with bench.baselines(workers) as baselines, bench.serve(env, workers, **PACED) as serve:
            servers = {**baselines, "serve": serve}
            samples: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
            for r in range(o.repeats):
                for name, flow in rotated(LATENCY_VARIANTS, r):
                    result = run_sequential(
                        servers[name].url, flow=flow, count=o.latency_samples, client=o.client
                    )
                    for op, summary in result.summary()["ops"].items():
                        samples.setdefault((name, flow, op), []).append(summary)
        for (name, flow, op), runs in samples.items():
            bench.add(
                "latency",
                {
                    "server": name,
                    "workers": workers,
                    "flow": flow,
                    "operation": _OP_NAMES[flow][op],
                    "runs": len(runs),
                    "count": sum(s["count"] for s in runs),
                    "p50_ms": spread([s["p50_ms"] for s in runs])["median"],
                    "p99_ms": spread([s["p99_ms"] for s in runs])["median"],
                    "p99_range_ms": spread([s["p99_ms"] for s in runs]),
                    "reproduce": rep,
                },
            )


def _put_in_review(bench: Bench, server: HTTPServer, count: int) -> int:
    """Claim and complete `count` issues, then wait until serve's sync sees them in review
    (their label writes must land on GitHub first)."""
    client = bench.redis.client()
    costs.claim_and_complete(server.url, count)
    deadline = time.monotonic() + REVIEW_TIMEOUT_S
    while size(client, KEYS.reviewing) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    return size(client, KEYS.reviewing)


def backlog_figure(bench: Bench, sim: SimulatorProcess, env: dict[str, str], issues: int) -> None:
    """Claim rate on one data set, with and without serve's poller (see backlog_comparison
    for the two data sets the issue compares)."""
    backlog_comparison([(bench, sim, env, issues)])


def backlog_comparison(stacks: list[tuple[Bench, SimulatorProcess, dict[str, str], int]]) -> None:
    """Claim rate against the backlog, one row per data set and poller setting. Each stack
    (its own Redis, simulator and data set) gets a serve of its own, all running at once, and
    their load runs alternate, the order rotating each repetition: the machine's drift hits
    every data set alike (run one after the other, the first data set ran on a quieter
    machine than the last)."""
    # With and without serve's poller: the claim script's cost and the upkeep sharing
    # the machine grow differently with the backlog.
    for poller in ("on", "off"):
        with ExitStack() as started:
            servers = [
                started.enter_context(
                    bench.serve(
                        env, 1, GITHUB_BROKER_SERVER__RUN_POLLER=str(poller == "on").lower()
                    )
                )
                for bench, _, env, _ in stacks
            ]
            in_review = [
                _put_in_review(bench, server, IN_REVIEW) if poller == "on" else 0
                for (bench, *_), server in zip(stacks, servers, strict=True)
            ]
            runs: list[list[dict[str, Any]]] = [[] for _ in stacks]
            order = list(range(len(stacks)))
            for repeat in range(stacks[0][0].options.repeats):
                for i in rotated(order, repeat):
                    bench, sim, _, _ = stacks[i]
                    runs[i].append(bench.load(servers[i], sim, "claim-abandon"))
        for (bench, _, _, issues), rows, review in zip(stacks, runs, in_review, strict=True):
            bench.add(
                "backlog",
                {
                    **aggregate(rows),
                    "open_issues": issues,
                    "poller": poller,
                    "in_review": review,
                    "reproduce": bench.options.reproduce("backlog"),
                },
            )


# --- the big data set: throughput, the largest backlog, the profile -----------------------


#: The variants of one throughput comparison: (server, flow). They run in turn, the order
#: rotating each repetition, so slow drifts of the machine hit every variant alike.
THROUGHPUT_VARIANTS = (
    ("baseline-fastapi", "baseline"),
    ("baseline-asgi", "baseline"),
    ("baseline-asgi-pipelined", "baseline"),
    ("serve", "request-task"),
    ("serve", "claim-complete"),
)


#: Ratio field -> the baseline serve's requests/s are divided by (same repetition).
RATIOS = {
    "ratio_to_fastapi": "baseline-fastapi",
    "ratio_to_asgi": "baseline-asgi",
    "ratio_to_asgi_pipelined": "baseline-asgi-pipelined",
}


def rotated(items: tuple[Any, ...] | list[Any], by: int) -> list[Any]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median and range of repeated measurements."""
    clean = [v for v in values if v is not None]
    if not clean:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(clean), "min": min(clean), "max": max(clean)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from the repetitions of one variant: medians, ranges, every run's
    connection split and foreign load."""
    first = runs[0]
    ops = {}
    for op in first["ops"]:
        ops[op] = {
            "p50_ms": spread([r["ops"][op]["p50_ms"] for r in runs if op in r["ops"]])["median"],
            "p99_ms": spread([r["ops"][op]["p99_ms"] for r in runs if op in r["ops"]])["median"],
            "count": sum(r["ops"][op]["count"] for r in runs if op in r["ops"]),
        }
    row = {
        "flow": first["flow"],
        "agents": first["agents"],
        "client": first["client"],
        "runs": len(runs),
        "claims_per_s": spread([r["claims_per_s"] for r in runs]),
        "requests_per_s": spread([r["requests_per_s"] for r in runs]),
        "ops": ops,
        "cpu_pct": {
            name: spread([r["cpu_pct"][name] for r in runs])["median"] for name in first["cpu_pct"]
        },
        "generator_cpu_pct": spread([r["generator_cpu_pct"] for r in runs])["median"],
        "foreign_cpu_pct": [round(r["foreign_cpu_pct"], 1) for r in runs],
        "connection_split": [r["connection_split"] for r in runs],
        "lua_us_per_call": spread([r["lua_us_per_call"] for r in runs])["median"],
        "claim_script_us": spread(
            [r.get("script_us", {}).get("claim", {}).get("median_us") for r in runs]
        )["median"],
        # Mean beside median: under load the mean carries the calls that waited for a core
        # mid-script (the issue's "mean time in Redis"), which the median hides.
        "claim_script": {
            stat: spread([r.get("script_us", {}).get("claim", {}).get(stat) for r in runs])
            for stat in ("median_us", "mean_us", "p99_us")
        }
        | {"calls": sum(r.get("script_us", {}).get("claim", {}).get("calls", 0) for r in runs)},
        "github_calls_per_s": spread([r["github_calls_per_s"] for r in runs])["median"],
        "outbox_after": runs[-1]["outbox_after"],
        "outbox_lag_s_after": runs[-1]["outbox_lag_s_after"],
        "outbox_growth_per_s": spread([r["outbox_growth_per_s"] for r in runs])["median"],
        "no_task_204": sum(r["no_task_204"] for r in runs),
        "warning": "; ".join(sorted({r["warning"] for r in runs if r["warning"]})),
    }
    for key in RATIOS:
        if key in first:
            row[key] = spread([r[key] for r in runs])
    return row


def _script_us(times: dict[str, list[int]], shas: dict[str, str]) -> dict[str, Any]:
    """Per broker script: calls and median / mean µs inside Redis (SLOWLOG, see
    `servers.SLOWLOG_THRESHOLD_US`)."""
    return {
        shas[sha]: {
            "calls": len(t),
            "median_us": statistics.median(t),
            "mean_us": statistics.fmean(t),
            "p99_us": sorted(t)[min(len(t) - 1, round(0.99 * (len(t) - 1)))],
        }
        for sha, t in times.items()
        if sha in shas and t
    }


def throughput_figures(bench: Bench, sim: SimulatorProcess, env: dict[str, str]) -> None:
    o = bench.options
    rep = o.reproduce("throughput")
    shas = script_shas({**env, **PACED})
    for workers in (1, 2):
        with bench.baselines(workers) as baselines, bench.serve(env, workers, **PACED) as serve:
            servers = {**baselines, "serve": serve}
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for r in range(o.repeats):
                done: dict[tuple[str, str], dict[str, Any]] = {}
                for name, flow in rotated(THROUGHPUT_VARIANTS, r):
                    bench.redis.start_script_log()
                    done[(name, flow)] = bench.load(servers[name], sim, flow)
                    done[(name, flow)]["script_us"] = _script_us(bench.redis.script_times(), shas)
                for (name, flow), row in done.items():
                    if name == "serve":
                        for key, baseline in RATIOS.items():
                            row[key] = (
                                row["requests_per_s"]
                                / done[(baseline, "baseline")]["requests_per_s"]
                            )
                    runs.setdefault((name, flow), []).append(row)
        for (name, _flow), rows in runs.items():
            bench.add(
                "throughput",
                {
                    **aggregate(rows),
                    "server": name,
                    "workers": workers,
                    "open_issues": o.throughput_issues,
                    "reproduce": rep,
                },
            )
    one = {
        r["flow"]: r
        for r in bench.figures["throughput"]
        if r["server"] == "serve" and r["workers"] == 1
    }
    two = {
        r["flow"]: r
        for r in bench.figures["throughput"]
        if r["server"] == "serve" and r["workers"] == 2
    }
    for flow in one.keys() & two.keys():
        two[flow]["ratio_to_1_worker"] = (
            two[flow]["requests_per_s"]["median"] / one[flow]["requests_per_s"]["median"]
        )


def profile_figure(bench: Bench, sim: SimulatorProcess, env: dict[str, str]) -> None:
    o = bench.options
    path = bench.workdir / "profile-serve.pyisession"
    with bench.serve(env, 1, profile=path, GITHUB_BROKER_SERVER__RUN_POLLER="false") as server:
        row = bench.load(server, sim, "request-task")
    # The profiler writes its session while serve shuts down; the server context waited.
    target = Path(__file__).resolve().parent / "results" / path.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(path.read_bytes())
    bench.figures["profile"] = {
        "flow": "request-task",
        "agents": o.agents,
        "claims_per_s": row["claims_per_s"],
        "ops": row["ops"],
        "summary": profiling.render(target),
        "reproduce": o.reproduce("profile"),
    }


# --- webhooks beside polling ----------------------------------------------------------------


def webhook_figures(bench: Bench, sim: SimulatorProcess, env: dict[str, str]) -> None:
    """Label-to-claimable latency and GitHub calls per change: polling alone, then webhooks
    (poll every second, stretched to 600 s while webhooks are healthy)."""
    o = bench.options
    rep = o.reproduce("webhooks")
    client = bench.redis.client()
    targets = webhooks.add_targets(sim, o.poll_samples + o.webhook_samples)
    polled, pushed = targets[: o.poll_samples], targets[o.poll_samples :]
    with bench.serve(env, 1, GITHUB_BROKER_POLL__INTERVAL_S=str(o.poll_interval_s)):
        webhooks.wait_mirrored(client, targets)
        row = webhooks.label_to_claimable(sim, client, polled, jitter_s=o.poll_interval_s)
    bench.add(
        "webhooks",
        {"mode": f"polling only (poll.interval_s {o.poll_interval_s:g})", **row, "reproduce": rep},
    )
    with bench.serve(
        env,
        1,
        GITHUB_BROKER_WEBHOOKS__SECRET=webhooks.SECRET,
        GITHUB_BROKER_POLL__INTERVAL_WITH_WEBHOOKS_S="600",
    ) as server:
        webhooks.wait_mirrored(client, targets)
        webhooks.hook(sim, server)
        time.sleep(1.5)  # the ping lands and the start-up poll pass is over
        row = webhooks.label_to_claimable(sim, client, pushed)
    bench.add(
        "webhooks",
        {"mode": "webhooks (poll.interval_s 1, 600 while healthy)", **row, "reproduce": rep},
    )
