"""The load generator: concurrent agents over HTTP on one asyncio loop, timed per operation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from benchmarks.rawhttp import Connection, HTTPStatusError

#: How each agent loops. `request-task` is the original's flow: asking again completes the
#: held task. `claim-complete` reports completion explicitly with the lease token.
#: `claim-abandon` gives the task back on the next ask, so the backlog never shrinks.
#: `baseline` posts the same body to the baseline app.
FLOWS = ("request-task", "claim-complete", "claim-abandon", "baseline")
#: HTTP clients: `raw` (benchmarks.rawhttp, the default) or `httpx` (one client per agent;
#: a shared pool of 50 connections costs ~4 ms of CPU per request in httpx 0.28).
#: `raw-quickack` ACKs every response head at once (see rawhttp.Connection).
CLIENTS = ("raw", "httpx", "raw-quickack")
#: Seconds one HTTP request may take before it counts as an error.
REQUEST_TIMEOUT_S = 30.0


class Client(Protocol):
    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]: ...

    async def close(self) -> None: ...


class RawClient:
    def __init__(self, url: str, *, quickack: bool = False) -> None:
        parts = urlsplit(url)
        self._conn = Connection(parts.hostname or "127.0.0.1", parts.port or 80, quickack=quickack)

    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        return await asyncio.wait_for(
            self._conn.post(path, json.dumps(payload).encode()), REQUEST_TIMEOUT_S
        )

    async def close(self) -> None:
        await self._conn.close()


class HttpxClient:
    def __init__(self, url: str) -> None:
        self._client = httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT_S)

    async def post(self, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        response = await self._client.post(path, json=payload)
        return response.status_code, response.content

    async def close(self) -> None:
        await self._client.aclose()


def make_client(kind: str, url: str) -> Client:
    if kind not in CLIENTS:
        raise ValueError(f"unknown client {kind!r}; one of {CLIENTS}")
    if kind == "httpx":
        return HttpxClient(url)
    return RawClient(url, quickack=kind == "raw-quickack")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class LoadResult:
    """What happened inside the measuring window (warm-up excluded)."""

    flow: str
    agents: int
    window_s: float
    latencies_ms: dict[str, list[float]] = field(default_factory=dict)
    statuses: Counter[str] = field(default_factory=Counter)
    claims: int = 0
    empty: int = 0
    errors: list[str] = field(default_factory=list)
    issues: Counter[int] = field(default_factory=Counter)
    generator_cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ops = {
            name: {
                "count": len(values),
                "p50_ms": percentile(values, 0.50),
                "p99_ms": percentile(values, 0.99),
                "mean_ms": statistics.fmean(values) if values else None,
            }
            for name, values in self.latencies_ms.items()
        }
        return {
            "flow": self.flow,
            "agents": self.agents,
            "window_s": round(self.window_s, 3),
            "claims": self.claims,
            "claims_per_s": self.claims / self.window_s if self.window_s else 0.0,
            "no_task_204": self.empty,
            "errors": len(self.errors),
            "error_samples": self.errors[:3],
            "statuses": dict(self.statuses),
            "handed_out_twice": sum(1 for c in self.issues.values() if c > 1),
            "ops": ops,
            "generator_cpu_pct": 100 * self.generator_cpu_s / self.window_s if self.window_s else 0,
            **self.extra,
        }


class _Agent:
    """One agent's loop; records only operations that finish inside the window."""

    def __init__(
        self,
        agent_id: str,
        client: Client,
        flow: str,
        result: LoadResult,
        window: tuple[float, float],
    ) -> None:
        self.agent_id = agent_id
        self.client = client
        self.flow = flow
        self.result = result
        self.start, self.end = window
        #: (repository, issue, token) of the task this agent holds, if any.
        self.held: tuple[str, int, str] | None = None

    async def post(self, op: str, path: str, payload: dict[str, Any]) -> tuple[int, bytes]:
        began = time.perf_counter()
        try:
            status, body = await self.client.post(path, payload)
        except (httpx.HTTPError, HTTPStatusError, OSError, TimeoutError) as e:
            self.result.errors.append(f"{op}: {type(e).__name__}: {e}")
            return 0, b""
        done = time.perf_counter()
        if self.start <= done <= self.end:
            self.result.latencies_ms.setdefault(op, []).append((done - began) * 1000)
            self.result.statuses[f"{op} {status}"] += 1
            if status not in (200, 204):
                self.result.errors.append(f"{op}: {status} {body[:200]!r}")
        return status, body

    async def cycle(self, previous: str) -> None:
        """One claim (and, in the explicit flow, its completion)."""
        status, body = await self.post(
            "claim", "/request-task", {"agent_id": self.agent_id, "previous": previous}
        )
        counted = self.start <= time.perf_counter() <= self.end
        if status == 204:
            self.result.empty += counted
            self.held = None  # the request settled the held task
            return
        if status != 200:
            await asyncio.sleep(0.05)  # don't spin on a failing server
            return
        self.result.claims += counted
        if self.flow == "baseline":
            return
        task = json.loads(body)
        self.held = (task["repository"], task["issue_id"], task["lease"]["token"])
        if counted and self.flow != "claim-abandon":
            self.result.issues[task["issue_id"]] += 1
        if self.flow == "claim-complete":
            path = f"/tasks/{task['repository']}/{task['issue_id']}/complete"
            status, _ = await self.post(
                "complete", path, {"agent_id": self.agent_id, "token": task["lease"]["token"]}
            )
            if status == 200:
                self.held = None

    async def give_back(self) -> None:
        """Release the task still held, outside the window. Agent ids are unique per run, so
        no later run would ever settle it: each run's 50 last claims would stay leased for the
        whole lease TTL (600 s) and drain a small backlog (100 issues: empty after two runs)."""
        if self.held is None:
            return
        repository, number, token = self.held
        self.held = None
        with contextlib.suppress(httpx.HTTPError, HTTPStatusError, OSError, TimeoutError):
            await self.client.post(
                f"/tasks/{repository}/{number}/release",
                {"agent_id": self.agent_id, "token": token, "reason": "abandoned"},
            )

    async def run(self) -> None:
        previous = "abandoned" if self.flow == "claim-abandon" else "completed"
        try:
            while time.perf_counter() < self.end:
                await self.cycle(previous)
            await self.give_back()
        finally:
            await self.client.close()


def agent_ids(count: int, prefix: str) -> list[str]:
    # Unique per run, so no agent starts out holding a task from an earlier scenario.
    tag = f"{os.getpid()}-{time.time_ns() // 1_000_000 % 10**8}"
    return [f"{prefix}-{tag}-{i:03d}" for i in range(count)]


async def _run(
    url: str,
    agents: int,
    flow: str,
    client: str,
    warmup_s: float,
    duration_s: float,
    probe: Callable[[], Any] | None,
) -> LoadResult:
    result = LoadResult(flow=flow, agents=agents, window_s=duration_s)
    start = time.perf_counter() + warmup_s
    window = (start, start + duration_s)
    tasks = [
        asyncio.create_task(_Agent(agent_id, make_client(client, url), flow, result, window).run())
        for agent_id in agent_ids(agents, "bench")
    ]
    await asyncio.sleep(warmup_s)
    # The probe reads /proc; a thread keeps it from stalling the agents.
    before = await asyncio.to_thread(probe) if probe else None
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
    result.generator_cpu_s = time.process_time() - cpu0
    after = await asyncio.to_thread(probe) if probe else None
    await asyncio.gather(*tasks)
    if probe:
        result.extra["probe"] = {"before": before, "after": after}
    return result


def run_load(
    url: str,
    *,
    agents: int,
    flow: str,
    warmup_s: float,
    duration_s: float,
    client: str = "raw",
    probe: Callable[[], Any] | None = None,
) -> LoadResult:
    """Run `agents` concurrent agents against `url` doing `flow`; `probe` is called at the
    window's start and end (e.g. to read the CPU of the server processes)."""
    if flow not in FLOWS:
        raise ValueError(f"unknown flow {flow!r}; one of {FLOWS}")
    return asyncio.run(_run(url, agents, flow, client, warmup_s, duration_s, probe))


async def _sequential(url: str, flow: str, count: int, client: str) -> LoadResult:
    result = LoadResult(flow=flow, agents=1, window_s=0.0)
    agent = _Agent(
        agent_ids(1, "solo")[0], make_client(client, url), flow, result, (0.0, float("inf"))
    )
    began = time.perf_counter()
    previous = "abandoned" if flow == "claim-abandon" else "completed"
    try:
        for _ in range(count):
            await agent.cycle(previous)
        result.window_s = time.perf_counter() - began
        await agent.give_back()
    finally:
        await agent.client.close()
    return result


def run_sequential(url: str, *, flow: str, count: int, client: str = "raw") -> LoadResult:
    """One agent, one request at a time: latency with no load."""
    return asyncio.run(_sequential(url, flow, count, client))
