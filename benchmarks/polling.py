"""Sync passes as the CLI runs them (`github-broker sync`): wall time, CPU, GitHub calls."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from typing import Any

from benchmarks.servers import RedisServer, SimulatorProcess

#: Seconds one sync pass may take at the least, and per issue of the data set on top: the
#: first sync of the 800,000-issue backlog took 448 s on one machine and outlasted a flat
#: 600 s on a slower one (the run was lost).
SYNC_TIMEOUT_S = 600.0
SYNC_TIMEOUT_PER_ISSUE_S = 0.003


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sync_pass(
    redis_server: RedisServer,
    sim: SimulatorProcess,
    env: dict[str, str],
    *,
    full: bool,
    issues: int = 0,
) -> dict[str, Any]:
    """One `github-broker sync [--full]` subprocess; its CPU comes from RUSAGE_CHILDREN."""
    argv = [sys.executable, "-m", "github_broker", "--log-level", "WARNING", "sync"]
    if full:
        argv.append("--full")
    sim.reset_stats()
    redis_cpu, sim_cpu = redis_server.cpu_s(), sim.cpu_s()
    cpu = _children_cpu_s()
    started = time.monotonic()
    done = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=SYNC_TIMEOUT_S + issues * SYNC_TIMEOUT_PER_ISSUE_S,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"sync failed ({done.returncode}):\n{done.stderr[-3000:]}")
    stats = sim.stats()
    return {
        "wall_s": wall,
        "broker_cpu_s": _children_cpu_s() - cpu,
        "redis_cpu_s": redis_server.cpu_s() - redis_cpu,
        "simulator_cpu_s": sim.cpu_s() - sim_cpu,
        "github_calls": stats["total"],
        "github_by_status": stats["by_status"],
        "report": done.stdout.strip(),
    }


def poll_passes(
    redis_server: RedisServer, sim: SimulatorProcess, env: dict[str, str], issues: int
) -> dict[str, Any]:
    """An unchanged pass, then one after 1 % of the issues were edited on GitHub."""
    unchanged = sync_pass(redis_server, sim, env, full=False)
    edited = max(1, issues // 100)
    # Spread over the backlog, as maintainers edit old and new issues alike.
    step = max(1, issues // edited)
    for number in range(1, issues + 1, step)[:edited]:
        sim.edit_issue(number, f"Edited issue {number}")
    changed = sync_pass(redis_server, sim, env, full=False)
    changed["issues_changed"] = edited
    return {"unchanged": unchanged, "one_percent_changed": changed}
