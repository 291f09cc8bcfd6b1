"""Many agents against two real `serve` processes sharing one real Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.conftest import sync_client
from tests.processes import BrokerProcess, broker_env

pytestmark = pytest.mark.slow
AGENTS = 50
P0_COUNT, P1_COUNT = 100, 400
KEYS = RepoKeys("gb", "acme", "widgets")


@pytest.fixture
def sim() -> Iterator[Simulator]:
    issues = generate_issues(P0_COUNT, priorities=("P0",)) + generate_issues(
        P1_COUNT,
        start=P0_COUNT + 1,
        priorities=("P1",),
        created_from=None,
    )
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": issues}]}) as s:
        yield s


@pytest.fixture(params=["redis-server", "redis-cluster"])
def backend(request: pytest.FixtureRequest) -> str:
    """The Redis the brokers share: one server, or a three-master cluster."""
    if request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster")
        client = sync_client(url)
        client.flushall(target_nodes="all")  # type: ignore[call-arg]
        client.close()
        return str(url)
    return str(request.getfixturevalue("redis_url"))


@pytest.fixture
def brokers(sim: Simulator, backend: str, tmp_path: Path) -> Iterator[list[BrokerProcess]]:
    env = broker_env(
        backend,
        sim.base_url,
        "acme/widgets",
        GITHUB_BROKER_SERVER__LONG_POLL_RECHECK_S="30",
        # These agents ask again at once to say "done" (the original's flow): no settle grace.
        GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
    )
    procs = [BrokerProcess(env, tmp_path, f"broker{i}").start() for i in range(2)]
    yield procs
    for p in procs:
        p.stop()


def wait_for_bucket(redis_url: str, priority: int, timeout_s: float = 30.0) -> None:
    client = sync_client(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while int(client.zrange(KEYS.work, 0, 0, withscores=True)[0][1]) != priority:
            assert time.monotonic() < deadline, "the sync never opened the bucket"
            time.sleep(0.1)
    finally:
        client.close()


def wait_for_ready(redis_url: str, count: int, timeout_s: float = 30.0) -> None:
    client = sync_client(redis_url)
    deadline = time.monotonic() + timeout_s
    try:
        while client.zcard(KEYS.ready) < count:
            assert time.monotonic() < deadline, f"only {client.zcard(KEYS.ready)} ready of {count}"
            time.sleep(0.1)
    finally:
        client.close()


async def agents_run(urls: list[str]) -> list[tuple[str, int, list[str]]]:
    """50 agents ask until each got 'no task' twice in a row; returns (agent, issue, labels)."""
    handed: list[tuple[str, int, list[str]]] = []

    async def agent(i: int, client: httpx.AsyncClient) -> None:
        agent_id = f"agent-{i:02d}"
        url = urls[i % len(urls)]
        empty = 0
        while empty < 2:
            r = await client.post(f"{url}/request-task", json={"agent_id": agent_id})
            assert r.status_code in (200, 204), r.text
            if r.status_code == 204:
                empty += 1
                continue
            empty = 0
            task = r.json()
            handed.append((agent_id, task["issue_id"], task["labels"]))

    limits = httpx.Limits(max_connections=AGENTS)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        await asyncio.gather(*(agent(i, client) for i in range(AGENTS)))
    return handed


def test_every_issue_handed_out_once_respecting_strict_bucket(
    sim: Simulator, brokers: list[BrokerProcess], backend: str
) -> None:
    urls = [b.url for b in brokers]
    wait_for_ready(backend, P0_COUNT + P1_COUNT)

    first = asyncio.run(agents_run(urls))
    numbers = [n for _, n, _ in first]
    assert len(numbers) == len(set(numbers)), "an issue was handed out twice"
    assert set(numbers) == set(range(1, P0_COUNT + 1))
    assert all("P1" not in labels for _, _, labels in first)
    assert len({agent for agent, _, _ in first}) > 1

    # Maintainers merge the P0 work: the P1 bucket opens on the next sync.
    for n in range(1, P0_COUNT + 1):
        sim.state.update_issue("acme", "widgets", n, state="closed")
    wait_for_bucket(backend, 1)
    second = asyncio.run(agents_run(urls))
    numbers2 = [n for _, n, _ in second]
    assert len(numbers2) == len(set(numbers2)), "an issue was handed out twice"
    assert set(numbers2) == set(range(P0_COUNT + 1, P0_COUNT + P1_COUNT + 1))


def test_long_poll_wakes_on_release_in_another_process(
    sim: Simulator, brokers: list[BrokerProcess], backend: str
) -> None:
    wait_for_ready(backend, P0_COUNT + P1_COUNT)
    a, b = brokers
    # Take every P0 task so the next asker has to wait.
    held = []
    for i in range(P0_COUNT):
        r = requests.post(f"{a.url}/request-task", json={"agent_id": f"holder-{i}"}, timeout=10)
        held.append(r.json())
    assert (
        requests.post(f"{a.url}/request-task", json={"agent_id": "w"}, timeout=10).status_code
        == 204
    )

    async def wait_and_release() -> tuple[int, float]:
        async with httpx.AsyncClient(timeout=40) as client:
            started = time.monotonic()
            waiting = asyncio.create_task(
                client.post(
                    f"{a.url}/request-task", json={"agent_id": "waiter", "wait_seconds": 25}
                )
            )
            await asyncio.sleep(1.0)
            task = held[0]
            r = await client.post(
                f"{b.url}/tasks/acme/widgets/{task['issue_id']}/release",
                json={"agent_id": "holder-0", "token": task["lease"]["token"]},
            )
            assert r.status_code == 200
            answer = await waiting
            return answer.json()["issue_id"], time.monotonic() - started

    issue, elapsed = asyncio.run(wait_and_release())
    assert issue == held[0]["issue_id"]
    # The recheck timer is 30 s here, so only the cross-process event can explain this.
    assert elapsed < 10


def test_task_claimed_for_a_long_poll_the_agent_left_goes_back_to_the_pool(
    sim: Simulator, brokers: list[BrokerProcess], backend: str
) -> None:
    wait_for_ready(backend, P0_COUNT + P1_COUNT)
    a, b = brokers
    held = [
        requests.post(f"{a.url}/request-task", json={"agent_id": f"holder-{i}"}, timeout=10).json()
        for i in range(P0_COUNT)
    ]
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.post(
            f"{a.url}/request-task", json={"agent_id": "impatient", "wait_seconds": 20}, timeout=1
        )
    task = held[0]
    r = requests.post(
        f"{b.url}/tasks/acme/widgets/{task['issue_id']}/release",
        json={"agent_id": "holder-0", "token": task["lease"]["token"]},
        timeout=10,
    )
    assert r.status_code == 200
    time.sleep(1.0)  # the impatient agent's server-side wait wakes, claims it, sees it gone
    client = sync_client(backend)
    try:
        record = client.get(KEYS.task_candidate(task["issue_id"], "impatient"))
        assert record is not None and json.loads(record)["status"] == "abandoned"
        assert client.get(KEYS.agent_current_task("impatient")) is None
    finally:
        client.close()
    r = requests.post(f"{b.url}/request-task", json={"agent_id": "next"}, timeout=10)
    assert r.status_code == 200 and r.json()["issue_id"] == task["issue_id"]
