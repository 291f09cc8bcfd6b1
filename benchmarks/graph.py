"""GitHub requests of reading the dependency graph: a full sync, an unchanged poll pass and an
unchanged full pass of 1,000 open issues, without links and with 100 (docs/dependencies.md)."""

from __future__ import annotations

import logging
from typing import Any

from benchmarks import polling
from benchmarks.scenarios import Bench
from benchmarks.servers import SimulatorProcess, broker_env

logger = logging.getLogger("benchmarks")

#: The data set: open issues, and the links among them (each dependent blocked by one issue).
ISSUES = 1000
LINKS = 100
PASSES = (
    ("full sync, empty Redis (`sync --full`)", True),
    ("poll pass, nothing changed (`sync`)", False),
    ("full pass, nothing changed (`sync --full`)", True),
)


def graph_figures(bench: Bench) -> None:
    """One row per pass and data set: every request, those GitHub counts (a 304 is free) and
    the GraphQL ones among them."""
    for links in (0, LINKS):
        bench.redis.flush()
        sim = SimulatorProcess(bench.workdir, ISSUES, links=links).start()
        try:
            env = broker_env(bench.redis.url, sim.base_url, bench.workdir / "no-config")
            for figure, full in PASSES:
                done = polling.sync_pass(bench.redis, sim, env, full=full, issues=ISSUES)
                stats = sim.stats()
                bench.add("graph", _row(figure, links, done, stats, bench))
        finally:
            sim.stop()


def _row(
    figure: str, links: int, done: dict[str, Any], stats: dict[str, Any], bench: Bench
) -> dict[str, Any]:
    return {
        "figure": figure,
        "issues": ISSUES,
        "links": links,
        "github_calls": done["github_calls"],
        "counted": stats["rate_limited_cost"],
        "graphql": stats["by_route"].get("POST /graphql", 0),
        "by_route": stats["by_route"],
        "by_status": stats["by_status"],
        "wall_s": done["wall_s"],
        "reproduce": bench.options.reproduce("graph"),
    }


def findings(rows: list[dict[str, Any]]) -> list[str]:
    """What the graph costs beside the same passes without it."""
    plain = {r["figure"]: r for r in rows if not r["links"]}
    out = []
    for r in (r for r in rows if r["links"]):
        base = plain.get(r["figure"])
        if base is None:
            continue
        out.append(
            f"Dependency graph, {r['figure'].split(' (')[0]}: {r['counted'] - base['counted']:+d} "
            f"counted GitHub requests with {r['links']} links among {r['issues']:,} issues "
            f"({r['graphql']} GraphQL), {r['counted']} in all against {base['counted']}."
        )
    return out
