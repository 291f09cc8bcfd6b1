"""Metrics: correct across uvicorn workers, histograms of latency, process metrics."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from github_broker.metrics import github_route
from tests.conftest import free_port
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until
from tests.world import ONE_ISSUE, simulated

REQUESTS = 7


def _samples(text: str, name: str) -> dict[str, float]:
    """`name{labels} value` lines -> {labels: value}."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{.*\}})? (\S+)$", line)
        if m:
            out[m.group(1) or ""] = float(m.group(2))
    return out


@pytest.mark.slow
def test_counters_add_up_across_two_uvicorn_workers(redis_url: str, tmp_path: Path) -> None:
    with simulated(ONE_ISSUE) as sim:
        env = broker_env(redis_url, sim.base_url, "acme/widgets")
        broker = BrokerProcess(env, tmp_path, "b", workers=2).start()
        try:
            # The first sync makes issue 1 claimable.
            wait_until(
                lambda: (
                    requests.post(f"{broker.url}/request-task", json={"agent_id": "a0"}).status_code
                    == 200
                ),
                20,
                "issue 1 claimable",
            )
            for i in range(1, REQUESTS):
                # A new connection each time, so both workers answer some of them.
                r = requests.post(f"{broker.url}/request-task", json={"agent_id": f"a{i}"})
                assert r.status_code == 204
            wait_until(
                lambda: (
                    _samples(
                        requests.get(f"{broker.url}/metrics").text,
                        "gb_github_write_lag_seconds_count",
                    ).get("", 0)
                    >= 1
                ),
                20,
                "the leader to apply the claim's GitHub write",
            )
            scrapes = [requests.get(f"{broker.url}/metrics").text for _ in range(6)]
        finally:
            broker.stop()
    pids = set()
    for text in scrapes:
        answers = _samples(text, "gb_task_requests_total")
        task = answers['{result="task"}']
        none = answers['{result="none"}']
        # Tasks answered: 1; "none": the polls before the sync plus the six 204s.
        assert task == 1 and none >= REQUESTS - 1
        latency = _samples(text, "gb_request_task_seconds_count")
        # Every answer is timed; the task/none counter counts the 200s and 204s (a poll made
        # before the first sync finished may get a 503, timed but neither task nor none).
        answered = latency['{status="200"}'] + latency.get('{status="204"}', 0.0)
        assert answered == task + none
        assert latency['{status="200"}'] == 1
        routes = _samples(text, "gb_github_request_seconds_count")
        assert any('route="/repos/{owner}/{repo}/issues"' in k for k in routes), routes
        assert any('method="POST"' in k and 'status="200"' in k for k in routes), routes
        memory = _samples(text, "process_resident_memory_bytes")
        pids |= {k for k in memory}
        assert _samples(text, "gb_leases") == {'{repository="acme/widgets"}': 1.0}
        assert '{repository="acme/widgets"}' in _samples(text, "gb_github_write_queue_lag_seconds")
    # Process metrics of each broker process: the two API workers and serve's poller.
    assert len(pids) == 3, pids
    # The same totals whichever worker answered: the old per-worker counters alternated.
    assert len({tuple(sorted(_samples(t, "gb_task_requests_total").items())) for t in scrapes}) == 1


def test_github_routes_are_bounded_label_values() -> None:
    assert github_route("/repos/acme/widgets/issues/12/labels") == (
        "/repos/{owner}/{repo}/issues/{n}/labels"
    )
    assert github_route("/repos/acme/widgets/issues/12/labels/in%20progress") == (
        "/repos/{owner}/{repo}/issues/{n}/labels/{name}"
    )
    assert github_route("/repos/acme/widgets/git/refs/heads/issue-12/x") == (
        "/repos/{owner}/{repo}/git/refs/{ref}"
    )
    assert github_route("/rate_limit") == "/rate_limit"
    assert github_route("/repositories/1001/issues/12/labels") == (
        "/repos/{owner}/{repo}/issues/{n}/labels"
    )


@pytest.mark.slow
def test_a_separate_poller_serves_its_github_metrics(redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    with simulated(ONE_ISSUE) as sim:
        env = {**os.environ, **broker_env(redis_url, sim.base_url, "acme/widgets")}
        log = (tmp_path / "poll.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "github_broker", "poll", "--metrics-port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                    routes = _samples(text, "gb_github_request_seconds_count")
                    if any('route="/repos/{owner}/{repo}/issues"' in k for k in routes):
                        break
                except requests.ConnectionError:
                    pass
                assert time.monotonic() < deadline, (tmp_path / "poll.log").read_text()
                time.sleep(0.3)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
            log.close()
    assert f'pid="{proc.pid}"' in text
