"""After the hand-out (issue 24): review submitted -> fix claimable with webhooks, and the
GitHub calls that progress tracking spends per held task, with and without webhooks."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import redis

from benchmarks import webhooks
from benchmarks.load import RawClient, agent_ids, percentile
from benchmarks.servers import (
    KEYS,
    NAME,
    OWNER,
    HTTPServer,
    SimulatorProcess,
    size,
    wait_for_outbox_empty,
)
from github_broker.clock import ms_from_iso
from github_broker.gateway.progress import PAGE as PROGRESS_PAGE
from github_broker.gateway.progress import HeldBranch, progress_document
from github_broker.simulator.graphql_query import Parser as QueryParser
from github_broker.simulator.graphql_query import points

#: review.fix_debounce_s of the fix figure: new feedback becomes a fix task once no comment
#: arrived for this long (production's default is 60 s).
FIX_DEBOUNCE_S = 1.0
#: The webhook worker's GitHub budget, lifted in both figures: at its default (500 calls an
#: hour, 50 at once) the samples' review upkeep would wait for the budget, not for the broker.
UNLIMITED_BUDGET = {
    "GITHUB_BROKER_WEBHOOKS__GITHUB_CALLS_PER_HOUR": str(10**9),
    "GITHUB_BROKER_WEBHOOKS__GITHUB_BURST": str(10**6),
}
#: Tokens of `simserver --people`.
MAINTAINER_TOKEN, AGENT_TOKEN = "maintainer-token", "agent-token"
MAINTAINER_REVIEW_ROUTE = "POST /repos/{owner}/{repo}/pulls/{number}/reviews"
#: Seconds a sample's fix may take beyond the debounce before it counts as lost.
FIX_TIMEOUT_S = 15.0
#: Seconds the set-up steps (reviews offered, write queue drained) may take.
SETUP_TIMEOUT_S = 120.0
#: Held tasks of the progress figure, all in one repository.
HELD_TASKS = 20
#: Production's progress intervals (s): a held branch is read every BRANCH_CHECK_S while
#: webhooks are not healthy, and the held tasks are looked at every CHECK_S (with the open
#: pull requests listed once per look).
BRANCH_CHECK_S = 300.0
CHECK_S = 15.0
#: Simulated seconds between two pushes to each held branch (an agent at work).
PUSH_EVERY_S = 600.0
BRANCH_ROUTE = "GET /repos/{owner}/{repo}/git/ref/{ref}"
PULLS_ROUTE = "GET /repos/{owner}/{repo}/pulls"
#: The progress read of every held task at once (gateway/progress.py).
GRAPHQL_ROUTE = "POST /graphql"


def _github(sim: SimulatorProcess, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=sim.base_url, timeout=30, headers={"Authorization": f"token {token}"}
    )


def _repo_path() -> str:
    return f"/repos/{OWNER}/{NAME}"


def _leader(client: redis.Redis) -> str | None:
    value = client.get("gb:leader")
    return None if value is None else str(value)


def _wait(what: str, done: Any, timeout_s: float = SETUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.05)


async def _claim(url: str, agents: list[str]) -> list[dict[str, Any]]:
    client = RawClient(url)
    try:
        tasks = []
        for agent in agents:
            status, body = await client.post("/request-task", {"agent_id": agent})
            if status != 200:
                raise RuntimeError(f"{agent} got {status}: {body[:200]!r}")
            tasks.append(json.loads(body))
        return tasks
    finally:
        await client.close()


async def _finish(url: str, verb: str, pairs: list[tuple[str, dict[str, Any]]]) -> None:
    client = RawClient(url)
    try:
        for agent, task in pairs:
            path = f"/tasks/{task['repository']}/{task['issue_id']}/{verb}"
            payload = {"agent_id": agent, "token": task["lease"]["token"]}
            if verb == "release":
                payload["reason"] = "abandoned"
            status, body = await client.post(path, payload)
            if status != 200:
                raise RuntimeError(f"{verb} of #{task['issue_id']}: {status} {body[:200]!r}")
    finally:
        await client.close()


# --- review submitted -> fix claimable ----------------------------------------------------


def fix_figure(bench: Any, sim: SimulatorProcess, env: dict[str, str], samples: int) -> None:
    """Every issue is developed (a PR by the agent's account), reviewed by an agent, then a
    maintainer requests changes on its PR, one issue at a time: the time from that review
    until `fix:{n}` is claimable. Set-up runs on a serve polling every second (reviews
    offered quickly); the samples on a serve whose poll never comes (every hour), so only the
    webhook delivery and the debounce timer it arms can make the fix."""
    o = bench.options
    client = bench.redis.client()
    review_env = {
        **env,
        "GITHUB_BROKER_WEBHOOKS__SECRET": webhooks.SECRET,
        "GITHUB_BROKER_REVIEW__DELAY_S": "0",
        "GITHUB_BROKER_REVIEW__TIMEOUT_S": "3600",
        "GITHUB_BROKER_REVIEW__FIX_DEBOUNCE_S": str(FIX_DEBOUNCE_S),
        **UNLIMITED_BUDGET,
    }
    with bench.serve(review_env, 1) as server:
        pulls = _reviewed(server, sim, client, samples)
        leader = _leader(client)
    with bench.serve(
        review_env,
        1,
        GITHUB_BROKER_POLL__INTERVAL_S="3600",
        GITHUB_BROKER_POLL__INTERVAL_WITH_WEBHOOKS_S="3600",
    ) as server:
        _wait("a new poller leader", lambda: _leader(client) not in (None, leader))
        webhooks.hook(sim, server)
        time.sleep(1.0)  # the ping lands and the start-up pass (sync, review upkeep) is over
        row = _fix_samples(sim, client, pulls)
    bench.add(
        "after_handout",
        {
            "figure": "review submitted -> fix claimable (webhooks)",
            "detail": f"review.fix_debounce_s {FIX_DEBOUNCE_S:g}; poll every hour; the webhook "
            "worker's GitHub budget lifted",
            **row,
            "reproduce": o.reproduce("after-handout"),
        },
    )


def _reviewed(
    server: HTTPServer, sim: SimulatorProcess, client: redis.Redis, count: int
) -> dict[int, int]:
    """`count` issues claimed, given a PR each, completed, reviewed by another agent and
    that review completed; returns issue -> PR number."""
    devs = agent_ids(count, "dev")
    tasks = asyncio.run(_claim(server.url, devs))
    wait_for_outbox_empty(client, SETUP_TIMEOUT_S)  # the task branches exist
    pulls = {}
    with _github(sim, AGENT_TOKEN) as http:
        for task in tasks:
            answer = http.post(
                f"{_repo_path()}/pulls",
                json={
                    "title": f"Work on #{task['issue_id']}",
                    "head": task["branch_name"],
                    "base": task["base_branch"] or "main",
                    "body": f"Closes #{task['issue_id']}",
                },
            )
            answer.raise_for_status()
            pulls[int(task["issue_id"])] = int(answer.json()["number"])
    asyncio.run(_finish(server.url, "complete", list(zip(devs, tasks, strict=True))))
    members = [f"review:{n}" for n in pulls]
    _wait(
        "every review offered",
        lambda: all(client.zscore(KEYS.ready, m) is not None for m in members),
    )
    reviewers = agent_ids(count, "rev")
    reviews = asyncio.run(_claim(server.url, reviewers))
    kinds = {t["task_type"] for t in reviews}
    if kinds != {"review"}:
        raise RuntimeError(f"reviewers got {kinds} tasks, expected reviews only")
    asyncio.run(_finish(server.url, "complete", list(zip(reviewers, reviews, strict=True))))
    wait_for_outbox_empty(client, SETUP_TIMEOUT_S)
    return pulls


def _fix_samples(
    sim: SimulatorProcess, client: redis.Redis, pulls: dict[int, int]
) -> dict[str, Any]:
    before = sim.stats()
    latencies, after_due, lost = [], [], 0
    with _github(sim, MAINTAINER_TOKEN) as http:
        for n, pr in pulls.items():
            # Review times have GitHub's one-second resolution: a random phase per sample.
            time.sleep(random.uniform(0, 1))
            started = time.monotonic()
            answer = http.post(
                f"{_repo_path()}/pulls/{pr}/reviews",
                json={"event": "REQUEST_CHANGES", "body": f"Please rename the helper in #{n}."},
            )
            answer.raise_for_status()
            due_s = ms_from_iso(answer.json()["submitted_at"]) / 1000 + FIX_DEBOUNCE_S
            member = f"fix:{n}"
            while client.zscore(KEYS.ready, member) is None:
                if time.monotonic() - started > FIX_DEBOUNCE_S + FIX_TIMEOUT_S:
                    lost += 1
                    break
                time.sleep(0.002)
            else:
                latencies.append(1000 * (time.monotonic() - started))
                after_due.append(1000 * (time.time() - due_s))
    after = sim.stats()
    own = after["by_route"].get(MAINTAINER_REVIEW_ROUTE, 0) - before["by_route"].get(
        MAINTAINER_REVIEW_ROUTE, 0
    )
    calls = after["total"] - before["total"] - own
    return {
        "samples": len(pulls),
        "lost": lost,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies) if latencies else None,
        "after_due_p50_ms": percentile(after_due, 0.5),
        "after_due_p99_ms": percentile(after_due, 0.99),
        "github_calls_per_fix": calls / len(pulls) if pulls else None,
    }


# --- GitHub calls of progress tracking per held task ------------------------------------


def progress_figures(bench: Any, sim: SimulatorProcess, env: dict[str, str]) -> None:
    """HELD_TASKS held tasks whose branches get a push every PUSH_EVERY_S (simulated); the
    progress routes' calls over a window, per held task per hour. Time runs `speedup` times
    faster than production's (both progress intervals divided by it) so that the window
    covers several branch reads: an hour of calls is the window's x 3600 / (window x
    speedup)."""
    o = bench.options
    speed = o.progress_speedup
    fast = {
        **env,
        **UNLIMITED_BUDGET,
        "GITHUB_BROKER_POLL__INTERVAL_S": "3600",  # no sync pass in the window
        "GITHUB_BROKER_PROGRESS__CHECK_INTERVAL_S": f"{CHECK_S / speed:g}",
        "GITHUB_BROKER_PROGRESS__BRANCH_CHECK_INTERVAL_S": f"{BRANCH_CHECK_S / speed:g}",
    }
    client = bench.redis.client()
    leader = None
    for mode in ("polling (no webhooks)", "webhooks"):
        extra = {"GITHUB_BROKER_WEBHOOKS__SECRET": webhooks.SECRET} if mode == "webhooks" else {}
        with bench.serve(fast, 1, **extra) as server:
            _wait(
                "a new poller leader", lambda before=leader: _leader(client) not in (None, before)
            )
            leader = _leader(client)
            if extra:
                webhooks.hook(sim, server)
            row = _progress_window(bench, server, sim, client, speed)
        bench.add(
            "progress_calls", {"mode": mode, **row, "reproduce": o.reproduce("after-handout")}
        )


def _progress_window(
    bench: Any, server: HTTPServer, sim: SimulatorProcess, client: redis.Redis, speed: float
) -> dict[str, Any]:
    o = bench.options
    agents = agent_ids(HELD_TASKS, "held")
    tasks = asyncio.run(_claim(server.url, agents))
    try:
        wait_for_outbox_empty(client, SETUP_TIMEOUT_S)  # branches made: their reads are over
        with _pushing(sim, [t["branch_name"] for t in tasks], PUSH_EVERY_S / speed) as pushes:
            # One branch interval: every held branch has been read once since its claim.
            time.sleep(BRANCH_CHECK_S / speed + 1.0)
            before, pushed = sim.stats(), pushes[0]
            time.sleep(o.progress_window_s)
            after, pushed = sim.stats(), pushes[0] - pushed
        leases = size(client, KEYS.leases)
    finally:
        asyncio.run(_finish(server.url, "release", list(zip(agents, tasks, strict=True))))
    routes = {
        route: after["by_route"].get(route, 0) - before["by_route"].get(route, 0)
        for route in after["by_route"]
    }
    routes = {k: v for k, v in routes.items() if v}
    total = after["total"] - before["total"]
    not_modified = after["by_status"].get("304", 0) - before["by_status"].get("304", 0)
    counted = after["rate_limited_cost"] - before["rate_limited_cost"]
    hour = 3600 / (o.progress_window_s * speed) / HELD_TASKS  # per held task per hour
    return {
        "held_tasks": HELD_TASKS,
        "speedup": speed,
        "window_s": o.progress_window_s,
        "simulated_s": o.progress_window_s * speed,
        "pushes": pushed,
        "calls": total,
        "calls_304": not_modified,
        "counted_calls": counted,
        "by_route": routes,
        "per_task_hour": total * hour,
        "counted_per_task_hour": counted * hour,
        "branch_reads_per_task_hour": routes.get(BRANCH_ROUTE, 0) * hour,
        "pull_lists_per_task_hour": routes.get(PULLS_ROUTE, 0) * hour,
        "graphql_reads_per_task_hour": routes.get(GRAPHQL_ROUTE, 0) * hour,
        "graphql_points_per_read": progress_points(HELD_TASKS),
        "other_calls": total
        - sum(routes.get(r, 0) for r in (BRANCH_ROUTE, PULLS_ROUTE, GRAPHQL_ROUTE)),
        "leases_during": leases,
    }


def progress_points(tasks: int) -> int:
    """GitHub's rate-limit points of the progress read of `tasks` held tasks (the points of
    its pages, by the rule the simulator applies: simulator/graphql_query.py `points`)."""
    held = [HeldBranch(f"{OWNER}/{NAME}", n, f"feature/issue-{n}") for n in range(1, tasks + 1)]
    total = 0
    for i in range(0, tasks, PROGRESS_PAGE):
        document, variables, _ = progress_document(held[i : i + PROGRESS_PAGE])
        total += points(QueryParser(document).document(), variables)
    return total


@contextmanager
def _pushing(sim: SimulatorProcess, branches: list[str], every_s: float) -> Iterator[list[int]]:
    """A thread pushing a commit to each branch every `every_s`, spread evenly; yields a
    one-item list counting the pushes made."""
    count = [0]
    stop = threading.Event()
    gap = every_s / len(branches)

    def run() -> None:
        with httpx.Client(base_url=sim.base_url, timeout=30) as http:
            i = 0
            while not stop.wait(gap):
                branch = branches[i % len(branches)]
                http.post(
                    f"/_sim/repos/{OWNER}/{NAME}/push",
                    json={"branch": branch, "message": f"Work in progress {i}"},
                ).raise_for_status()
                count[0] += 1
                i += 1

    thread = threading.Thread(target=run, name="bench-pushes", daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join(30)
