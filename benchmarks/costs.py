"""What one claim costs in Redis commands and round trips, and in GitHub calls."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from benchmarks.load import RawClient, agent_ids, run_sequential
from benchmarks.servers import KEYS, RedisServer, SimulatorProcess, wait_for_outbox_empty

#: Commands the benchmark itself sends while counting; never part of a claim.
OWN_COMMANDS = frozenset({"info", "monitor", "echo", "ping", "client|setinfo", "config|resetstat"})
#: MONITOR markers around the counted requests.
START_MARK, STOP_MARK = "bench-count-start", "bench-count-stop"
#: Seconds the write queue may take to drain a lifecycle's GitHub writes.
DRAIN_TIMEOUT_S = 120.0


class CommandLog:
    """Every command Redis runs between two markers, via MONITOR (scripts' own calls too)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.entries: list[tuple[str, str]] = []  # (client_type, command line)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        client = redis.Redis.from_url(self.server.url)
        counting = False
        with client.monitor() as monitor:
            self._ready.set()
            for entry in monitor.listen():
                line = entry["command"]
                if line == f"ECHO {START_MARK}":
                    counting = True
                elif line == f"ECHO {STOP_MARK}":
                    return
                elif counting:
                    self.entries.append((entry["client_type"], line))

    def __enter__(self) -> CommandLog:
        self._thread.start()
        self._ready.wait(10)
        self.server.client().echo(START_MARK)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.client().echo(STOP_MARK)
        self._thread.join(30)

    def by_script(self) -> dict[str, dict[str, Any]]:
        """Per script SHA: calls, and the commands each call runs inside Redis."""
        out: dict[str, dict[str, Any]] = {}
        current: dict[str, Any] | None = None
        for client_type, line in self.entries:
            if client_type != "lua":
                name = line.split(" ", 2)
                current = None
                if name[0].upper() == "EVALSHA":
                    current = out.setdefault(name[1], {"calls": 0, "inner": Counter()})
                    current["calls"] += 1
            elif current is not None:
                current["inner"][line.split(" ", 1)[0].upper()] += 1
        return out


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    diff = {name: after.get(name, 0) - before.get(name, 0) for name in after}
    ordered = sorted(diff.items(), key=lambda p: -p[1])
    return {n: d for n, d in ordered if d and n not in OWN_COMMANDS}


def _counted(
    server: RedisServer, action: Callable[[], Any]
) -> tuple[Any, CommandLog, dict[str, int]]:
    before = server.command_calls()
    with CommandLog(server) as log:
        outcome = action()
    return outcome, log, _delta(before, server.command_calls())


def redis_per_claim(
    server: RedisServer, sim: SimulatorProcess, url: str, count: int
) -> dict[str, Any]:
    """Commands (all, incl. inside Lua) and round trips per claim; serve runs without poller,
    so every command counted comes from the requests."""
    run_sequential(url, flow="claim-complete", count=5)  # load scripts, cache the base branch
    sim.reset_stats()
    result, log, stats = _counted(
        server, lambda: run_sequential(url, flow="request-task", count=count)
    )
    claims = result.claims
    trips = sum(1 for kind, _ in log.entries if kind != "lua")
    scripts = log.by_script()
    claim_sha = max(scripts, key=lambda sha: scripts[sha]["calls"]) if scripts else ""
    original = {
        "claims": claims,
        "commands_per_claim": sum(stats.values()) / claims,
        "round_trips_per_claim": trips / claims,
        "commandstats_delta": stats,
        "github_calls_during_claims": sim.stats()["total"],
    }
    result, log, stats = _counted(
        server, lambda: run_sequential(url, flow="claim-complete", count=count)
    )
    cycles = result.claims
    per_script = {
        ("claim" if sha == claim_sha else "complete"): {
            "calls": v["calls"],
            "inner_commands_per_call": sum(v["inner"].values()) / max(1, v["calls"]),
            "inner": dict(v["inner"].most_common()),
        }
        for sha, v in log.by_script().items()
    }
    explicit = {
        "cycles": cycles,
        "commands_per_cycle": sum(stats.values()) / cycles,
        "round_trips_per_cycle": sum(1 for kind, _ in log.entries if kind != "lua") / cycles,
        "commandstats_delta": stats,
        "per_script": per_script,
    }
    return {"request_task_flow": original, "explicit_flow": explicit}


async def _claim_each(url: str, agent_ids: list[str]) -> list[dict[str, Any]]:
    async def one(agent_id: str) -> dict[str, Any]:
        client = RawClient(url)
        try:
            status, body = await client.post("/request-task", {"agent_id": agent_id})
            if status != 200:
                raise RuntimeError(f"claim for {agent_id} answered {status}: {body[:200]!r}")
            return dict(json.loads(body))
        finally:
            await client.close()

    return [await one(agent_id) for agent_id in agent_ids]


async def _complete_each(url: str, tasks: list[tuple[str, dict[str, Any]]]) -> None:
    client = RawClient(url)
    try:
        for agent_id, task in tasks:
            path = f"/tasks/{task['repository']}/{task['issue_id']}/complete"
            status, body = await client.post(
                path, {"agent_id": agent_id, "token": task["lease"]["token"]}
            )
            if status != 200:
                raise RuntimeError(f"complete answered {status}: {body[:200]!r}")
    finally:
        await client.close()


def claim_and_complete(url: str, count: int) -> None:
    """`count` new agents each claim a task and complete it (explicit flow)."""
    agents = agent_ids(count, "life")
    tasks = asyncio.run(_claim_each(url, agents))
    asyncio.run(_complete_each(url, list(zip(agents, tasks, strict=True))))


def _github_delta(sim: SimulatorProcess) -> dict[str, Any]:
    stats = sim.stats()
    writes = sum(n for method, n in stats["by_method"].items() if method != "GET")
    # "counted": what GitHub charges (304s are free); GraphQL label mutations are POSTs.
    return {
        "total": stats["total"],
        "counted": stats["rate_limited_cost"],
        "writes": writes,
        "not_found": stats["by_status"].get("404", 0),
        "by_route": stats["by_route"],
        "by_method": stats["by_method"],
    }


def github_per_lifecycle(
    client: redis.Redis, sim: SimulatorProcess, url: str, count: int
) -> dict[str, Any]:
    """GitHub calls of `count` claims, then of their completions, each until the write queue
    is empty. Agents hold a task for minutes, so the claim's writes land before the
    completion's, as here. Serve's periodic sync is switched off for this figure."""
    wait_for_outbox_empty(client, DRAIN_TIMEOUT_S)
    sim.reset_stats()
    agents = agent_ids(count, "life")
    tasks = asyncio.run(_claim_each(url, agents))
    claim_drain_s = wait_for_outbox_empty(client, DRAIN_TIMEOUT_S)
    claims = _github_delta(sim)
    sim.reset_stats()
    asyncio.run(_complete_each(url, list(zip(agents, tasks, strict=True))))
    complete_drain_s = wait_for_outbox_empty(client, DRAIN_TIMEOUT_S)
    completes = _github_delta(sim)
    return {
        "lifecycles": count,
        "per_claim": claims["total"] / count,
        "per_complete": completes["total"] / count,
        "per_lifecycle": (claims["total"] + completes["total"]) / count,
        "counted_per_lifecycle": (claims["counted"] + completes["counted"]) / count,
        "not_found": claims["not_found"] + completes["not_found"],
        "claim_writes": claims,
        "complete_writes": completes,
        "drain_s": {"claims": claim_drain_s, "completes": complete_drain_s},
        "outbox_key": KEYS.outbox,
    }
