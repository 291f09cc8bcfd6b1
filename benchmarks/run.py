"""`python -m benchmarks.run`: start Redis, the simulator and serve, measure, write the results."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import (
    after_handout,
    checks,
    durability,
    graph,
    lua_cost,
    report,
    repositories,
    scenarios,
)
from benchmarks.load import CLIENTS
from benchmarks.scenarios import GROUPS, Bench, Options
from benchmarks.servers import RedisServer

logger = logging.getLogger("benchmarks")


def parse_args(argv: list[str] | None) -> tuple[Options, bool]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run (~1 min): 2 s windows, a 30,000-issue backlog",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also profile serve under load with pyinstrument"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[*GROUPS, "profile"],
        help="run only this group of figures (repeatable); `profile` alone runs just the profile",
    )
    parser.add_argument("--agents", type=int, default=Options.agents)
    parser.add_argument("--duration", type=float, help="measured seconds per load run")
    parser.add_argument(
        "--repeats", type=int, help="alternating repetitions of each comparison (default 5)"
    )
    parser.add_argument(
        "--client",
        choices=CLIENTS,
        default=Options.client,
        help="HTTP client of the load generator",
    )
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the process logs (their directory is printed)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only: put these groups' figures into results/latest.json "
        "and write docs/benchmarks.md again (the other figures kept)",
    )
    args = parser.parse_args(argv)
    only = [g for g in args.only or GROUPS if g != "profile"]
    profile = args.profile or "profile" in (args.only or [])
    options = Options(agents=args.agents, client=args.client, profile=profile, only=tuple(only))
    if args.quick:
        options = options.quick_version()
    if args.duration:
        options = replace(options, duration_s=args.duration)
    if args.repeats:
        options = replace(options, repeats=args.repeats)
    return replace(options, merge=args.merge), args.keep_logs


def measure(bench: Bench) -> None:
    """Every selected figure, grouped by the data set it needs (a sync per data set)."""
    only = set(bench.options.only)
    if only & {"sync", "costs", "latency", "backlog"}:
        _on_sync_dataset(bench, only)
    if "backlog" in only:
        _backlog_side_by_side(bench)
    _on_large_backlog(bench, only)
    _on_own_datasets(bench, only)
    bench.figures.get("backlog", []).sort(key=lambda row: (row["poller"], row["open_issues"]))


def _add_first_sync(bench: Bench, issues: int, first: dict[str, Any], group: str) -> None:
    """The first sync of a data set, as a figure of its own."""
    bench.add(
        "sync",
        {
            "figure": f"first sync, {issues:,} issues (`sync --full`)",
            **first,
            "reproduce": bench.options.reproduce(group),
        },
    )


def _on_sync_dataset(bench: Bench, only: set[str]) -> None:
    """The figures that share the sync's data set."""
    o = bench.options
    logger.info("data set: %d issues", o.sync_issues)
    with bench.dataset(o.sync_issues) as (sim, env, first):
        if "sync" in only:
            scenarios.sync_figures(bench, sim, env, first)
        if "costs" in only:
            scenarios.cost_figures(bench, sim, env)
        # Backlog before latency: the latency flows complete issues, the backlog's don't.
        if "backlog" in only:
            scenarios.backlog_figure(bench, sim, env, o.sync_issues)
        if "latency" in only:
            scenarios.latency_figures(bench, env)


def _backlog_side_by_side(bench: Bench) -> None:
    """The smallest and the largest backlog side by side, each on a Redis of its own, so that
    their runs alternate."""
    o = bench.options
    logger.info("data sets: %d and %d issues", o.small_backlog, o.big_backlog)
    with (
        bench.companion() as other,
        bench.dataset(o.small_backlog) as (small_sim, small_env, _),
        other.dataset(o.big_backlog) as (big_sim, big_env, first),
    ):
        _add_first_sync(bench, o.big_backlog, first, "backlog")
        scenarios.backlog_comparison(
            [
                (bench, small_sim, small_env, o.small_backlog),
                (other, big_sim, big_env, o.big_backlog),
            ]
        )


def _on_large_backlog(bench: Bench, only: set[str]) -> None:
    """Throughput, the profile and durability: the completing flows retire an issue per
    claim, over every repetition, so a backlog large enough that no run drains it. The
    durability runs share it when both run."""
    o = bench.options
    skipped = durability.unavailable() if "durability" in only else None
    if skipped is not None:
        bench.add("durability", {"skipped": skipped, "reproduce": o.reproduce("durability")})
    big = "throughput" in only or o.profile
    if not big and not ("durability" in only and skipped is None):
        return
    issues = o.throughput_issues if big else o.durability_issues
    logger.info("data set: %d issues", issues)
    with bench.dataset(issues) as (sim, env, first):
        _add_first_sync(bench, issues, first, "throughput" if big else "durability")
        if "throughput" in only:
            scenarios.throughput_figures(bench, sim, env)
        if o.profile:
            scenarios.profile_figure(bench, sim, env)
        if "durability" in only and skipped is None:
            durability.durability_figures(bench, sim, env)


def _on_own_datasets(bench: Bench, only: set[str]) -> None:
    """The groups that build data sets of their own."""
    o = bench.options
    if "webhooks" in only:
        logger.info("data set: %d issues (webhooks)", o.small_backlog)
        with bench.dataset(o.small_backlog) as (sim, env, _):
            scenarios.webhook_figures(bench, sim, env)
    if "after-handout" in only:
        logger.info("data set: %d issues (review, fix)", o.fix_samples)
        with bench.dataset(o.fix_samples, people=True) as (sim, env, _):
            after_handout.fix_figure(bench, sim, env, o.fix_samples)
        logger.info("data set: %d issues (progress)", after_handout.HELD_TASKS)
        with bench.dataset(after_handout.HELD_TASKS) as (sim, env, _):
            after_handout.progress_figures(bench, sim, env)
    if "checks" in only:
        logger.info("data set: %d issues (checks)", checks.PRS)
        checks.figures(bench)
    if "graph" in only:
        logger.info("data sets: %d issues without and with %d links", graph.ISSUES, graph.LINKS)
        graph.graph_figures(bench)
    if "script" in only:
        logger.info("claim.lua alone on an idle Redis")
        lua_cost.script_figures(bench)
    if "repositories" in only:
        repositories.repository_figures(bench)
        logger.info("first sync of %d repositories, an agent waiting", o.first_sync_repos)
        repositories.first_sync_figure(bench)


def findings(figures: dict[str, Any]) -> list[str]:
    """Observations the numbers themselves support, written into the Markdown."""
    out = []
    rows = figures.get("throughput", [])
    for r in (r for r in rows if r["server"] == "serve"):
        script = r.get("claim_script") or {}
        mean = (script.get("mean_us") or {}).get("median")
        out.append(
            f"serve {r['workers']}w `{r['flow']}`: {r['ratio_to_fastapi']['median']:.2f} x the "
            f"FastAPI baseline, {r['ratio_to_asgi']['median']:.2f} x the bare ASGI baseline on "
            f"redis-py, {r['ratio_to_asgi_pipelined']['median']:.2f} x the bare ASGI baseline "
            f"on serve's own Redis client (medians of {r['runs']} runs); claim script "
            f"{r.get('claim_script_us') or 0:.0f} µs median, {mean or 0:.0f} µs mean inside "
            "Redis."
        )
    if rows:
        busiest = max(r["generator_cpu_pct"] for r in rows)
        out.append(
            f"The load generator used at most {busiest:.0f} % of a core (median per "
            "variant), so it was not the bottleneck."
        )
        serve_rows = [r for r in rows if r["server"] == "serve"]
        queued = max(r["outbox_after"] for r in serve_rows)
        lag = max(r.get("outbox_lag_s_after", 0.0) for r in serve_rows)
        out.append(
            f"GitHub write queue after the throughput runs: {queued:,} jobs, the oldest "
            f"due for {lag:,.0f} s (its lag; drained at GitHub's pace of about 80 writes "
            "a minute, while every claim of a new issue adds that issue's one label job "
            "and its branch job)."
        )
    out += _more_findings(figures)
    for poller in ("on", "off"):
        backlog = [r for r in figures.get("backlog", []) if r["poller"] == poller]
        if len(backlog) < 2:
            continue
        small, big = backlog[0], backlog[-1]
        if not small["claims_per_s"]["median"]:
            out.append(f"Poller {poller}: no claims with {small['open_issues']:,} open issues.")
            continue
        out.append(
            f"Poller {poller}: claims/s with {big['open_issues']:,} open issues is "
            f"{big['claims_per_s']['median'] / small['claims_per_s']['median']:.2f} x the rate "
            f"with {small['open_issues']:,}; claim p99 "
            f"{small['ops']['claim']['p99_ms']:.0f} ms -> {big['ops']['claim']['p99_ms']:.0f} ms."
        )
    return out


def _more_findings(figures: dict[str, Any]) -> list[str]:
    """Observations on the many-repository, after-hand-out and durability figures."""
    out = []
    for mode in ("best_effort", "strict"):
        rows = {r["repositories"]: r for r in figures.get("repositories", []) if r["mode"] == mode}
        if len(rows) > 1:
            ratios = ", ".join(
                f"{n:,}: {r['ratio_to_one']['median']:.2f} x"
                for n, r in rows.items()
                if n != min(rows)
            )
            out.append(
                f"request-task requests/s ({mode}) against the rate with "
                f"{min(rows)} repository: {ratios}."
            )
    lat = {r["repositories"]: r for r in figures.get("repositories_latency", [])}
    if len(lat) > 1:
        ratios = ", ".join(
            f"{n:,}: {r['p99_ratio']['median']:.2f} x" for n, r in lat.items() if n != min(lat)
        )
        out.append(f"Single-agent request-task p99 against 1 repository's: {ratios}.")
    for r in figures.get("first_sync", []):
        out.append(
            f"First sync of {r['repositories']:,} repositories with an agent waiting: "
            f"first task at {r['first_task_s']:.1f} s, every repository mirrored at "
            f"{r['synced_s']:.1f} s (serve answered /health at {r['serve_up_s']:.1f} s)."
        )
    for r in figures.get("after_handout", []):
        if r["p50_ms"] is None:
            out.append(f"Review submitted -> fix claimable: all {r['samples']} samples lost.")
            continue
        out.append(
            f"Review submitted -> fix claimable with webhooks: p50 {r['p50_ms']:.0f} ms, "
            f"p99 {r['p99_ms']:.0f} ms with {r['detail'].split(';')[0]}; "
            f"{r['after_due_p99_ms']:.0f} ms after the debounce ended at p99."
        )
    for r in figures.get("progress_calls", []):
        if not r["calls"]:
            out.append(f"Progress tracking, {r['mode']}: no GitHub calls.")
            continue
        out.append(
            f"Progress tracking, {r['mode']}: {r['per_task_hour']:.1f} GitHub calls per "
            f"held task per hour ({r['counted_per_task_hour']:.1f} counted against the "
            "quota, the rest free 304s)."
        )
    out += graph.findings(figures.get("graph", []))
    for r in figures.get("durability", []):
        if r.get("skipped"):
            out.append(f"Durable acknowledgements: {r['skipped']}.")
        elif r["setting"] != "none":
            out.append(
                f"`redis.durability` {r['setting']}, `{r['flow']}`: "
                f"{r['ratio_to_none']['median']:.2f} x the requests/s of `none`."
            )
    return out


def main(argv: list[str] | None = None) -> int:
    options, keep_logs = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per control call otherwise
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="gb-bench-"))
    redis_server = RedisServer(workdir).start()
    redis_version = redis_server.version()
    bench = Bench(options, workdir, redis_server)
    try:
        measure(bench)
    finally:
        redis_server.stop()
        if keep_logs:
            print(f"process logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    results = {
        "machine": report.machine(redis_version),
        "settings": asdict(options),
        "runtime_s": time.monotonic() - started,
        "figures": bench.figures,
        "findings": findings(bench.figures),
    }
    full = options.only == GROUPS and not options.quick
    parts = ["quick"] if options.quick else []
    if options.only != GROUPS:
        parts += ["only", *options.only, *(["profile"] if options.profile else [])]
    name = "latest" if full else "-".join(parts)
    path = report.write_json(results, name)
    if options.merge and not full and not options.quick:
        results = report.merged(results, findings)
        path = report.write_json(results, "latest")
        full = True
    text = report.markdown(results)
    if full:
        report.DOCS_PATH.write_text(text + "\n", encoding="utf-8")
    print(text)
    print(f"\nresults: {path}" + (f", {report.DOCS_PATH}" if full else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
