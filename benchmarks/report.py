"""Results out: machine facts, `benchmarks/results/*.json`, the Markdown of docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
DOCS_PATH = ROOT / "docs" / "benchmarks.md"


def machine(redis_version: str) -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines()
                  if line.startswith("model name")), platform.processor())
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kb = next((int(line.split()[1]) for line in meminfo.splitlines()
                   if line.startswith("MemTotal")), 0)
    versions = {}
    for package in ("fastapi", "uvicorn", "starlette", "pydantic", "redis", "httpx", "PyGithub"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "absent"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis": redis_version,
        "packages": versions,
        "commit": _commit(),
    }


def _commit() -> str:
    # Read-only git queries; a tree with local edits is marked, the numbers may not match HEAD.
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} (uncommitted changes)" if dirty else head


def write_json(results: dict[str, Any], name: str) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    return path


def _n(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value >= 100):
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def _ms(op: dict[str, Any] | None) -> str:
    if not op or op.get("p50_ms") is None:
        return "-"
    return f"{_n(op['p50_ms'])} / {_n(op['p99_ms'])}"


def _code(command: str) -> str:
    return f"`{command}`"


def _mid(value: Any, digits: int = 1) -> str:
    """A repeated measurement: median (min-max)."""
    if not isinstance(value, dict):
        return _n(value, digits)
    if value.get("median") is None:
        return "-"
    return f"{_n(value['median'], digits)} ({_n(value['min'], digits)}-{_n(value['max'], digits)})"


def _split(splits: list[list[int]]) -> str:
    return ", ".join(":".join(str(c) for c in s) or "-" for s in splits)


def _throughput(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("throughput", [])
    if not rows:
        return []
    out = [
        f"## Throughput: {rows[0]['agents']} concurrent agents, "
        f"{rows[0]['open_issues']:,} open issues",
        "",
        "Each agent loops without pause. `request-task`: the original's flow, asking again "
        "completes the held task (one request per claim). `claim-complete`: claim, then "
        "`POST /tasks/{owner}/{repo}/{n}/complete` with the lease token (two requests). "
        "Baselines: the same request body to an endpoint doing one `EVALSHA` of a trivial "
        "script (`benchmarks/baseline.py`), once as a FastAPI route and once as a bare ASGI "
        "app, served by the same process model as serve. Every variant of one worker count "
        f"runs {rows[0]['runs']} times in turn (the order rotating); figures are medians with "
        "the range in brackets, and each x baseline is the median of the per-repetition ratios "
        "against the baseline measured in the same repetition. Split: established connections "
        "per worker process, per repetition. Lua µs/call: Redis's time per EVALSHA of any script "
        "(INFO commandstats); claim.lua µs: the median time of one claim script call inside "
        "Redis (SLOWLOG at 15 µs: every claim call, hardly any of the commands inside "
        "scripts, which Redis logs too and which at 0 µs cost Redis CPU in the measured runs). "
        "Foreign: CPU (% of one core) used by everything outside the measured processes, per "
        "repetition.",
        "",
        "| server | workers | flow | claims/s | requests/s | x FastAPI | x ASGI "
        "| claim p50 / p99 ms | complete p50 / p99 ms | server CPU | Redis CPU | Lua µs/call "
        "| claim.lua µs "
        "| split | foreign CPU % | reproduce |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["cpu_pct"]
        out.append(
            f"| {r['server']} | {r['workers']} | {r['flow']} | {_mid(r['claims_per_s'], 0)} "
            f"| {_mid(r['requests_per_s'], 0)} | {_mid(r.get('ratio_to_fastapi'), 2)} "
            f"| {_mid(r.get('ratio_to_asgi'), 2)} | {_ms(r['ops'].get('claim'))} "
            f"| {_ms(r['ops'].get('complete'))} | {_n(cpu.get('server'), 0)} % "
            f"| {_n(cpu.get('redis'), 0)} % | {_n(r.get('lua_us_per_call'), 0)} "
            f"| {_n(r.get('claim_script_us'), 0)} | {_split(r['connection_split'])} "
            f"| {', '.join(_n(f, 0) for f in r['foreign_cpu_pct'])} "
            f"| {_code(r['reproduce'])} |"
        )
    scaling = [r for r in rows if r.get("ratio_to_1_worker")]
    notes = [f"- serve 2 workers, `{r['flow']}`: {r['ratio_to_1_worker']:.2f} x the requests/s "
             "of 1 worker" for r in scaling]
    notes += [f"- {r['server']} {r['workers']}w {r['flow']}: {r['warning']}"
              for r in rows if r.get("warning")]
    return [*out, "", *notes, *([""] if notes else [])]


def _backlog(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("backlog", [])
    if not rows:
        return []
    out = [
        "## Claim rate against the backlog",
        "",
        f"`claim-abandon` flow (asking again gives the held task back, so the backlog stays "
        f"the same size), {rows[0]['agents']} agents, serve with 1 worker, with its poller "
        "(sync, write queue, review upkeep) and without; medians of the repetitions. The "
        "smallest and the largest backlog run side by side, their runs alternating.",
        "",
        "| serve's poller | open issues | in review | claims/s | claim p50 / p99 ms "
        "| server CPU | Lua µs/call | reproduce |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['poller']} | {r['open_issues']:,} | {r['in_review']:,} "
                   f"| {_mid(r['claims_per_s'], 0)} "
                   f"| {_ms(r['ops'].get('claim'))} | {_n(r['cpu_pct'].get('server'), 0)} % "
                   f"| {_n(r.get('lua_us_per_call'), 0)} | {_code(r['reproduce'])} |")
    return [*out, ""]


def _latency(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("latency", [])
    if not rows:
        return []
    out = [
        "## Latency of one agent, no other load",
        "",
        "One request at a time over a kept-alive connection; serve's poller runs beside it as "
        "in production. Medians over the alternating repetitions; p99 x baseline against the "
        "FastAPI baseline of the same workers.",
        "",
        "| server | workers | operation | p50 ms | p99 ms (range) | p99 x FastAPI | samples "
        "| reproduce |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = {r["workers"]: r["p99_ms"] for r in rows if r["server"] == "baseline-fastapi"}
    for r in rows:
        ratio = r["p99_ms"] / base[r["workers"]] if base.get(r["workers"]) else None
        out.append(f"| {r['server']} | {r['workers']} | {r['operation']} | {_n(r['p50_ms'], 2)} "
                   f"| {_mid(r['p99_range_ms'], 2)} | {_n(ratio, 2)} | {r['count']} "
                   f"| {_code(r['reproduce'])} |")
    return [*out, ""]


def _costs(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("costs", []) + figs.get("poll_costs", [])
    if not rows:
        return []
    out = ["## Cost per claim", "", "| figure | value | detail | reproduce |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['figure']} | {_n(r['value'])} | {r['detail']} "
                   f"| {_code(r['reproduce'])} |")
    return [*out, ""]


def _sync(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("sync", [])
    if not rows:
        return []
    out = [
        "## Sync passes (`github-broker sync` as a subprocess)",
        "",
        "| pass | wall s | broker CPU s | Redis CPU s | GitHub calls | reproduce |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['figure']} | {_n(r['wall_s'], 2)} | {_n(r['broker_cpu_s'], 2)} "
                   f"| {_n(r['redis_cpu_s'], 2)} | {r['github_calls']:,} "
                   f"| {_code(r['reproduce'])} |")
    return [*out, ""]


def _webhooks(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("webhooks", [])
    if not rows:
        return []
    out = [
        "## Label to claimable (a maintainer adds `P1` on GitHub)",
        "",
        "| mode | changes | p50 ms | p99 ms | max ms | GitHub calls / change "
        "| list calls / change | lost | reproduce |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(f"| {r['mode']} | {r['changes']} | {_n(r['p50_ms'])} | {_n(r['p99_ms'])} "
                   f"| {_n(r['max_ms'])} | {_n(r['github_calls_per_change'], 2)} "
                   f"| {_n(r['list_calls_per_change'], 2)} | {r['lost']} "
                   f"| {_code(r['reproduce'])} |")
    return [*out, ""]


def _profile(figs: dict[str, Any]) -> list[str]:
    prof = figs.get("profile")
    if not prof:
        return []
    out = [
        "## Profile of serve under load (pyinstrument)",
        "",
        f"1 worker, `{prof['flow']}` flow, {prof['agents']} agents: "
        f"{_n(prof['claims_per_s'])} claims/s under the profiler; the event loop was idle "
        f"{prof['summary']['idle_pct']} % of the sampled time. Files: "
        + ", ".join(f"`{Path(f).relative_to(ROOT)}`" for f in prof["summary"]["files"]) + ".",
        "",
        "| self time by package | % of busy |",
        "|---|---|",
    ]
    out += [f"| {name} | {pct} |" for name, pct in prof["summary"]["self_by_package_pct_of_busy"]]
    out += ["", "| github_broker frame (inclusive) | % of busy |", "|---|---|"]
    out += [f"| {name} | {pct} |"
            for name, pct in prof["summary"]["github_broker_inclusive_pct_of_busy"]]
    return [*out, ""]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    s = results["settings"]
    figs = results["figures"]
    packages = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    lines = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`.venv/bin/python -m benchmarks.run`); do not edit by hand. "
        "How each figure is measured: `benchmarks/README.md`.",
        "",
        f"- Date: {m['date']}; commit {m['commit']}; total runtime {results['runtime_s']:.0f} s"
        f"{' (--quick)' if s['quick'] else ''}",
        f"- Machine: {m['cores']} cores ({m['cpu']}), {m['memory_gb']} GB, {m['os']}",
        f"- Python {m['python']}, Redis {m['redis']}; {packages}",
        f"- Load: {s['agents']} agents on one asyncio loop ({s['client']} HTTP/1.1 client, "
        f"kept-alive connections), {s['warmup_s']} s warm-up, {s['duration_s']} s measured; "
        "redis-server, the GitHub simulator, serve and the generator share the machine.",
        "",
    ]
    for section in (_throughput, _backlog, _latency, _costs, _sync, _webhooks, _profile):
        lines += section(figs)
    findings = results.get("findings", [])
    if findings:
        lines += ["## Observations", "", *[f"- {f}" for f in findings], ""]
    return "\n".join(lines)
