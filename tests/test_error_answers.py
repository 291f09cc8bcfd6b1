"""Error answers say what is wrong without internal addresses (Redis's, GitHub's), the log
keeps the details; 401 and 404 carry a reason like every other error."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.conftest import free_port
from tests.test_webhooks import SECRET, sign
from tests.world import ONE_ISSUE, simulated

AGENT_TOKEN = "tok-1-0123456789ab"
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}
ADMIN = {"Authorization": "Bearer adm"}
LEASE = {"agent_id": "a1", "token": "t"}


def leaks(text: str, ports: list[int]) -> list[str]:
    """The internal addresses a body gives away."""
    found = re.findall(r"\b(?:\d{1,3}\.){3}\d{1,3}\b|HTTPConnectionPool|host=|Error 111", text)
    found += [str(p) for p in ports if str(p) in text]
    return found


def every_answer(c: TestClient) -> dict[str, tuple[int, str]]:
    """What each route answers to an ordinary request (tokens where one is needed)."""
    hook = json.dumps(
        {
            "action": "labeled",
            "issue": {"number": 1, "updated_at": "2026-11-01T12:00:00Z", "labels": []},
            "repository": {"full_name": "acme/widgets"},
        }
    ).encode()
    calls: dict[str, Callable[[], Any]] = {
        "GET /ready": lambda: c.get("/ready"),
        "POST /request-task": lambda: c.post(
            "/request-task", json={"agent_id": "a1"}, headers=AGENT
        ),
        "POST heartbeat": lambda: c.post(
            "/tasks/acme/widgets/1/heartbeat", json=LEASE, headers=AGENT
        ),
        "POST complete": lambda: c.post(
            "/tasks/acme/widgets/1/complete", json=LEASE, headers=AGENT
        ),
        "POST release": lambda: c.post(
            "/tasks/acme/widgets/1/release", json={**LEASE, "reason": "failed"}, headers=AGENT
        ),
        "POST /tasks/fix": lambda: c.post(
            "/tasks/fix",
            json={
                "repository": "acme/widgets",
                "issue": 1,
                "pr": 2,
                "comments": [{"author": "m", "body": "fix"}],
            },
            headers=ADMIN,
        ),
        "GET /status": lambda: c.get("/status", headers=ADMIN),
        "GET /explain": lambda: c.get("/explain", headers=ADMIN),
        "GET /metrics": lambda: c.get("/metrics"),
        "POST /github/webhook": lambda: c.post(
            "/github/webhook",
            content=hook,
            headers={
                "X-GitHub-Event": "issues",
                "X-GitHub-Delivery": "d-1",
                "X-Hub-Signature-256": sign(hook),
            },
        ),
        "POST /ui/login": lambda: c.post(
            "/ui/login",
            content=b"token=adm",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            follow_redirects=False,
        ),
        "GET /ui": lambda: c.get("/ui", follow_redirects=False),
    }
    return {name: (r.status_code, r.text) for name, call in calls.items() for r in [call()]}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


def settings_with(
    make_settings: Callable[..., Settings], redis_url: str, github_url: str
) -> Settings:
    return make_settings(
        redis={"url": redis_url, "socket_timeout_s": 0.5, "connect_timeout_s": 0.5},
        github={"base_url": github_url, "timeout_s": 1},
        server={"run_poller": False, "agent_tokens": {"a1": AGENT_TOKEN}, "admin_token": "adm"},
        webhooks={"secret": SECRET},
    )


def test_redis_and_github_down_answer_without_their_addresses(
    make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    redis_port, github_port = free_port(), free_port()
    settings = settings_with(
        make_settings, f"redis://127.0.0.1:{redis_port}/0", f"http://127.0.0.1:{github_port}"
    )
    caplog.set_level(logging.WARNING)
    with TestClient(create_app(settings)) as c:
        answers = every_answer(c)
    assert answers["GET /ready"][0] == 503
    ready = json.loads(answers["GET /ready"][1])["checks"]
    assert ready == {
        "redis": "Redis unavailable: connection refused",
        "github": "GET /rate_limit: GitHub cannot be reached: connection refused",
    }
    assert answers["POST /request-task"][0] == 503
    assert json.loads(answers["POST /request-task"][1]) == {
        "detail": "Redis unavailable: connection refused",
        "reason": "unavailable",
    }
    assert {status for status, _ in answers.values()} <= {503, 303, 401}, answers
    found = {name: leaks(text, [redis_port, github_port]) for name, (_, text) in answers.items()}
    assert not {name: f for name, f in found.items() if f}, found
    # The operator still learns where the broker looked.
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"127.0.0.1:{redis_port}" in logged and f"port={github_port}" in logged


def test_github_down_answers_without_its_address(
    make_settings: Callable[..., Settings], redis_url: str
) -> None:
    github_port = free_port()
    settings = settings_with(make_settings, redis_url, f"http://127.0.0.1:{github_port}")
    with TestClient(create_app(settings)) as c:
        answers = every_answer(c)
    assert answers["GET /ready"][0] == 503
    found = {name: leaks(text, [github_port]) for name, (_, text) in answers.items()}
    assert not {name: f for name, f in found.items() if f}, found


def test_unauthorized_and_not_found_answers_carry_a_reason(
    make_settings: Callable[..., Settings], redis_url: str, sim: Simulator
) -> None:
    with TestClient(create_app(settings_with(make_settings, redis_url, sim.base_url))) as c:
        no_token = c.post("/request-task", json={"agent_id": "a1"})
        wrong = c.get("/status", headers={"Authorization": "Bearer nope"})
        other = c.post("/request-task", json={"agent_id": "a2"}, headers=AGENT)
        unknown_repo = c.get("/explain", params={"repository": "x/y"}, headers=ADMIN)
        no_path = c.get("/no/such/path")
        lease_repo = c.post("/tasks/x/y/1/heartbeat", json=LEASE, headers=AGENT)
        not_allowed = c.get("/request-task")
        spec = c.get("/openapi.json").json()
    assert (no_token.status_code, no_token.json()["reason"]) == (401, "unauthorized")
    assert (wrong.status_code, wrong.json()["reason"]) == (401, "unauthorized")
    assert (other.status_code, other.json()["reason"]) == (403, "forbidden")
    assert (unknown_repo.status_code, unknown_repo.json()["reason"]) == (404, "not_found")
    assert (no_path.status_code, no_path.json()["reason"]) == (404, "not_found")
    assert (lease_repo.status_code, lease_repo.json()["reason"]) == (404, "not_found")
    assert (not_allowed.status_code, not_allowed.json()["reason"]) == (405, "method_not_allowed")
    described = spec["components"]["schemas"]["Problem"]["properties"]["reason"]["description"]
    for reason in ("unauthorized", "forbidden", "not_found", "unavailable", "too_large"):
        assert f"`{reason}`" in described
