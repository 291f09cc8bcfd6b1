"""Label-to-claimable latency and GitHub calls per change, with and without webhooks."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import httpx
import redis

from benchmarks.servers import KEYS, HTTPServer, SimulatorProcess

OWNER, NAME = "acme", "widgets"
SECRET = "bench-webhook-secret"
LIST_ROUTE = "GET /repos/{owner}/{repo}/issues"
#: Issue numbers of the unlabelled targets start here (above any generated backlog).
FIRST_TARGET = 1_000_000
#: Seconds one label change may take to become claimable before the sample counts as lost.
SAMPLE_TIMEOUT_S = 30.0
BODY = "## Deliverables\n- the change\n\nBranch: feature/issue-xx\n"


def add_targets(sim: SimulatorProcess, count: int) -> list[int]:
    """Open issues with a role but no priority: mirrored, never claimable until labelled."""
    numbers = []
    with httpx.Client(timeout=30) as http:
        for i in range(count):
            number = FIRST_TARGET + i
            http.post(
                f"{sim.base_url}/_sim/issues",
                json={
                    "owner": OWNER,
                    "repo": NAME,
                    "title": f"Target {number}",
                    "body": BODY,
                    "labels": ["BACKENDCODER"],
                    "number": number,
                },
            ).raise_for_status()
            numbers.append(number)
    return numbers


def wait_mirrored(client: redis.Redis, numbers: list[int], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(client.sismember(KEYS.open, str(n)) for n in numbers):
        if time.monotonic() > deadline:
            raise RuntimeError("the target issues were never mirrored")
        time.sleep(0.05)


def hook(sim: SimulatorProcess, server: HTTPServer) -> None:
    spec = {
        "url": f"{server.url}/github/webhook",
        "secret": SECRET,
        "repository": f"{OWNER}/{NAME}",
    }
    httpx.post(f"{sim.base_url}/_sim/webhooks", json=spec, timeout=10).raise_for_status()


def label_to_claimable(
    sim: SimulatorProcess, client: redis.Redis, numbers: list[int], jitter_s: float = 0.0
) -> dict[str, Any]:
    """Label each target P1 on the simulator, one at a time; time until its task is ready.
    A random pause of up to `jitter_s` before each change keeps the changes from locking
    onto the poll's phase (each would otherwise come right after a pass)."""
    stats = sim.stats()
    latencies, lost = [], 0
    with httpx.Client(timeout=30) as http:
        for n in numbers:
            time.sleep(random.uniform(0, jitter_s))
            started = time.monotonic()
            http.patch(
                f"{sim.base_url}/_sim/issues/{OWNER}/{NAME}/{n}", json={"add_labels": ["P1"]}
            ).raise_for_status()
            while client.zscore(KEYS.ready, f"development:{n}") is None:
                if time.monotonic() - started > SAMPLE_TIMEOUT_S:
                    lost += 1
                    break
                time.sleep(0.002)
            else:
                latencies.append(time.monotonic() - started)
    after = sim.stats()
    calls = after["total"] - stats["total"]
    lists = after["by_route"].get(LIST_ROUTE, 0) - stats["by_route"].get(LIST_ROUTE, 0)
    latencies.sort()
    return {
        "changes": len(numbers),
        "lost": lost,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
        if latencies
        else None,
        "max_ms": 1000 * latencies[-1] if latencies else None,
        "github_calls_per_change": calls / len(numbers),
        "list_calls_per_change": lists / len(numbers),
    }
