"""A maintainer's decision holds against every kind of agent, across two serve processes, and
through what goes wrong: the agent a task was revoked or reassigned from never takes it back
(20 tries and more, polling with no wait), the named agent gets it, a hold keeps the issue
from everyone — every kind of agent under every condition: healthy, GitHub refusing writes,
Redis flushed, and Redis killed and restarted empty.

Each kind of agent is driven as it runs for real: the runner (`github-broker agent`) as a
process over a long command, an SDK loop (`BrokerClient`, asking again at once whenever it has
nothing), an MCP client (the official SDK over stdio, `github-broker mcp`). The maintainer acts
through the other serve process's admin API.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import TextContent

from github_broker.agent.client import BrokerClient, LeaseLost
from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.factories import make_known
from tests.processes import BrokerProcess, broker_env, start_all
from tests.test_durability import SIGNING, RedisNode
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")
#: A heartbeat interval of 2 s.
LEASE_TTL_S = 6
#: Tries (request-tasks answered "nothing") each decision must withstand.
TRIES = 20
AGENT = "k-agent"


class Claims:
    """Every issue the agent under test was handed, in order."""

    def __init__(self) -> None:
        self.issues: list[int] = []
        self.lock = threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.issues.append(n)

    def since(self, mark: int) -> list[int]:
        with self.lock:
            return self.issues[mark:]

    def __len__(self) -> int:
        with self.lock:
            return len(self.issues)


# --- the three kinds of agent ----------------------------------------------------------------


@contextmanager
def runner_agent(url: str, tmp_path: Path, claims: Claims) -> Iterator[None]:
    """`github-broker agent` over a command that works until it is stopped; each claim it
    starts writes the issue number to claimed.log."""
    work = tmp_path / "runner"
    work.mkdir()
    log = work / "claimed.log"
    command = [sys.executable, "-m", "github_broker", "agent", "--broker-url", url]
    command += ["--agent-id", AGENT, "--wait", "0", "--workdir", str(work), "--"]
    command += [f'echo "$GB_ISSUE_ID" >> {log}; sleep 600']
    with (tmp_path / "runner.log").open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    stop = threading.Event()

    def follow() -> None:
        seen = 0
        while not stop.is_set():
            lines = log.read_text().split() if log.exists() else []
            for n in lines[seen:]:
                claims.add(int(n))
            seen = len(lines)
            time.sleep(0.05)

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        proc.terminate()
        proc.wait(timeout=30)
        watcher.join(timeout=5)


@contextmanager
def sdk_agent(url: str, tmp_path: Path, claims: Claims) -> Iterator[None]:
    """A loop on the SDK: ask (no wait), heartbeat until the lease is lost, ask again."""
    stop = threading.Event()

    def loop() -> None:
        with BrokerClient(url, AGENT, backoff_s=0.05) as client:
            while not stop.is_set():
                try:
                    task = client.request_task(wait_seconds=0)
                except Exception:
                    time.sleep(0.1)
                    continue
                if task is None:
                    time.sleep(0.02)
                    continue
                claims.add(task.issue_id)
                while not stop.is_set():
                    try:
                        client.heartbeat(task)
                    except LeaseLost:
                        break
                    except Exception:
                        pass
                    time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


@contextmanager
def mcp_agent(url: str, tmp_path: Path, claims: Claims) -> Iterator[None]:
    """An MCP client over stdio: request_task (no wait), heartbeat until it is refused."""
    stop = threading.Event()
    held = re.compile(r"You now hold acme/widgets#(\d+)")

    async def session() -> None:
        command = [sys.executable, "-m", "github_broker", "mcp", "--broker-url", url]
        params = StdioServerParameters(command=command[0], args=[*command[1:], "--agent-id", AGENT])
        with (tmp_path / "mcp.log").open("a") as errlog:
            async with Client(stdio_client(params, errlog=errlog)) as client:
                while not stop.is_set():
                    got = await client.call_tool("request_task", {"wait_seconds": 0})
                    said = "\n".join(c.text for c in got.content if isinstance(c, TextContent))
                    match = held.search(said)
                    if match is None:
                        await asyncio.sleep(0.02)
                        continue
                    claims.add(int(match.group(1)))
                    while not stop.is_set():
                        beat = await client.call_tool("heartbeat", {})
                        if beat.is_error:
                            break
                        await asyncio.sleep(0.3)

    thread = threading.Thread(target=lambda: asyncio.run(session()), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


AGENTS: dict[str, Callable[..., Any]] = {"runner": runner_agent, "sdk": sdk_agent, "mcp": mcp_agent}
#: What goes wrong meanwhile: nothing, GitHub refusing writes, Redis losing its data.
CONDITIONS = ["healthy", "writes-refused", "flushall", "restart-empty"]


# --- the stack and the maintainer ------------------------------------------------------------


def task_requests(url: str) -> int:
    """request-task answers so far, every serve process together (`/metrics`)."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    return int(
        sum(float(v) for v in re.findall(r"^gb_task_requests_total\{[^}]*\} (\S+)$", text, re.M))
    )


def admin(url: str, path: str, body: dict[str, Any]) -> str:
    r = requests.post(f"{url}/admin{path}", json=body, timeout=10)
    assert r.status_code == 200, r.text
    return str(r.json()["outcome"])


def claim(url: str, agent: str) -> dict[str, Any]:
    r = requests.post(f"{url}/request-task", json={"agent_id": agent}, timeout=10)
    assert r.status_code == 200, (agent, r.status_code, r.text)
    return dict(r.json())


@contextmanager
def heartbeating(url: str, agent: str, task: dict[str, Any]) -> Iterator[None]:
    """`agent` keeps its lease on `task` alive (retrying through a loss of Redis's data)."""
    stop = threading.Event()
    body = {"agent_id": agent, "token": task["lease"]["token"]}
    path = f"{url}/tasks/{REPO}/{task['issue_id']}/heartbeat"

    def beat() -> None:
        while not stop.wait(0.5):
            requests.post(path, json=body, timeout=10)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=15)


def polls_without(url: str, claims: Claims, issues: set[int], what: str) -> None:
    """The agent asks TRIES times or more (and is handed nothing of `issues`)."""
    mark, start = len(claims), task_requests(url)

    def tried() -> bool:
        got = set(claims.since(mark)) & issues
        assert not got, f"after {what} the agent took back {sorted(got)}"
        return task_requests(url) - start >= TRIES

    wait_until(tried, 30, f"{TRIES} tries after {what}")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(3, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.mark.parametrize("condition", CONDITIONS)
@pytest.mark.parametrize("kind", list(AGENTS))
def test_a_revoke_a_reassign_and_a_hold_hold_against_the_agent_they_were_taken_from(
    sim: Simulator, redis_url: str, tmp_path: Path, kind: str, condition: str
) -> None:
    node = None
    if condition == "restart-empty":  # a redis-server of its own, to kill -9
        node = RedisNode(tmp_path / "redis").start()
        redis_url = node.url
    env = broker_env(
        redis_url,
        sim.base_url,
        REPO,
        GITHUB_BROKER_LEASES__LEASE_TTL_S=str(LEASE_TTL_S),
        GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
        GITHUB_BROKER_LEASES__SIGNING_KEYS=SIGNING,
    )
    brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
    agents_url, maintainer = (b.url for b in brokers)
    client = redis.Redis.from_url(redis_url)
    claims = Claims()
    make_known(redis_url, "other", "to", "parker")
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 3, 30, "the first sync")
        with ExitStack() as stack:
            # Two of the three issues are held by others, alive until a decision ends them:
            # the agent under test has one to take.
            reassigned, parked = claim(agents_url, "other"), claim(agents_url, "parker")
            stack.enter_context(heartbeating(agents_url, "other", reassigned))
            stack.enter_context(heartbeating(agents_url, "parker", parked))
            stack.enter_context(AGENTS[kind](agents_url, tmp_path, claims))
            first = wait_until(lambda: claims.since(0), 30, f"the {kind} agent's first claim")[0]
            if condition == "writes-refused":
                sim.faults.add_error(503, method="POST")
            said = admin(maintainer, f"/tasks/{REPO}/{first}/revoke", {"reason": "wrong approach"})
            assert f"{AGENT} is not handed #{first} again" in said
            polls_without(agents_url, claims, {first}, "the revoke")
            # The reassignment: the task goes to `to` alone.
            admin(
                maintainer,
                f"/tasks/{REPO}/{reassigned['issue_id']}/reassign",
                {"agent_id": "to", "reason": "fresh eyes"},
            )
            polls_without(agents_url, claims, {first, reassigned["issue_id"]}, "the reassign")
            moved = claim(agents_url, "to")
            assert moved["issue_id"] == reassigned["issue_id"]
            stack.enter_context(heartbeating(agents_url, "to", moved))
            # The hold: kept from everyone.
            held = parked["issue_id"]
            admin(maintainer, f"/tasks/{REPO}/{held}/revoke", {"hold": True})
            polls_without(agents_url, claims, {first, held}, "the hold")
            if condition == "writes-refused":
                sim.faults.clear()
            if condition in ("flushall", "restart-empty"):
                wait_until(
                    lambda: "needs-human" in sim.state.issue_labels("acme", "widgets", held),
                    10,
                    "the hold on GitHub",
                )
                # The leader reads the decisions it writes back after a loss at every drain of
                # the write queue (every 0.2 s here): one taken within that interval is lost.
                time.sleep(0.5)
                if node is None:
                    client.flushall()
                else:
                    node.kill()
                    node.start()  # no persistence: empty
                # The rebuild and its hold-back (one heartbeat interval and 5 s) pass; then
                # every decision still holds.
                wait_until(lambda: client.exists(KEYS.mirror), 30, "the rebuild")
                wait_until(lambda: not client.exists(KEYS.quarantine), 30, "the hold-back's end")
                polls_without(agents_url, claims, {first, held}, "Redis lost its data")
            assert first not in claims.since(1)
        # Someone else may take it.
        others = {claim(agents_url, "other")["issue_id"] for _ in range(1)}
        if first not in others:
            others.add(claim(agents_url, "to")["issue_id"])
        assert first in others
    finally:
        client.close()
        for broker in brokers:
            broker.stop()
        if node is not None:
            node.kill()
