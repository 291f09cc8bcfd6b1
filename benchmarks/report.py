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
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in cpuinfo.splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kb = next(
        (int(line.split()[1]) for line in meminfo.splitlines() if line.startswith("MemTotal")), 0
    )
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
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
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


def _script(stats: dict[str, Any] | None) -> str:
    """Claim script µs: median / mean (range over the repetitions) / p99."""
    if (
        not stats
        or not isinstance(stats.get("mean_us"), dict)
        or stats["mean_us"].get("median") is None
    ):
        return "-"
    return (
        f"{_n(stats['median_us']['median'], 0)} / {_mid(stats['mean_us'], 0)} "
        f"/ {_n(stats['p99_us']['median'], 0)}"
    )


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
        "script (`benchmarks/baseline.py`): a FastAPI route and a bare ASGI app on redis-py's "
        "asyncio client, and the same bare ASGI app on serve's own pipelined Redis client "
        "(`asgi-pipelined`, the fairest ceiling: what separates it from serve is the broker's "
        "own logic), all served by the same process model as serve. Every variant of one "
        "worker count "
        f"runs {rows[0]['runs']} times in turn (the order rotating); figures are medians with "
        "the range in brackets, and each x baseline is the median of the per-repetition ratios "
        "against the baseline measured in the same repetition. Split: established connections "
        "per worker process, per repetition. Lua µs/call: Redis's time per EVALSHA of any script "
        "(INFO commandstats); claim.lua µs: median / mean / p99 time of one claim script call "
        "inside Redis (settle+claim in `request-task`, the explicit claim in `claim-complete`; "
        "SLOWLOG at 15 µs: every claim call, hardly any of the commands inside scripts, which "
        "Redis logs too and which at 0 µs cost Redis CPU in the measured runs). SLOWLOG times "
        "each call apart, by the script's SHA, so the mean is the claim script's own; "
        "commandstats only sums every EVALSHA. The durations are wall time: a call during "
        "which Redis waited for a core counts whole, which is why the mean exceeds the median "
        "on a shared machine. "
        "Foreign: CPU (% of one core) used by everything outside the measured processes, per "
        "repetition.",
        "",
        "| server | workers | flow | claims/s | requests/s | x FastAPI | x ASGI "
        "| x ASGI pipelined "
        "| claim p50 / p99 ms | complete p50 / p99 ms | server CPU | Redis CPU | Lua µs/call "
        "| claim.lua µs median / mean / p99 "
        "| split | foreign CPU % | reproduce |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["cpu_pct"]
        out.append(
            f"| {r['server']} | {r['workers']} | {r['flow']} | {_mid(r['claims_per_s'], 0)} "
            f"| {_mid(r['requests_per_s'], 0)} | {_mid(r.get('ratio_to_fastapi'), 2)} "
            f"| {_mid(r.get('ratio_to_asgi'), 2)} | {_mid(r.get('ratio_to_asgi_pipelined'), 2)} "
            f"| {_ms(r['ops'].get('claim'))} "
            f"| {_ms(r['ops'].get('complete'))} | {_n(cpu.get('server'), 0)} % "
            f"| {_n(cpu.get('redis'), 0)} % | {_n(r.get('lua_us_per_call'), 0)} "
            f"| {_script(r.get('claim_script'))} | {_split(r['connection_split'])} "
            f"| {', '.join(_n(f, 0) for f in r['foreign_cpu_pct'])} "
            f"| {_code(r['reproduce'])} |"
        )
    scaling = [r for r in rows if r.get("ratio_to_1_worker")]
    notes = [
        f"- serve 2 workers, `{r['flow']}`: {r['ratio_to_1_worker']:.2f} x the requests/s "
        "of 1 worker"
        for r in scaling
    ]
    notes += [
        f"- {r['server']} {r['workers']}w {r['flow']}: {r['warning']}"
        for r in rows
        if r.get("warning")
    ]
    return [*out, "", *notes, *([""] if notes else [])]


#: Which throughput flow runs each script-cost flow (`lua_cost.FLOWS`) under load.
LOADED_FLOW = {"settle+claim": "request-task", "claim": "claim-complete"}


def _under_load(figs: dict[str, Any], flow: str) -> float | None:
    """The claim script's mean µs under load (serve, 1 worker) in the throughput runs."""
    for r in figs.get("throughput", []):
        if r["server"] == "serve" and r["workers"] == 1 and r["flow"] == LOADED_FLOW[flow]:
            mean = ((r.get("claim_script") or {}).get("mean_us") or {}).get("median")
            return float(mean) if mean is not None else None
    return None


def _script_cost(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("script", [])
    if not rows:
        return []
    out = [
        f"## The claim script alone: claim.lua on an idle Redis, {rows[0]['open_issues']:,} "
        "ready issues",
        "",
        "`benchmarks/lua_cost.py` on a redis-server of its own, nothing else running against "
        "it: blocks of calls, each after `CONFIG RESETSTAT`; µs per `EVALSHA` from `INFO "
        "commandstats` (Redis's time inside the script), the server's CPU µs per call (its main "
        "thread's run time from `/proc`, request parsing and reply included, time waiting for a "
        "core not), and the commands each call runs inside the script; median (range) over the "
        "blocks. settle+claim: one agent asking again with `previous=completed` (its held "
        "development task completed, the next one claimed); claim: a new agent per call. Under "
        "load: the throughput table's mean for the same flow (serve, 1 worker), and its ratio to "
        "the idle median.",
        "",
        "| flow | calls | µs inside Redis | server CPU µs | commands | mean under load µs "
        "| under load ÷ idle | reproduce |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        loaded = _under_load(figs, r["flow"])
        ratio = loaded / r["us"]["median"] if loaded and r["us"]["median"] else None
        out.append(
            f"| {r['flow']} | {r['calls']:,} | {_mid(r['us'], 0)} | {_mid(r['cpu_us'], 0)} "
            f"| {_n(r['commands'], 0)} | {_n(loaded, 0)} | {_n(ratio, 2)} "
            f"| {_code(r['reproduce'])} |"
        )
    return [*out, ""]


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
        out.append(
            f"| {r['poller']} | {r['open_issues']:,} | {r['in_review']:,} "
            f"| {_mid(r['claims_per_s'], 0)} "
            f"| {_ms(r['ops'].get('claim'))} | {_n(r['cpu_pct'].get('server'), 0)} % "
            f"| {_n(r.get('lua_us_per_call'), 0)} | {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def _latency(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("latency", [])
    if not rows:
        return []
    out = [
        "## Latency of one agent, no other load",
        "",
        "One request at a time over a kept-alive connection; serve's poller runs beside it as "
        "in production. Medians over the alternating repetitions; p99 x FastAPI and x ASGI "
        "pipelined: against the p99 of those baselines with the same workers.",
        "",
        "| server | workers | operation | p50 ms | p99 ms (range) | p99 x FastAPI "
        "| p99 x ASGI pipelined | samples | reproduce |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    base = {r["workers"]: r["p99_ms"] for r in rows if r["server"] == "baseline-fastapi"}
    piped = {r["workers"]: r["p99_ms"] for r in rows if r["server"] == "baseline-asgi-pipelined"}
    for r in rows:
        ratio = r["p99_ms"] / base[r["workers"]] if base.get(r["workers"]) else None
        to_piped = r["p99_ms"] / piped[r["workers"]] if piped.get(r["workers"]) else None
        out.append(
            f"| {r['server']} | {r['workers']} | {r['operation']} | {_n(r['p50_ms'], 2)} "
            f"| {_mid(r['p99_range_ms'], 2)} | {_n(ratio, 2)} | {_n(to_piped, 2)} "
            f"| {r['count']} | {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def _costs(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("costs", []) + figs.get("poll_costs", [])
    if not rows:
        return []
    out = ["## Cost per claim", "", "| figure | value | detail | reproduce |", "|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['figure']} | {_n(r['value'])} | {r['detail']} | {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def _checks(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("checks_calls", [])
    if not rows:
        return []
    lifecycle = next((r for r in figs.get("costs", []) if r["figure"].startswith("Counted")), None)
    beside = (
        f"Beside it, the counted GitHub calls of one issue's lifecycle (claim → complete): "
        f"{_n(lifecycle['value'])}."
        if lifecycle
        else "The lifecycle's counted calls are in the cost table of a full run."
    )
    out = [
        "## Done means green: GitHub requests per PR state change",
        "",
        "`benchmarks/checks.py`, in one process on the bench's Redis: PRs in review on the "
        "simulator (`main` requires `ci/test`), each through 4 state changes, all PRs at once, "
        "round after round: its check starts, fails (one annotation: a fix task), a new head "
        "is pushed (the fix withdrawn), the check passes (the review offered). Without "
        "webhooks the leader's checks pass runs once after each round; with webhooks the "
        "simulator's signed deliveries go through the broker's receiver and worker. Requests "
        "of the checks (GraphQL reads, required checks, annotations) per state change; the "
        "review upkeep those PR events and green PRs run is counted apart. " + beside,
        "",
        "| mode | PRs | state changes | fix tasks | reads / change | annotation reads "
        "| checks' requests / change | review upkeep calls | reproduce |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['mode']} | {r['prs']} | {r['state_changes']} | {r['fix_tasks']} "
            f"| {_n(r['reads_per_change'], 2)} | {r['annotation_reads']} "
            f"| {_n(r['per_change'], 2)} | {r['other_calls']} "
            f"| {_code(r['reproduce'])} |"
        )
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
        out.append(
            f"| {r['figure']} | {_n(r['wall_s'], 2)} | {_n(r['broker_cpu_s'], 2)} "
            f"| {_n(r['redis_cpu_s'], 2)} | {r['github_calls']:,} "
            f"| {_code(r['reproduce'])} |"
        )
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
        out.append(
            f"| {r['mode']} | {r['changes']} | {_n(r['p50_ms'])} | {_n(r['p99_ms'])} "
            f"| {_n(r['max_ms'])} | {_n(r['github_calls_per_change'], 2)} "
            f"| {_n(r['list_calls_per_change'], 2)} | {r['lost']} "
            f"| {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def _repositories(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("repositories", [])
    if not rows:
        return []
    first = rows[0]
    out = [
        "## Many repositories: request-task",
        "",
        f"{first['issues']} open issues in the last configured repository, the others empty, "
        "after the first sync finished. `request-task` in the `claim-abandon` flow (asking "
        f"again gives the held task back, so the {first['issues']} issues never run out), "
        f"{first['agents']} agents, serve with 1 worker and without its poller (the rows "
        "measure the request path; the poller's cost per repository is the sync table's). "
        "Every repository count has its own Redis, simulator and serve, running side by "
        f"side; their runs alternate, the order rotating, {first['runs']} times. x 1 "
        "repository: the median of the per-repetition ratios to the one-repository run of "
        "the same repetition and mode.",
        "",
        "| mode | repositories | requests/s | x 1 repository | claim p50 / p99 ms "
        "| 204 answers | server CPU | Redis CPU | Lua µs/call | reproduce |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['mode']} | {r['repositories']:,} | {_mid(r['requests_per_s'], 0)} "
            f"| {_mid(r['ratio_to_one'], 2)} | {_ms(r['ops'].get('claim'))} "
            f"| {r['no_task_204']} "
            f"| {_n(r['cpu_pct'].get('server'), 0)} % "
            f"| {_n(r['cpu_pct'].get('redis'), 0)} % "
            f"| {_n(r.get('lua_us_per_call'), 0)} | {_code(r['reproduce'])} |"
        )
    notes = [
        f"- {r['mode']}, {r['repositories']:,} repositories: {r['warning']}"
        for r in rows
        if r.get("warning")
    ]
    if any(r["no_task_204"] for r in rows):
        notes.insert(
            0,
            f"- 204 answers (all {first['issues']} tasks held by the other agents "
            "at that moment) are answered requests and count in requests/s.",
        )
    out += ["", *notes, *([""] if notes else [])]
    lat = figs.get("repositories_latency", [])
    if lat:
        out += [
            "One agent, one request at a time (the same flow, "
            f"{lat[0]['mode']}), {lat[0]['count'] // max(1, lat[0]['runs'])} requests per "
            "repetition; medians (ranges) over the alternating repetitions.",
            "",
            "| repositories | p50 ms | p99 ms | p50 x 1 repository | p99 x 1 repository "
            "| samples | 204 / errors | reproduce |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in lat:
            out.append(
                f"| {r['repositories']:,} | {_mid(r['p50_ms'], 2)} "
                f"| {_mid(r['p99_ms'], 2)} | {_mid(r['p50_ratio'], 2)} "
                f"| {_mid(r['p99_ratio'], 2)} | {r['count']} "
                f"| {r['no_task_204']} / {r['errors']} | {_code(r['reproduce'])} |"
            )
        out.append("")
    idle = figs.get("repositories_idle", [])
    if idle:
        out += [
            f"Idle long-poll cost: {idle[0]['agents']} agents each wait in one "
            "`request-task` (`wait_seconds` past the window) while every task is held by "
            "other agents, so nothing can be handed out. The agents start spread over one "
            "recheck period (`server.long_poll_recheck_s`, 5 s) and the window is the next "
            "period, so each waiting request rechecks once in it (serve reads the whole index "
            "of repositories with work only once subscribed, after a reconnect and every "
            "60 s: one GET per repository, rarely in the window). CPU "
            "of serve (1 worker, no poller) and of Redis over the window, % of one core, from "
            "the scheduler's nanosecond accounting, and the commands Redis ran per second. "
            "Every repository count is measured in the same window (each has its own serve "
            f"and Redis); medians (ranges) over {idle[0]['runs']} windows, x 1 repository "
            "per window.",
            "",
            "| repositories | serve CPU % | Redis CPU % | serve x 1 repository "
            "| Redis x 1 repository | Redis commands/s | answers | reproduce |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in idle:
            answers = ", ".join(f"{n}x {k}" for k, n in sorted(r["answers"].items()))
            out.append(
                f"| {r['repositories']:,} | {_mid(r['serve_cpu_pct'])} "
                f"| {_mid(r['redis_cpu_pct'])} | {_mid(r['serve_ratio'], 2)} "
                f"| {_mid(r['redis_ratio'], 2)} | {_mid(r['redis_commands_per_s'])} "
                f"| {answers} | {_code(r['reproduce'])} |"
            )
        out.append("")
    return out + _memory(figs)


def _memory(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("repositories_memory", [])
    if not rows:
        return []
    out = [
        "Memory per configured repository: resident memory (VmRSS) of each serve above (1 "
        "worker, no poller: an API worker) after its load runs, and what each configured "
        "repository beyond the first adds to it (target <= 0.05 MB; "
        "tests/test_memory_per_repository.py measures the same with tracemalloc).",
        "",
        "| repositories | serve RSS MB | MB per configured repository | reproduce |",
        "|---|---|---|---|",
    ]
    for r in rows:
        per = "" if r["mb_per_repository"] is None else f"{r['mb_per_repository']:.4f}"
        out.append(
            f"| {r['repositories']:,} | {r['rss_mb']:.1f} | {per} | {_code(r['reproduce'])} |"
        )
    out.append("")
    return out


def _first_sync(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("first_sync", [])
    if not rows:
        return []
    out = [
        "## First sync of many repositories, an agent waiting",
        "",
        "Serve (1 worker, with its poller) starts on an empty Redis; the issues are in the "
        "middle repository. One agent asks from the moment `/health` answers (long-polling; "
        "0.2 s after a 503, where the SDK would wait the 2 s of Retry-After). Times in "
        "seconds from serve's start: `/health` answering, the first repository mirrored "
        "(the sync's first pass under way), the one with work mirrored, the agent's first "
        "task, every repository mirrored. CPU from serve's start until every repository is "
        "mirrored (serve: the API worker and the poller, start-up included).",
        "",
        "| repositories | work in | serve up | first mirrored | work mirrored | first task "
        "| all mirrored | answered before the sync ended | answers | serve CPU s "
        "| Redis CPU s | GitHub calls | reproduce |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        answers = ", ".join(f"{n}x {k}" for k, n in sorted(r["answers"].items()))
        out.append(
            f"| {r['repositories']:,} | {r['work_in']} | {_n(r['serve_up_s'], 1)} "
            f"| {_n(r['first_mirrored_s'], 1)} | {_n(r['work_mirrored_s'], 1)} "
            f"| {_n(r['first_task_s'], 1)} | {_n(r['synced_s'], 1)} "
            f"| {'yes' if r['answered_before_sync_end'] else 'no'} | {answers} "
            f"| {_n(r['cpu_s']['serve'], 1)} | {_n(r['cpu_s']['redis'], 1)} "
            f"| {r['github_calls']:,} | {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def _after_handout(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("after_handout", [])
    calls = figs.get("progress_calls", [])
    if not rows and not calls:
        return []
    out = ["## After the hand-out: fixes and progress", ""]
    if rows:
        out += [
            "A maintainer submits a review requesting changes on a PR whose review task an "
            "agent has completed; measured from the review's API call until `fix:{n}` is in "
            "the ready set (polled every 2 ms), one PR at a time after a random pause of up to "
            "1 s (review times have GitHub's one-second resolution). After the debounce: from "
            "the moment the debounce ended (the review's `submitted_at` plus "
            "`review.fix_debounce_s`).",
            "",
            "| figure | samples | p50 ms | p99 ms | max ms | after the debounce p50 / p99 ms "
            "| GitHub calls / fix | lost | settings | reproduce |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            out.append(
                f"| {r['figure']} | {r['samples']} | {_n(r['p50_ms'], 0)} "
                f"| {_n(r['p99_ms'], 0)} | {_n(r['max_ms'], 0)} "
                f"| {_n(r['after_due_p50_ms'], 0)} / {_n(r['after_due_p99_ms'], 0)} "
                f"| {_n(r['github_calls_per_fix'], 1)} | {r['lost']} | {r['detail']} "
                f"| {_code(r['reproduce'])} |"
            )
        out.append("")
    if calls:
        first = calls[0]
        out += [
            f"GitHub calls of progress tracking: {first['held_tasks']} held tasks in one "
            "repository, each branch pushed to every 10 minutes (simulated). Time runs "
            f"{first['speedup']:g} x faster than production's (`progress.check_interval_s` "
            "15 s and `progress.branch_check_interval_s` 300 s divided by it), so the "
            f"{first['window_s']:g} s window stands for {first['simulated_s'] / 60:g} minutes; "
            "calls are counted by the simulator on every route and scaled to an hour per held "
            "task. 304 answers are free on GitHub (not charged to the quota): *all* counts "
            "them, *counted* leaves them out. Without webhooks every held task's branch and "
            "PRs, in every repository, are read in one GraphQL request (a page per 100 tasks) "
            "per branch interval, so its share per task falls as tasks are added; its GraphQL "
            "rate-limit points are GitHub's rule applied to the request the broker sends. "
            "Branch reads and PR lists appear only after a failed GraphQL read.",
            "",
            "| mode | calls / held task / hour (all) | counted (not 304) | GraphQL reads "
            "| GraphQL points / read | branch reads | PR lists | other calls in the window "
            "| pushes in the window | reproduce |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in calls:
            out.append(
                f"| {r['mode']} | {_n(r['per_task_hour'], 1)} "
                f"| {_n(r['counted_per_task_hour'], 1)} "
                f"| {_n(r.get('graphql_reads_per_task_hour', 0), 2)} "
                f"| {r.get('graphql_points_per_read', '')} "
                f"| {_n(r['branch_reads_per_task_hour'], 1)} "
                f"| {_n(r['pull_lists_per_task_hour'], 1)} | {r['other_calls']} "
                f"| {r['pushes']} | {_code(r['reproduce'])} |"
            )
        out.append("")
    return out


def _durability(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("durability", [])
    if not rows:
        return []
    out = ["## Durable acknowledgements (`redis.durability`)", ""]
    skipped = [r for r in rows if r.get("skipped")]
    if skipped:
        return [*out, f"{skipped[0]['skipped']}; reproduce: {_code(skipped[0]['reproduce'])}", ""]
    out += [
        f"{rows[0]['agents']} agents, serve with 1 worker per setting (no poller), side by "
        "side. `none` and `replica` on the data set's Redis with a replica attached (both "
        "pay the replication stream: their ratio is the wait for the replica's "
        "acknowledgement); `aof` on a copy of the data set with its append-only file on as "
        "docs/operations.md asks (below Redis 7.2: `appendfsync always`), so its ratio is what "
        "the setting costs on the server it needs. The wait's bounds are the broker's "
        f"defaults. Runs alternate, the order rotating, {rows[0]['runs']} times; x none: the "
        "median of the per-repetition ratios to `none` with the same flow.",
        "",
        "| setting | flow | requests/s | x none | claim p50 / p99 ms | complete p50 / p99 ms "
        "| server CPU | Redis CPU | replica CPU | reproduce |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = r["cpu_pct"]
        out.append(
            f"| {r['setting']} | {r['flow']} | {_mid(r['requests_per_s'], 0)} "
            f"| {_mid(r['ratio_to_none'], 2)} | {_ms(r['ops'].get('claim'))} "
            f"| {_ms(r['ops'].get('complete'))} | {_n(cpu.get('server'), 0)} % "
            f"| {_n(cpu.get('redis'), 0)} % | {_n(cpu.get('replica'), 0)} % "
            f"| {_code(r['reproduce'])} |"
        )
    notes = sorted({n for r in rows for n in r.get("notes", [])})
    notes += [f"{r['setting']} `{r['flow']}`: {r['warning']}" for r in rows if r.get("warning")]
    return [*out, "", *[f"- {n}" for n in notes], *([""] if notes else [])]


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
        + ", ".join(f"`{Path(f).relative_to(ROOT)}`" for f in prof["summary"]["files"])
        + ".",
        "",
        "| self time by package | % of busy |",
        "|---|---|",
    ]
    out += [f"| {name} | {pct} |" for name, pct in prof["summary"]["self_by_package_pct_of_busy"]]
    out += ["", "| github_broker frame (inclusive) | % of busy |", "|---|---|"]
    out += [
        f"| {name} | {pct} |"
        for name, pct in prof["summary"]["github_broker_inclusive_pct_of_busy"]
    ]
    return [*out, ""]


def _graph(figs: dict[str, Any]) -> list[str]:
    rows = figs.get("graph", [])
    if not rows:
        return []
    out = [
        "## Reading the dependency graph (`github-broker sync` as a subprocess)",
        "",
        "1,000 open issues; with a graph, 100 of them blocked by another one (each dependent's "
        "summary says so; their links are read by GraphQL, `dependencies.batch` 50 per "
        "request). Counted: the requests GitHub charges to a quota (a `304` is free; GraphQL "
        "requests count against their own bucket).",
        "",
        "| pass | links | GitHub requests | counted | GraphQL | wall s | reproduce |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['figure']} | {r['links']} | {r['github_calls']:,} | {r['counted']:,} "
            f"| {r['graphql']} | {_n(r['wall_s'], 2)} | {_code(r['reproduce'])} |"
        )
    return [*out, ""]


def merged(results: dict[str, Any], findings: Any) -> dict[str, Any]:
    """`results` of a partial run (`--only ... --merge`) put into results/latest.json: its
    figure sections replace those of the last full run, the rest is kept, and the run is
    named under the header."""
    latest = json.loads((RESULTS_DIR / "latest.json").read_text())
    groups = [f"--only {g}" for g in results["settings"]["only"]]
    for section, rows in results["figures"].items():
        latest["figures"][section] = _merged_rows(latest["figures"].get(section, []), rows, groups)
    note = (
        f"{', '.join(results['settings']['only'])} re-measured on {results['machine']['date']}"
        f" (commit {results['machine']['commit']}, {results['runtime_s']:.0f} s) with "
        "`--merge`"
    )
    latest["merged"] = [*latest.get("merged", []), note]
    latest["findings"] = findings(latest["figures"])
    return dict(latest)


def _merged_rows(old: Any, rows: Any, groups: list[str]) -> Any:
    """A section several groups write (the sync table) keeps the other groups' rows, the new
    ones where the re-measured group's stood."""
    if not isinstance(old, list) or not all(isinstance(r, dict) and "reproduce" in r for r in old):
        return rows
    out: list[Any] = []
    placed = False
    for r in old:
        if not any(g in r["reproduce"] for g in groups):
            out.append(r)
        elif not placed:
            out += rows
            placed = True
    return out if placed else [*out, *rows]


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
        *[f"- {note}" for note in results.get("merged", [])],
        "",
    ]
    for section in (
        _throughput,
        _script_cost,
        _backlog,
        _latency,
        _costs,
        _sync,
        _graph,
        _webhooks,
        _repositories,
        _first_sync,
        _after_handout,
        _checks,
        _durability,
        _profile,
    ):
        lines += section(figs)
    findings = results.get("findings", [])
    if findings:
        lines += ["## Observations", "", *[f"- {f}" for f in findings], ""]
    return "\n".join(lines)
