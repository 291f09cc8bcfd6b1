"""The load generator: concurrent agents over HTTP (asyncio + httpx), timed per operation."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

#: How each agent loops. `request-task` is the original's flow: asking again completes the
#: held task. `claim-complete` reports completion explicitly with the lease token.
#: `claim-abandon` gives the task back on the next ask, so the backlog never shrinks.
#: `baseline` posts the same body to the baseline app.
FLOWS = ("request-task", "claim-complete", "claim-abandon", "baseline")
#: Seconds one HTTP request may take before it counts as an error.
REQUEST_TIMEOUT_S = 30.0


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

    def __init__(self, agent_id: str, url: str, client: httpx.AsyncClient, flow: str,
                 result: LoadResult, window: tuple[float, float]) -> None:
        self.agent_id = agent_id
        self.url = url
        self.client = client
        self.flow = flow
        self.result = result
        self.start, self.end = window

    async def _post(self, op: str, path: str, body: dict[str, Any]) -> httpx.Response | None:
        began = time.perf_counter()
        try:
            response = await self.client.post(self.url + path, json=body)
        except httpx.HTTPError as e:
            self.result.errors.append(f"{op}: {type(e).__name__}: {e}")
            return None
        done = time.perf_counter()
        if self.start <= done <= self.end:
            self.result.latencies_ms.setdefault(op, []).append((done - began) * 1000)
            self.result.statuses[f"{op} {response.status_code}"] += 1
            if response.status_code not in (200, 204):
                self.result.errors.append(f"{op}: {response.status_code} {response.text[:200]}")
        return response

    def _in_window(self) -> bool:
        return self.start <= time.perf_counter() <= self.end

    async def run(self) -> None:
        previous = "abandoned" if self.flow == "claim-abandon" else "completed"
        body = {"agent_id": self.agent_id, "previous": previous}
        while time.perf_counter() < self.end:
            response = await self._post("claim", "/request-task", body)
            if response is None or response.status_code not in (200, 204):
                await asyncio.sleep(0.05)  # don't spin on a failing server
                continue
            counted = self._in_window()
            if response.status_code == 204:
                self.result.empty += counted
                continue
            self.result.claims += counted
            if self.flow == "baseline":
                continue
            task = response.json()
            if counted and self.flow != "claim-abandon":
                self.result.issues[task["issue_id"]] += 1
            if self.flow == "claim-complete":
                path = f"/tasks/{task['repository']}/{task['issue_id']}/complete"
                token = task["lease"]["token"]
                await self._post("complete", path, {"agent_id": self.agent_id, "token": token})


async def _run(url: str, agents: int, flow: str, warmup_s: float, duration_s: float,
               probe: Callable[[], Any] | None) -> LoadResult:
    result = LoadResult(flow=flow, agents=agents, window_s=duration_s)
    limits = httpx.Limits(max_connections=agents, max_keepalive_connections=agents)
    tag = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        start = time.perf_counter() + warmup_s
        window = (start, start + duration_s)
        tasks = [
            asyncio.create_task(_Agent(f"bench-{tag}-{i:03d}", url, client, flow, result,
                                       window).run())
            for i in range(agents)
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


def run_load(url: str, *, agents: int, flow: str, warmup_s: float, duration_s: float,
             probe: Callable[[], Any] | None = None) -> LoadResult:
    """Run `agents` concurrent agents against `url` doing `flow`; `probe` is called at the
    window's start and end (e.g. to read the CPU of the server processes)."""
    if flow not in FLOWS:
        raise ValueError(f"unknown flow {flow!r}; one of {FLOWS}")
    return asyncio.run(_run(url, agents, flow, warmup_s, duration_s, probe))


async def _sequential(url: str, flow: str, count: int) -> LoadResult:
    result = LoadResult(flow=flow, agents=1, window_s=0.0)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        agent = _Agent(f"solo-{os.getpid()}-{int(time.time()) % 10**6}", url, client, flow,
                       result, (0.0, float("inf")))
        began = time.perf_counter()
        body = {"agent_id": agent.agent_id, "previous": "completed"}
        for _ in range(count):
            response = await agent._post("claim", "/request-task", body)
            if response is None or response.status_code != 200:
                continue
            result.claims += 1
            if flow == "claim-complete":
                task = response.json()
                path = f"/tasks/{task['repository']}/{task['issue_id']}/complete"
                token = task["lease"]["token"]
                await agent._post("complete", path, {"agent_id": agent.agent_id, "token": token})
        result.window_s = time.perf_counter() - began
    return result


def run_sequential(url: str, *, flow: str, count: int) -> LoadResult:
    """One agent, one request at a time: latency with no load."""
    return asyncio.run(_sequential(url, flow, count))
