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
from tests.processes import BrokerProcess, broker_env, start_all
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
AGENTS = 50
P0_COUNT, P1_COUNT = 100, 400
#: The long-poll tests only need every P0 task held by someone: a small data set will do.
LONG_POLL_P0, LONG_POLL_P1 = 10, 10
KEYS = RepoKeys("gb", "acme", "widgets")


@pytest.fixture
def counts(request: pytest.FixtureRequest) -> tuple[int, int]:
    """How many P0 and P1 issues the simulator holds: `@pytest.mark.issues(p0, p1)`, or the
    full data set of the hand-out race."""
    marker = request.node.get_closest_marker("issues")
    return (int(marker.args[0]), int(marker.args[1])) if marker else (P0_COUNT, P1_COUNT)


@pytest.fixture
def sim(counts: tuple[int, int]) -> Iterator[Simulator]:
    p0, p1 = counts
    issues = generate_issues(p0, priorities=("P0",)) + generate_issues(
        p1,
        start=p0 + 1,
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
    procs = start_all([BrokerProcess(env, tmp_path, f"broker{i}") for i in range(2)])
    yield procs
    for p in procs:
        p.stop()


def wait_for_bucket(redis_url: str, priority: int, timeout_s: float = 30.0) -> None:
    client = sync_client(redis_url)
    try:
        wait_until(
            lambda: int(client.zrange(KEYS.work, 0, 0, withscores=True)[0][1]) == priority,
            timeout_s,
            f"the sync to open bucket P{priority}",
        )
    finally:
        client.close()


def wait_for_ready(redis_url: str, count: int, timeout_s: float = 30.0) -> None:
    client = sync_client(redis_url)
    try:
        wait_until(lambda: client.zcard(KEYS.ready) >= count, timeout_s, f"{count} ready")
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


@pytest.mark.issues(LONG_POLL_P0, LONG_POLL_P1)
def test_long_poll_wakes_on_release_in_another_process(
    sim: Simulator, brokers: list[BrokerProcess], backend: str
) -> None:
    wait_for_ready(backend, LONG_POLL_P0 + LONG_POLL_P1)
    a, b = brokers
    # Take every P0 task so the next asker has to wait.
    held = []
    for i in range(LONG_POLL_P0):
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


@pytest.mark.issues(LONG_POLL_P0, LONG_POLL_P1)
def test_task_claimed_for_a_long_poll_the_agent_left_goes_back_to_the_pool(
    sim: Simulator, brokers: list[BrokerProcess], backend: str
) -> None:
    wait_for_ready(backend, LONG_POLL_P0 + LONG_POLL_P1)
    a, b = brokers
    held = [
        requests.post(f"{a.url}/request-task", json={"agent_id": f"holder-{i}"}, timeout=10).json()
        for i in range(LONG_POLL_P0)
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
    # The impatient agent's server-side wait wakes, claims it, sees it gone.
    client = sync_client(backend)
    try:

        def given_back() -> bool:
            record = client.get(KEYS.task_candidate(task["issue_id"], "impatient"))
            return (
                record is not None
                and json.loads(record)["status"] == "abandoned"
                and client.get(KEYS.agent_current_task("impatient")) is None
            )

        wait_until(lambda: given_back(), 10, "the abandoned claim given back")
    finally:
        client.close()
    r = requests.post(f"{b.url}/request-task", json={"agent_id": "next"}, timeout=10)
    assert r.status_code == 200 and r.json()["issue_id"] == task["issue_id"]
