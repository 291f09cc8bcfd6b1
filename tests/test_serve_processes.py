"""serve's process model: API workers on their own sockets, the poller beside them, no orphans."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

REPO = "acme/widgets"
pytestmark = pytest.mark.slow


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "issues": generate_issues(2)}]}
    with Simulator(seed) as s:
        yield s


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_serve_runs_workers_and_poller_and_kill_9_leaves_no_orphan(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    broker = BrokerProcess(broker_env(redis_url, sim.base_url, REPO), tmp_path, "b", workers=2)
    broker.start()
    try:
        deadline = time.monotonic() + 20
        while len(broker.pids()) < 4:  # supervisor, poller, two API workers (+ a tracker)
            assert time.monotonic() < deadline, broker.pids()
            time.sleep(0.2)
        children = broker.pids() - {broker.proc.pid if broker.proc else 0}
        assert requests.get(f"{broker.url}/health", timeout=5).status_code == 200
    finally:
        broker.kill()
    wait_until(lambda: not any(_alive(pid) for pid in children), 5, "every child gone")
    assert os.getpid() not in children
