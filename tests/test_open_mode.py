"""No way in for strangers while no token is configured: a real `serve` on loopback answers
only loopback host names and the configured ones (421 otherwise, the hot path included), and
refuses a state-changing request from another origin."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "issues": generate_issues(1)}]}
    with Simulator(seed) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    allowed = {"GITHUB_BROKER_SERVER__ALLOWED_HOSTS": '["broker.lan"]'}
    env = broker_env(redis_url, sim.base_url, "acme/widgets", **allowed)
    proc = BrokerProcess(env, tmp_path, "broker", single_process=True).start()
    try:
        yield proc
    finally:
        proc.stop()


def call(
    broker: BrokerProcess, method: str, path: str, host: str, body: object = None, **headers: str
) -> tuple[int, dict[str, str]]:
    """One request naming `host` in its Host header (as a DNS-rebinding page's would)."""
    conn = http.client.HTTPConnection("127.0.0.1", broker.port, timeout=10)
    try:
        data = json.dumps(body).encode() if body is not None else None
        sent = {"Host": host, "Content-Type": "application/json", **headers}
        conn.request(method, path, body=data, headers=sent)
        r = conn.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw.startswith(b"{") else {}
    finally:
        conn.close()


def test_a_rebinding_host_gets_421_and_changes_nothing(
    broker: BrokerProcess, redis_url: str
) -> None:
    status, body = call(broker, "POST", "/admin/broker/pause", "evil.example", {"reason": "x"})
    assert status == 421 and body["reason"] == "misdirected"
    assert "evil.example" in body["detail"] and "allowed_hosts" in body["detail"]
    # The hot path too, and the reads.
    assert call(broker, "POST", "/request-task", "evil.example:80", {"agent_id": "a1"})[0] == 421
    lease = {"agent_id": "a1", "token": "x"}
    path = "/tasks/acme/widgets/1/heartbeat"
    assert call(broker, "POST", path, "evil.example", lease)[0] == 421
    assert call(broker, "GET", "/status", "evil.example")[0] == 421
    assert call(broker, "GET", "/ui", "rebind.evil.example:8080")[0] == 421
    client = redis.Redis.from_url(redis_url)
    try:
        assert not client.hexists("gb:control", "broker")
        assert client.get("gb:{repo::acme::widgets}:agent_current_task:a1") is None
    finally:
        client.close()


def test_loopback_names_and_allowed_hosts_are_answered(broker: BrokerProcess) -> None:
    port = broker.port
    names = (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST", "broker.lan")
    for host in names:
        assert call(broker, "GET", "/status", host)[0] == 200, host
    assert call(broker, "POST", "/request-task", f"localhost:{port}", {"agent_id": "a1"})[0] == 200


def test_a_state_changing_request_from_another_origin_is_refused(broker: BrokerProcess) -> None:
    host = f"127.0.0.1:{broker.port}"
    body = {"reason": "maintenance"}
    status, problem = call(
        broker, "POST", "/admin/broker/pause", host, body, Origin="http://evil.example"
    )
    assert status == 403 and "cross-origin request refused" in problem["detail"]
    assert call(broker, "POST", "/admin/broker/pause", host, body, Origin="null")[0] == 403
    # A read with an origin, and a write from the broker's own page, are answered.
    assert call(broker, "GET", "/status", host, Origin="http://evil.example")[0] == 200
    same = call(broker, "POST", "/admin/broker/resume", host, body, Origin=f"http://{host}")
    assert same[0] == 200


def test_the_openapi_declares_the_open_deployments_refusals(broker: BrokerProcess) -> None:
    status, spec = call(broker, "GET", "/openapi.json", f"127.0.0.1:{broker.port}")
    assert status == 200
    ops = [op for ops in spec["paths"].values() for op in ops.values()]
    assert all("421" in op["responses"] for op in ops)
    pause = spec["paths"]["/admin/broker/pause"]["post"]["responses"]
    assert "Origin" in pause["403"]["description"]
