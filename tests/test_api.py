"""The HTTP API in-process (FastAPI TestClient), on a real Redis and the simulator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.errors import ConfigError
from github_broker.gateway import GitHubGateway
from github_broker.leader.sync import Syncer
from github_broker.reports import status as status_view
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import Store
from tests.conftest import free_port
from tests.factories import body
from tests.waiting import wait_until

ISSUES = [
    {
        "number": 1,
        "title": "Urgent fix",
        "body": body(),
        "labels": ["P0", "BACKENDCODER"],
        "created_at": "2026-01-01T00:00:00Z",
    },
    {
        "number": 2,
        "title": "Frontend",
        "body": body("ui/issue-xx"),
        "labels": ["P0", "FRONTENDCODER"],
        "created_at": "2026-01-01T00:01:00Z",
    },
    {
        "number": 3,
        "title": "Later",
        "body": body("later"),
        "labels": ["P1", "BACKENDCODER"],
        "created_at": "2026-01-01T00:02:00Z",
    },
    {
        "number": 4,
        "title": "No branch",
        "body": "## Deliverables\n- x\n",
        "labels": ["P0", "TESTER"],
        "created_at": "2026-01-01T00:03:00Z",
    },
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": ISSUES}]}) as s:
        yield s


def synced(settings: Settings) -> None:
    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            for repo in settings.repositories:
                await Syncer(settings, store, gateway).sync(repo)
        finally:
            await store.close()
            gateway.close()

    asyncio.run(run())


@pytest.fixture
def app_factory(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> Callable[..., TestClient]:
    def factory(**overrides: Any) -> TestClient:
        overrides.setdefault("redis", {"url": redis_url})
        server = {"run_poller": False, **overrides.pop("server", {})}
        settings = make_settings(github={"base_url": sim.base_url}, server=server, **overrides)
        synced(settings)
        return TestClient(create_app(settings))

    return factory


@pytest.fixture
def client(app_factory: Callable[..., TestClient]) -> Iterator[TestClient]:
    with app_factory() as c:
        yield c


def test_original_request_body_gets_task_with_original_fields(client: TestClient) -> None:
    r = client.post("/request-task", json={"agent_id": "agent-1"})
    assert r.status_code == 200
    task = r.json()
    assert task["issue_id"] == 1 and task["title"] == "Urgent fix"
    assert task["branch_name"] == "feature/issue-1" and task["base_branch"] == "main"
    assert task["required_role"] == "BACKENDCODER" and task["task_type"] == "development"
    assert task["repository"] == "acme/widgets" and "issue_url" in task and task["labels"]
    assert "feature/issue-1" in task["prompt"] and "$" not in task["prompt"]
    assert task["lease"]["token"] and task["lease"]["heartbeat_interval_s"] == 200


def test_strict_bucket_then_204(client: TestClient) -> None:
    first = client.post("/request-task", json={"agent_id": "a1"}).json()
    second = client.post("/request-task", json={"agent_id": "a2"}).json()
    assert {first["issue_id"], second["issue_id"]} == {1, 2}
    # Issue 3 is P1 and issue 4 (P0) cannot be assigned: nothing for a third agent.
    assert client.post("/request-task", json={"agent_id": "a3"}).status_code == 204


def test_roles_pick_matching_work_and_unknown_role_is_422(client: TestClient) -> None:
    r = client.post("/request-task", json={"agent_id": "ui", "roles": ["FRONTENDCODER"]})
    assert r.json()["issue_id"] == 2
    bad = client.post("/request-task", json={"agent_id": "x", "roles": ["PAINTER"]})
    assert bad.status_code == 422 and "PAINTER" in bad.json()["detail"]


@pytest.mark.parametrize(
    "payload, field",
    [
        ({}, "agent_id"),
        ({"agent_id": "has space"}, "agent_id"),
        ({"agent_id": "a", "wait_seconds": 61}, "wait_seconds"),
        ({"agent_id": "a", "previous": "exploded"}, "previous"),
    ],
)
def test_malformed_bodies_get_readable_422(
    client: TestClient, payload: dict[str, Any], field: str
) -> None:
    r = client.post("/request-task", json=payload)
    assert r.status_code == 422
    assert field in r.json()["detail"] and "Traceback" not in r.text


def test_heartbeat_complete_release_and_409_reasons(client: TestClient) -> None:
    task = client.post("/request-task", json={"agent_id": "a1"}).json()
    base = f"/tasks/acme/widgets/{task['issue_id']}"
    lease = {"agent_id": "a1", "token": task["lease"]["token"]}
    assert client.post(f"{base}/heartbeat", json=lease).status_code == 200
    stranger = client.post(f"{base}/heartbeat", json={**lease, "agent_id": "a2"})
    assert stranger.status_code == 409 and stranger.json()["reason"] == "not_owner"
    assert client.post(f"{base}/complete", json=lease).json() == {"status": "completed"}
    late = client.post(f"{base}/heartbeat", json=lease)
    assert late.status_code == 409 and late.json()["reason"] == "completed"
    other = client.post("/request-task", json={"agent_id": "a1"}).json()
    released = client.post(
        f"/tasks/acme/widgets/{other['issue_id']}/release",
        json={"agent_id": "a1", "token": other["lease"]["token"], "reason": "failed"},
    )
    assert released.json() == {"status": "failed"}
    again = client.post("/request-task", json={"agent_id": "a2"}).json()
    assert again["issue_id"] == other["issue_id"]


def test_unknown_repository_is_404(client: TestClient) -> None:
    r = client.post("/tasks/acme/nope/1/heartbeat", json={"agent_id": "a", "token": "t"})
    assert r.status_code == 404 and "acme/nope" in r.json()["detail"]


def test_agent_tokens_bind_agent_ids(app_factory: Callable[..., TestClient]) -> None:
    tokens = {"a1": "tok-1-0123456789ab", "a2": "tok-2-0123456789ab"}
    server = {"agent_tokens": tokens, "admin_token": "boss"}
    with app_factory(server=server) as client:
        assert client.post("/request-task", json={"agent_id": "a1"}).status_code == 401
        wrong = client.post("/request-task", json={"agent_id": "a1"}, headers=bearer(tokens["a2"]))
        assert wrong.status_code == 403
        ok = client.post("/request-task", json={"agent_id": "a1"}, headers=bearer(tokens["a1"]))
        assert ok.status_code == 200
        assert client.get("/status", headers=bearer(tokens["a1"])).status_code == 403
        status = client.get("/status", headers={"Authorization": "Bearer boss"})
        assert status.status_code == 200
        leases = status.json()["repositories"][0]["leases"]
        assert [lease["agent_id"] for lease in leases] == ["a1"]


def test_explain_says_why_each_issue_is_passed_over(client: TestClient) -> None:
    client.post("/request-task", json={"agent_id": "a1"})
    verdicts = {v["issue"]: v for v in client.get("/explain").json()["acme/widgets"]}
    assert verdicts[1]["verdict"] == "held" and "a1" in verdicts[1]["detail"]
    assert verdicts[2]["verdict"] == "next"
    assert verdicts[3]["verdict"] == "outside_bucket"
    assert verdicts[4]["verdict"] == "skipped" and "no_branch" in verdicts[4]["detail"]


def test_explain_refuses_a_query_parameter_it_does_not_take_naming_the_right_one(
    client: TestClient,
) -> None:
    """`?agent=a1` would otherwise explain for a fresh agent, silently: a 422 names
    `agent_id` (and the route declares that answer)."""
    client.post("/request-task", json={"agent_id": "a1"})
    r = client.get("/explain", params={"agent": "a1"})
    assert r.status_code == 422, r.text
    assert r.json()["reason"] == "invalid_request"
    assert "unknown query parameter 'agent'; did you mean 'agent_id'?" in r.json()["detail"]
    assert "agent_id, repository, roles" in r.json()["detail"]
    assert client.get("/explain", params={"agent_id": "a1", "roles": "BACKENDCODER"}).is_success
    declared = client.get("/openapi.json").json()["paths"]["/explain"]["get"]["responses"]
    assert "`agent` is refused, naming `agent_id`" in declared["422"]["description"]


def test_an_unexpected_error_is_a_500_without_a_traceback_and_is_logged(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*_: object) -> None:
        raise RuntimeError("boom: the details stay in the log")

    monkeypatch.setattr(status_view, "status", broken)
    plain = TestClient(client.app, raise_server_exceptions=False)
    r = plain.get("/status")
    assert r.status_code == 500
    assert r.json() == {
        "detail": "internal error; the broker logged the details",
        "reason": "internal",
    }
    assert "boom" not in r.text and "Traceback" not in r.text
    assert "boom: the details stay in the log" in caplog.text


def test_redis_down_gives_503_with_retry_after(
    app_factory: Callable[..., TestClient],
    redis_url: str,
    make_settings: Callable[..., Settings],
    sim: Simulator,
) -> None:
    settings = make_settings(
        redis={"url": f"redis://127.0.0.1:{free_port()}/0"},
        github={"base_url": sim.base_url},
        server={"run_poller": False},
    )
    with TestClient(create_app(settings)) as client:
        r = client.post("/request-task", json={"agent_id": "a1"})
        assert r.status_code == 503 and r.headers["Retry-After"] == "2"
        assert "Redis" in r.json()["detail"] and "Traceback" not in r.text
        assert client.get("/ready").status_code == 503
        assert client.get("/health").status_code == 200


def test_remote_bind_without_tokens_is_refused(make_settings: Callable[..., Settings]) -> None:
    with pytest.raises(ConfigError, match="agent tokens"):
        make_settings(server={"host": "0.0.0.0"})


def test_metrics_expose_queues_and_refusals(client: TestClient) -> None:
    task = client.post("/request-task", json={"agent_id": "a1"}).json()
    client.post(
        f"/tasks/acme/widgets/{task['issue_id']}/heartbeat",
        json={"agent_id": "a1", "token": "stale"},
    )
    text = client.get("/metrics").text
    assert 'gb_task_requests_total{result="task"} 1.0' in text
    assert 'gb_lease_refusals_total{reason="revoked"} 1.0' in text
    assert 'gb_leases{repository="acme/widgets"} 1.0' in text
    assert 'gb_ready_tasks{priority="P0",repository="acme/widgets"} 1.0' in text


def test_status_shows_github_quota_after_a_poll(
    app_factory: Callable[..., TestClient], sim: Simulator
) -> None:
    with app_factory(server={"run_poller": True}) as client:
        wait_until(
            lambda: client.get("/status").json()["github_quota"] is not None,
            10,
            "the poller to publish the quota",
        )
        quota = client.get("/status").json()["github_quota"]
        assert quota["limit"] == 5000 and 0 < quota["remaining"] < 5000


def test_posted_fix_is_queued_handed_out_once_and_duplicates_refused(
    app_factory: Callable[..., TestClient],
) -> None:
    tokens = {"a1": "t1-0123456789abcdef", "a2": "t2-0123456789abcdef"}
    with app_factory(server={"admin_token": "boss", "agent_tokens": tokens}) as c:
        admin = {"Authorization": "Bearer boss"}
        body = {
            "repository": "acme/widgets",
            "issue": 3,
            "pr": 40,
            "pr_url": "https://github.example/acme/widgets/pull/40",
            "comments": [
                {"author": "alice", "body": "Handle the empty file.", "path": "a.py", "line": 7}
            ],
        }
        assert c.post("/tasks/fix", json=body, headers=bearer(tokens["a1"])).status_code == 403
        r = c.post("/tasks/fix", json=body, headers=admin)
        assert r.status_code == 202 and r.json() == {"task_id": "fix:3", "status": "queued"}
        again = c.post("/tasks/fix", json=body, headers=admin)
        assert again.status_code == 409 and "already pending" in again.json()["detail"]
        # Fixes come before development work, but only inside the strict bucket: P1 waits.
        best = c.post(
            "/request-task",
            json={"agent_id": "a1", "repositories": ["acme/widgets"]},
            headers={"Authorization": "Bearer t1-0123456789abcdef"},
        )
        assert best.json()["task_type"] == "development" and best.json()["issue_id"] in (1, 2)
        missing = c.post("/tasks/fix", json={**body, "issue": 99}, headers=admin)
        assert missing.status_code == 404


def test_posted_fix_in_the_bucket_comes_first(app_factory: Callable[..., TestClient]) -> None:
    with app_factory() as c:
        body = {
            "repository": "acme/widgets",
            "issue": 2,
            "pr": 41,
            "comments": [{"author": "alice", "body": "Rename the CSS class."}],
        }
        assert c.post("/tasks/fix", json=body).status_code == 202
        task = c.post("/request-task", json={"agent_id": "a1"}).json()
        assert task["task_type"] == "fix" and task["issue_id"] == 2
        assert task["branch_name"] == "ui/issue-2" and task["pr_url"] is None
        assert [cm["body"] for cm in task["review_comments"]] == ["Rename the CSS class."]
        assert "Rename the CSS class." in task["prompt"]


@pytest.mark.parametrize("agent_id", ["BACKENDCODER", "P1", "in-progress", "needs-review"])
def test_agent_ids_that_are_broker_labels_are_refused(client: TestClient, agent_id: str) -> None:
    r = client.post("/request-task", json={"agent_id": agent_id})
    assert r.status_code == 422 and "label" in r.json()["detail"]


def test_task_given_up_is_not_handed_back_during_the_same_long_poll(client: TestClient) -> None:
    first = client.post("/request-task", json={"agent_id": "a1"}).json()
    assert (
        client.post("/request-task", json={"agent_id": "a2"}).json()["issue_id"]
        != first["issue_id"]
    )
    # a1 gives up; its own release wakes the waiters, but never hands the task back to a1.
    again = client.post(
        "/request-task", json={"agent_id": "a1", "previous": "failed", "wait_seconds": 1}
    )
    assert again.status_code == 204
    other = client.post("/request-task", json={"agent_id": "a3"}).json()
    assert other["issue_id"] == first["issue_id"]


def test_hot_path_answers_request_task_with_the_routes_errors(client: TestClient) -> None:
    # Served by api/hotpath.py, outside FastAPI's routing: same error shape, same OpenAPI.
    r = client.post("/request-task", content=b"agent_id=a1", headers={"content-type": "text/plain"})
    assert r.status_code == 422 and r.json()["reason"] == "invalid_request"
    assert "JSON" in r.json()["detail"]
    r = client.post("/request-task", json={"agent_id": "a1", "wait_seconds": 99})
    assert r.status_code == 422 and "wait_seconds" in r.json()["detail"]
    r = client.post(
        "/request-task", content=b'{"agent_id": ', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422 and r.json()["reason"] == "invalid_request"
    assert client.post("/request-task", json={"agent_id": "a1"}).status_code == 200
    spec = client.get("/openapi.json").json()["paths"]["/request-task"]["post"]
    assert {"200", "204", "413", "422"} <= set(spec["responses"])
    assert "TaskRequest" in str(spec["requestBody"])
