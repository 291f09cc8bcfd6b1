"""Many repositories (issue 28): request-task rate and single-agent latency, the idle
long-poll cost, and the first sync, at 1 to 1,000 configured repositories.

Every data set holds WORK_ISSUES open issues in its last repository and nothing in the
others, as the issue measured. Each gets a Redis, a simulator and a first sync of its own
(`github-broker sync --full`, a row of the sync table), then one serve per priority mode;
all of them run side by side and the load runs alternate between the data sets, the order
rotating each repetition, so the machine's drift hits every repository count alike (the idle
rows measure every data set in one window instead). Serve
runs without its poller here: the rows measure the request path, and at 1,000 repositories a
poller syncing every second (the bench's interval) would take a core of its own; its cost per
repository is what the sync rows show.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis

from benchmarks import polling
from benchmarks.load import RawClient, agent_ids, run_sequential
from benchmarks.servers import (
    HTTPServer,
    RedisServer,
    SimulatorProcess,
    broker_env,
    cpu_exact_s,
    cpu_seconds,
    rss_bytes,
    size,
    wait_for_ready,
)
from benchmarks.simserver import repo_names
from github_broker.keys import RepoKeys
from github_broker.settings import ServerSettings

logger = logging.getLogger("benchmarks")

#: Configured repositories of each data set.
REPO_COUNTS = (1, 30, 100, 300, 1000)
#: Open issues in the last repository (the others are empty).
WORK_ISSUES = 20
#: Concurrent agents of the request-rate rows (the issue's 20).
RATE_AGENTS = 20
#: Agents long-polling in the idle rows.
IDLE_AGENTS = 50
#: Seconds between two rechecks of a waiting request (`server.long_poll_recheck_s`, its
#: default): the idle agents start spread over one period and the window spans the next, so
#: each agent rechecks exactly once in it, whatever the phase. The index of repositories with
#: work is read whole only after each (re)subscription and every `repo_index.RELOAD_S`
#: (60 s, one GET per configured repository), so the window rarely holds one.
IDLE_PERIOD_S = float(ServerSettings.model_fields["long_poll_recheck_s"].default)
#: Seconds an idle long-poll outlasts the measured window (it then answers 204 by itself).
IDLE_TAIL_S = 0.5
#: Repetitions of the idle rows (each takes two periods, every data set at once).
IDLE_REPEATS = 5
#: Priority modes of the request-rate rows; latency and idle rows run in the first, the
#: issue's. The second runs at `Options.strict_repo_counts` only (a serve and a run per
#: count and repetition each: the counts the issue's targets name, to keep the run short).
MODES = ("best_effort", "strict")
#: Repositories of the first-sync figure, and where its work is: the middle one, so the
#: first claim can only come once about half of them are mirrored.
FIRST_SYNC_REPOS = 300
#: Seconds the first-sync agent waits after a 503 (the SDK honours Retry-After, 2 s; a short
#: pause shows when the broker could answer, not a client's backoff).
FIRST_SYNC_RETRY_S = 0.2
#: Seconds the first sync of FIRST_SYNC_REPOS may take before the figure gives up.
FIRST_SYNC_TIMEOUT_S = 600.0


def keys_of(full_name: str) -> RepoKeys:
    owner, name = full_name.split("/", 1)
    return RepoKeys("gb", owner, name)


@dataclass
class Stack:
    """One data set: its Redis, simulator, serve environment, and its serves per mode."""

    count: int
    bench: Any  #: a `scenarios.Bench` whose Redis is this data set's
    sim: SimulatorProcess
    env: dict[str, str]
    keys: RepoKeys
    serves: dict[str, HTTPServer] = field(default_factory=dict)


def many_env(
    redis_url: str, sim: SimulatorProcess, names: list[str], workdir: Any, **extra: str
) -> dict[str, str]:
    return broker_env(
        redis_url,
        sim.base_url,
        workdir / "no-config",
        GITHUB_BROKER_REPOSITORIES=",".join(names),
        GITHUB_BROKER_PRIORITY_MODE="best_effort",
        **extra,
    )


@contextmanager
def dataset(bench: Any, count: int) -> Iterator[tuple[Stack, dict[str, Any]]]:
    """`count` repositories, WORK_ISSUES issues in the last, synced by `sync --full`."""
    bench.redis.flush()
    names = repo_names(count)
    sim = SimulatorProcess(bench.workdir, WORK_ISSUES, repos=count).start()
    try:
        env = many_env(bench.redis.url, sim, names, bench.workdir)
        first = polling.sync_pass(bench.redis, sim, env, full=True)
        keys = keys_of(names[-1])
        wait_for_ready(bench.redis.client(), WORK_ISSUES, timeout_s=30, keys=keys)
        yield Stack(count, bench, sim, env, keys), first
    finally:
        sim.stop()


def repository_figures(bench: Any) -> None:
    """Request rate (RATE_AGENTS agents, each mode), single-agent latency and the idle
    long-poll cost at every repository count, as ratios to one repository."""
    o = bench.options
    rep = o.reproduce("repositories")
    counts = o.repo_counts
    with ExitStack() as started:
        stacks: list[Stack] = []
        for count in counts:
            logger.info("data set: %d repositories", count)
            companion = started.enter_context(bench.companion())
            stack, first = started.enter_context(dataset(companion, count))
            bench.add(
                "sync",
                {
                    "figure": f"first sync, {count:,} repositories, "
                    f"{WORK_ISSUES} issues in the last (`sync --full`)",
                    **first,
                    "reproduce": rep,
                },
            )
            stacks.append(stack)
        # The other modes' serves stop before the idle rows: each serve reloads the index
        # of every repository now and then, which would count in the idle Redis figures.
        others = started.enter_context(ExitStack())
        variants = [
            (stack, mode)
            for mode in MODES
            for stack in stacks
            if mode == MODES[0] or stack.count in o.strict_repo_counts
        ]
        for stack, mode in variants:
            stack.serves[mode] = (started if mode == MODES[0] else others).enter_context(
                bench.serve(
                    stack.env,
                    1,
                    GITHUB_BROKER_SERVER__RUN_POLLER="false",
                    GITHUB_BROKER_PRIORITY_MODE=mode,
                )
            )
        rates: dict[tuple[int, str], list[dict[str, Any]]] = {}
        solo: dict[int, list[dict[str, Any]]] = {}
        idle: dict[int, list[dict[str, Any]]] = {}
        for r in range(o.repeats):
            logger.info("repositories: repetition %d of %d", r + 1, o.repeats)
            for stack, mode in rotated(variants, r):
                row = stack.bench.load(
                    stack.serves[mode],
                    stack.sim,
                    "claim-abandon",
                    agents=RATE_AGENTS,
                    keys=stack.keys,
                )
                # As many agents as tasks: a 204 (all held at that moment) is expected here
                # and is a column of its own, not a warning.
                row["warning"] = "; ".join(
                    w for w in row["warning"].split("; ") if w and "ran dry" not in w
                )
                rates.setdefault((stack.count, mode), []).append(row)
            for stack in rotated(stacks, r):
                result = run_sequential(
                    stack.serves[MODES[0]].url,
                    flow="claim-abandon",
                    count=o.latency_samples,
                    client=o.client,
                )
                solo.setdefault(stack.count, []).append(result.summary())
        # After the load: each serve has handled claims, heartbeats and releases in the
        # repository with work, and read the index of every configured one.
        rss = {stack.count: rss_bytes(stack.serves[MODES[0]].pid) for stack in stacks}
        others.close()
        for _ in range(min(o.repeats, IDLE_REPEATS)):
            for count, row in idle_costs(stacks).items():
                idle.setdefault(count, []).append(row)
    _rows(bench, counts, rates, solo, idle, rep)
    _memory_rows(bench, rss, rep)


def _memory_rows(bench: Any, rss: dict[int, int], rep: str) -> None:
    """Resident memory of each serve (1 worker, no poller: an API worker) after the load, and
    what each configured repository beyond the first adds to it (issue 38: <= 0.05 MB)."""
    counts = sorted(rss)
    one = counts[0]
    for count in counts:
        extra = count - one
        bench.add(
            "repositories_memory",
            {
                "repositories": count,
                "rss_mb": round(rss[count] / 1e6, 1),
                "mb_per_repository": round((rss[count] - rss[one]) / extra / 1e6, 4)
                if extra
                else None,
                "reproduce": rep,
            },
        )


def rotated(items: list[Any], by: int) -> list[Any]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def _ratios(values: list[float | None], base: list[float | None]) -> list[float | None]:
    """Per repetition: value / the one-repository value of the same repetition."""
    return [v / b if v is not None and b else None for v, b in zip(values, base, strict=True)]


def _rows(
    bench: Any,
    counts: tuple[int, ...],
    rates: dict[tuple[int, str], list[dict[str, Any]]],
    solo: dict[int, list[dict[str, Any]]],
    idle: dict[int, list[dict[str, Any]]],
    rep: str,
) -> None:
    from benchmarks.scenarios import aggregate, spread

    one = counts[0]
    for mode in MODES:
        if (one, mode) not in rates:
            continue
        base = [r["requests_per_s"] for r in rates[(one, mode)]]
        for count in (c for c in counts if (c, mode) in rates):
            runs = rates[(count, mode)]
            row = aggregate(runs)
            row["ratio_to_one"] = spread(_ratios([r["requests_per_s"] for r in runs], base))
            bench.add(
                "repositories",
                {
                    **row,
                    "repositories": count,
                    "mode": mode,
                    "issues": WORK_ISSUES,
                    "reproduce": rep,
                },
            )
    base_p50 = [s["ops"]["claim"]["p50_ms"] for s in solo[one]]
    base_p99 = [s["ops"]["claim"]["p99_ms"] for s in solo[one]]
    for count in counts:
        runs = solo[count]
        p50 = [s["ops"]["claim"]["p50_ms"] for s in runs]
        p99 = [s["ops"]["claim"]["p99_ms"] for s in runs]
        bench.add(
            "repositories_latency",
            {
                "repositories": count,
                "mode": MODES[0],
                "runs": len(runs),
                "count": sum(s["ops"]["claim"]["count"] for s in runs),
                "p50_ms": spread(p50),
                "p99_ms": spread(p99),
                "p50_ratio": spread(_ratios(p50, base_p50)),
                "p99_ratio": spread(_ratios(p99, base_p99)),
                "no_task_204": sum(s["no_task_204"] for s in runs),
                "errors": sum(s["errors"] for s in runs),
                "reproduce": rep,
            },
        )
    base_serve = [r["cpu_pct"]["serve"] for r in idle[one]]
    base_redis = [r["cpu_pct"]["redis"] for r in idle[one]]
    for count in counts:
        runs = idle[count]
        serve = [r["cpu_pct"]["serve"] for r in runs]
        red = [r["cpu_pct"]["redis"] for r in runs]
        bench.add(
            "repositories_idle",
            {
                "repositories": count,
                "agents": IDLE_AGENTS,
                "runs": len(runs),
                "serve_cpu_pct": spread(serve),
                "redis_cpu_pct": spread(red),
                "serve_ratio": spread(_ratios(serve, base_serve)),
                "redis_ratio": spread(_ratios(red, base_redis)),
                "redis_commands_per_s": spread([r["redis_commands_per_s"] for r in runs]),
                "answers": _merge([r["answers"] for r in runs]),
                "reproduce": rep,
            },
        )


def _merge(counters: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for counter in counters:
        for k, v in counter.items():
            out[k] = out.get(k, 0) + v
    return out


# --- the idle long-poll cost --------------------------------------------------------------


def idle_costs(stacks: list[Stack]) -> dict[int, dict[str, Any]]:
    """Per data set: CPU of serve and Redis (% of one core) while IDLE_AGENTS agents
    long-poll and nothing is claimable (every task held by other agents meanwhile). Every
    data set is measured at once, in one window: idle costs are a few ms a second, too
    little for the data sets to disturb each other, and the same moment of the machine
    serves them all."""
    held = {stack.count: asyncio.run(_hold_all(stack)) for stack in stacks}
    try:

        def probe() -> dict[int, dict[str, float]]:
            out = {}
            for stack in stacks:
                redis_server: RedisServer = stack.bench.redis
                out[stack.count] = {
                    "serve": cpu_exact_s(stack.serves[MODES[0]].pid),
                    "redis": cpu_exact_s(redis_server.pid),
                    "commands": float(sum(redis_server.command_calls().values())),
                    "t": time.monotonic(),
                }
            return out

        before, after, answers = asyncio.run(_long_poll(stacks, IDLE_PERIOD_S, probe))
    finally:
        for stack in stacks:
            asyncio.run(_release(stack.serves[MODES[0]].url, held[stack.count]))
    out = {}
    for stack in stacks:
        b, a = before[stack.count], after[stack.count]
        window = a["t"] - b["t"]
        out[stack.count] = {
            "cpu_pct": {name: 100 * (a[name] - b[name]) / window for name in ("serve", "redis")},
            # INFO itself is one command per probe: left out.
            "redis_commands_per_s": (a["commands"] - b["commands"] - 1) / window,
            "answers": answers[stack.count],
        }
    return out


async def _hold_all(stack: Stack) -> list[tuple[str, dict[str, Any]]]:
    """One agent per claimable task claims it: nothing is left to hand out."""
    held = []
    client = RawClient(stack.serves[MODES[0]].url)
    try:
        for agent in agent_ids(WORK_ISSUES + 5, "holder"):
            status, body = await client.post("/request-task", {"agent_id": agent})
            if status != 200:
                break
            held.append((agent, json.loads(body)))
    finally:
        await client.close()
    ready = size(stack.bench.redis.client(), stack.keys.ready)
    if ready:
        raise RuntimeError(f"{ready} tasks still claimable after {len(held)} were held")
    return held


async def _release(url: str, held: list[tuple[str, dict[str, Any]]]) -> None:
    client = RawClient(url)
    try:
        for agent, task in held:
            path = f"/tasks/{task['repository']}/{task['issue_id']}/release"
            await client.post(
                path, {"agent_id": agent, "token": task["lease"]["token"], "reason": "abandoned"}
            )
    finally:
        await client.close()


async def _long_poll(
    stacks: list[Stack], period_s: float, probe: Callable[[], Any]
) -> tuple[Any, Any, dict[int, dict[str, int]]]:
    """IDLE_AGENTS agents per data set start one after the other over one period, each
    sending one request that waits past the window (the next period); `probe` is read
    around the window."""
    began = time.monotonic()
    ends = began + 2 * period_s + IDLE_TAIL_S
    clients: list[tuple[int, RawClient]] = []

    async def ask(i: int, client: RawClient, agent: str) -> int:
        await asyncio.sleep(i * period_s / IDLE_AGENTS)
        status, _ = await client.post(
            "/request-task", {"agent_id": agent, "wait_seconds": ends - time.monotonic()}
        )
        return status

    waiting: list[tuple[int, asyncio.Task[int]]] = []
    try:
        for stack in stacks:
            for i, agent in enumerate(agent_ids(IDLE_AGENTS, "idle")):
                client = RawClient(stack.serves[MODES[0]].url)
                clients.append((stack.count, client))
                waiting.append((stack.count, asyncio.create_task(ask(i, client, agent))))
        await asyncio.sleep(max(0.0, began + period_s - time.monotonic()))
        before = await asyncio.to_thread(probe)
        await asyncio.sleep(max(0.0, began + 2 * period_s - time.monotonic()))
        after = await asyncio.to_thread(probe)
        outcomes = await asyncio.gather(*(t for _, t in waiting), return_exceptions=True)
        answers: dict[int, dict[str, int]] = {stack.count: {} for stack in stacks}
        for (count, _), outcome in zip(waiting, outcomes, strict=True):
            key = str(outcome) if isinstance(outcome, int) else type(outcome).__name__
            answers[count][key] = answers[count].get(key, 0) + 1
    finally:
        for _, client in clients:
            await client.close()
    return before, after, answers


# --- the first sync of many repositories, with an agent waiting from the start -----------


def first_sync_figure(bench: Any) -> None:
    """Serve (with its poller) starts on an empty Redis with FIRST_SYNC_REPOS repositories;
    an agent asks from the moment /health answers. When does it get its first task, and
    when has every repository been mirrored?"""
    o = bench.options
    rep = o.reproduce("repositories")
    count = o.first_sync_repos
    work_in = count // 2
    names = repo_names(count)
    bench.redis.flush()
    sim = SimulatorProcess(bench.workdir, WORK_ISSUES, repos=count, work_in=work_in).start()
    try:
        env = many_env(
            bench.redis.url, sim, names, bench.workdir, GITHUB_BROKER_POLL__INTERVAL_S="60"
        )
        client = bench.redis.client()
        cpu0 = {"redis": bench.redis.cpu_s(), "simulator": sim.cpu_s()}
        started = time.monotonic()
        with bench.serve(env, 1) as server:
            up = time.monotonic() - started
            outcome = asyncio.run(_first_claim(server.url, client, names, work_in, started))
            # Serve's since it was spawned: its start-up, the API worker and the poller.
            cpu = {
                "serve": cpu_seconds(server.pid),
                "redis": bench.redis.cpu_s() - cpu0["redis"],
                "simulator": sim.cpu_s() - cpu0["simulator"],
            }
            calls = sim.stats()["total"]
    finally:
        sim.stop()
    bench.add(
        "first_sync",
        {
            "repositories": count,
            "work_in": names[work_in],
            "issues": WORK_ISSUES,
            "serve_up_s": up,
            **outcome,
            "cpu_s": cpu,
            "github_calls": calls,
            "answered_before_sync_end": outcome["first_task_s"] is not None
            and outcome["first_task_s"] < outcome["synced_s"],
            "reproduce": rep,
        },
    )


async def _first_claim(
    url: str, client: redis.Redis, names: list[str], work_in: int, started: float
) -> dict[str, Any]:
    """Ask (long-polling, a short pause after each 503) until a task comes, while watching
    every repository's mirror mark (when the first, the one with work and the last were
    set); returns once the task came and every repository is mirrored."""
    agent = agent_ids(1, "first")[0]
    marks = [keys_of(n).mirror for n in names]
    result: dict[str, Any] = {
        "first_task_s": None,
        "synced_s": None,
        "first_mirrored_s": None,
        "work_mirrored_s": None,
        "answers": {},
    }

    async def watch() -> None:
        while True:
            pipe = client.pipeline(transaction=False)
            for mark in marks:
                pipe.exists(mark)
            exists = await asyncio.to_thread(pipe.execute)
            done, now = sum(exists), time.monotonic() - started
            if done and result["first_mirrored_s"] is None:
                result["first_mirrored_s"] = now
            if exists[work_in] and result["work_mirrored_s"] is None:
                result["work_mirrored_s"] = now
            if done == len(marks):
                result["synced_s"] = now
                return
            if time.monotonic() - started > FIRST_SYNC_TIMEOUT_S:
                raise RuntimeError(f"only {done} of {len(marks)} repositories mirrored")
            await asyncio.sleep(0.05)

    async def ask() -> None:
        http = RawClient(url)
        try:
            while time.monotonic() - started < FIRST_SYNC_TIMEOUT_S:
                status, body = await http.post(
                    "/request-task", {"agent_id": agent, "wait_seconds": 20}
                )
                answers = result["answers"]
                answers[str(status)] = answers.get(str(status), 0) + 1
                if status == 200:
                    result["first_task_s"] = time.monotonic() - started
                    result["first_task_repository"] = json.loads(body)["repository"]
                    return
                if status != 204:
                    await asyncio.sleep(FIRST_SYNC_RETRY_S)
        finally:
            await http.close()

    watcher = asyncio.create_task(watch())
    try:
        await ask()
        await watcher
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return result
