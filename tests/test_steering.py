"""Maintainers steer running work (admin API, CLI), agents learn of it through their next
heartbeat, and every action lands once in the audit log with what really happened."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.factories import body, make_known
from tests.processes import BrokerProcess, broker_env, post, start_all, wait_for
from tests.test_api import synced
from tests.waiting import wait_until

REPO = "acme/widgets"
ISSUES = [
    {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
    for n in (1, 2, 3)
]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets", "issues": ISSUES}]}) as s:
        yield s


@pytest.fixture
def client(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> Iterator[TestClient]:
    settings = make_settings(
        redis={"url": redis_url},
        github={"base_url": sim.base_url},
        server={"run_poller": False},
        leases={"settle_grace_s": 0},
    )
    synced(settings)
    make_known(redis_url, *(f"{x}{i}" for x in "abx" for i in range(10)))
    with TestClient(create_app(settings)) as c:
        yield c


def claim(client: TestClient, agent: str, **extra: Any) -> dict[str, Any]:
    r = client.post("/request-task", json={"agent_id": agent, **extra})
    assert r.status_code == 200, r.text
    task: dict[str, Any] = r.json()
    return task


def lease_call(client: TestClient, task: dict[str, Any], agent: str, action: str) -> Any:
    return client.post(
        f"/tasks/{REPO}/{task['issue_id']}/{action}",
        json={"agent_id": agent, "token": task["lease"]["token"]},
    )


def audit(client: TestClient) -> list[dict[str, Any]]:
    r = client.get("/admin/audit", params={"limit": 100})
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()
    return entries


def test_revoke_tells_the_agent_why_at_its_next_heartbeat_and_the_task_returns_to_others(
    client: TestClient,
) -> None:
    task = claim(client, "a1")
    r = client.post(
        f"/admin/tasks/{REPO}/{task['issue_id']}/revoke", json={"reason": "wrong approach"}
    )
    assert r.status_code == 200
    assert r.json()["outcome"] == (
        f"lease of a1 revoked; a1 is not handed #{task['issue_id']} again until a retry; "
        "task back in the pool"
    )
    beat = lease_call(client, task, "a1", "heartbeat")
    assert beat.status_code == 409 and beat.json()["reason"] == "revoked"
    assert "revoked by admin: wrong approach" in beat.json()["detail"]
    # The agent it was revoked from asks at once (a runner polling with no wait): not that one.
    again = claim(client, "a1")
    assert again["issue_id"] != task["issue_id"]
    assert claim(client, "a2")["issue_id"] == task["issue_id"]
    entries = [e for e in audit(client) if e["action"] == "revoke"]
    assert len(entries) == 1 and entries[0]["actor"] == "admin"
    assert entries[0]["agent"] == "a1" and entries[0]["reason"] == "wrong approach"


def test_the_audit_log_pages_back_newest_first_with_before_ms(client: TestClient) -> None:
    """GET /admin/audit?limit=…&before_ms=…: newest first, and the next page is what is older
    than the last entry of this one."""
    for agent in ("x1", "x2", "x3"):
        started = time.time() * 1000
        r = client.post(f"/admin/agents/{agent}/pause", json={"reason": agent})
        assert r.status_code == 200
        while time.time() * 1000 < started + 2:  # one action per millisecond at most
            time.sleep(0.001)
    first = client.get("/admin/audit", params={"limit": 2}).json()
    assert [e["agent"] for e in first] == ["x3", "x2"]
    older = client.get("/admin/audit", params={"limit": 2, "before_ms": first[-1]["at_ms"]})
    assert [e["agent"] for e in older.json()] == ["x1"]


def test_admin_agents_lists_who_holds_a_task_has_a_streak_or_is_paused(
    client: TestClient,
) -> None:
    held = claim(client, "a1")
    failed = claim(client, "a2")
    assert lease_call(client, failed, "a2", "release").status_code == 200  # abandoned
    client.post("/admin/agents/a3/pause", json={"reason": "rota"})
    rows = {r["agent_id"]: r for r in client.get("/admin/agents").json()}
    assert set(rows) == {"a1", "a2", "a3"}
    assert rows["a1"]["holds"] == [f"{REPO}#{held['issue_id']}"]
    assert rows["a2"]["streaks"] == {REPO: 1} and rows["a2"]["holds"] == []
    assert rows["a3"]["paused"]["reason"] == "rota" and rows["a3"]["paused"]["by"] == "admin"


def test_revoke_with_hold_keeps_the_issue_for_a_person_until_a_retry(client: TestClient) -> None:
    task = claim(client, "a1")
    n = task["issue_id"]
    r = client.post(f"/admin/tasks/{REPO}/{n}/revoke", json={"hold": True})
    assert "held for a person" in r.json()["outcome"]
    others = {claim(client, f"b{i}")["issue_id"] for i in range(2)}
    assert n not in others
    assert client.post("/request-task", json={"agent_id": "b9"}).status_code == 204
    status = client.get("/status").json()["repositories"][0]
    assert [w["code"] for w in status["waiting_on_people"]] == ["held"]
    assert (
        client.post(f"/admin/tasks/{REPO}/{n}/retry", json={})
        .json()["outcome"]
        .startswith("no longer waiting (held)")
    )
    assert claim(client, "b9")["issue_id"] == n


def test_a_note_reaches_the_holder_once_with_its_next_heartbeat(client: TestClient) -> None:
    task = claim(client, "a1")
    r = client.post(
        f"/admin/tasks/{REPO}/{task['issue_id']}/note", json={"text": "Use the new parser."}
    )
    assert r.json()["outcome"] == "queued for the next heartbeat of a1"
    first = lease_call(client, task, "a1", "heartbeat").json()
    assert [(n["by"], n["text"]) for n in first["notes"]] == [("admin", "Use the new parser.")]
    assert lease_call(client, task, "a1", "heartbeat").json()["notes"] == []


def test_pause_lets_the_current_task_finish_and_hands_out_nothing_new(client: TestClient) -> None:
    task = claim(client, "a1")
    assert client.post("/admin/agents/a1/pause", json={"reason": "drain"}).status_code == 200
    beat = lease_call(client, task, "a1", "heartbeat").json()
    assert beat["agent_paused"]["kind"] == "pause" and beat["agent_paused"]["reason"] == "drain"
    assert lease_call(client, task, "a1", "complete").status_code == 200
    refused = client.post("/request-task", json={"agent_id": "a1"})
    assert refused.status_code == 409 and refused.json()["reason"] == "agent_paused"
    assert "github-broker resume a1" in refused.json()["detail"]
    assert client.post("/admin/agents/a1/resume", json={}).json()["outcome"] == "resumed"
    assert claim(client, "a1")["issue_id"] != task["issue_id"]


def test_stop_revokes_the_lease_now(client: TestClient) -> None:
    task = claim(client, "a1")
    r = client.post("/admin/agents/a1/stop", json={"reason": "runaway"})
    assert f"lease on #{task['issue_id']} revoked" in r.json()["outcome"]
    beat = lease_call(client, task, "a1", "heartbeat")
    assert beat.status_code == 409 and "agent stopped by admin: runaway" in beat.json()["detail"]
    assert client.post("/request-task", json={"agent_id": "a1"}).status_code == 409
    # Once in the audit log, its outcome naming the lease it revoked.
    stops = [e for e in audit(client) if e["action"] == "stop_agent"]
    assert len(stops) == 1 and f"lease on #{task['issue_id']} revoked" in stops[0]["outcome"]


def test_reassign_moves_the_lease_keeps_the_branch_and_the_new_task_says_whose_work_it_is(
    client: TestClient, sim: Simulator
) -> None:
    task = claim(client, "a1")
    n = task["issue_id"]
    client.post(
        f"/tasks/{REPO}/{n}/heartbeat",
        json={"agent_id": "a1", "token": task["lease"]["token"], "note": "parser half done"},
    )
    r = client.post(
        f"/admin/tasks/{REPO}/{n}/reassign", json={"agent_id": "a2", "reason": "a1 is stuck"}
    )
    assert (
        r.json()["outcome"]
        == "development task reserved for a2 (its next request-task); lease of a1 revoked"
    )
    beat = lease_call(client, task, "a1", "heartbeat")
    assert beat.status_code == 409 and "reassigned to a2" in beat.json()["detail"]
    # Nobody else gets it; a2 does, on the same branch, told whose work it continues.
    assert claim(client, "a3")["issue_id"] != n
    moved = claim(client, "a2")
    assert moved["issue_id"] == n and moved["branch_name"] == task["branch_name"]
    assert moved["continues"]["from_agent"] == "a1"
    assert moved["continues"]["note"] == "parser half done"
    assert "Continue the work of a1" in moved["prompt"] and task["branch_name"] in moved["prompt"]


def test_pausing_the_repository_stops_hand_outs_but_not_leases(client: TestClient) -> None:
    task = claim(client, "a1")
    client.post(f"/admin/repos/{REPO}/pause", json={"reason": "migration"})
    assert client.post("/request-task", json={"agent_id": "a2"}).status_code == 204
    assert lease_call(client, task, "a1", "heartbeat").status_code == 200
    client.post(f"/admin/repos/{REPO}/resume", json={})
    assert claim(client, "a2")
    client.post("/admin/broker/pause", json={})
    assert client.post("/request-task", json={"agent_id": "a3"}).status_code == 204
    client.post("/admin/broker/resume", json={})
    assert claim(client, "a3")
    actions = [e["action"] for e in audit(client)]
    for action in ("pause_repo", "resume_repo", "pause_broker", "resume_broker"):
        assert actions.count(action) == 1, actions


def test_admin_actions_refuse_bad_input_before_any_work(client: TestClient) -> None:
    assert client.post(f"/admin/tasks/{REPO}/99/revoke", json={}).status_code == 404
    bad = client.post("/admin/agents/P1/pause", json={})
    assert bad.status_code == 422 and "label" in bad.json()["detail"]
    too_long = client.post(f"/admin/tasks/{REPO}/1/note", json={"text": "x" * 1001})
    assert too_long.status_code == 422
    assert client.post("/admin/agents/has%20space/pause", json={}).status_code == 422
    assert audit(client) == []


# --- real processes: two serve processes, the CLI ------------------------------------------


@pytest.mark.slow
def test_after_pause_no_serve_process_hands_the_agent_anything_while_its_task_completes(
    redis_url: str, tmp_path: Path
) -> None:
    with Simulator(
        {
            "repositories": [
                {
                    "owner": "acme",
                    "name": "widgets",
                    "issues": generate_issues(30, priorities=("P1",)),
                }
            ]
        }
    ) as sim:
        env = broker_env(redis_url, sim.base_url, REPO, GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0")
        brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
        client = redis.Redis.from_url(redis_url)
        try:
            ready = "gb:{repo::acme::widgets}:ready"
            wait_for(lambda: client.zcard(ready) == 30, 30, "the first sync")
            task = post(brokers[0].url, "/request-task", {"agent_id": "a1"}).json()
            r = post(brokers[1].url, "/admin/agents/a1/pause", {"reason": "drain"})
            assert r.status_code == 200, r.text
            lease = {"agent_id": "a1", "token": task["lease"]["token"]}
            beat = post(brokers[0].url, f"/tasks/{REPO}/{task['issue_id']}/heartbeat", lease)
            assert beat.json()["agent_paused"]["reason"] == "drain"
            # Its current task may finish.
            done = post(brokers[1].url, f"/tasks/{REPO}/{task['issue_id']}/complete", lease)
            assert done.status_code == 200, done.text
            claims = 0
            for i in range(20):
                got = post(brokers[i % 2].url, "/request-task", {"agent_id": "a1"})
                assert got.status_code == 409 and got.json()["reason"] == "agent_paused"
                claims += got.status_code == 200
            assert claims == 0
            assert not any(
                (client.hget(f"gb:{{repo::acme::widgets}}:lease:{n}", "agent") or b"") == b"a1"
                for n in range(1, 31)
            )
        finally:
            client.close()
            for b in brokers:
                b.stop()


@pytest.mark.slow
def test_the_cli_verbs_act_and_the_audit_shows_them(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    # No settle grace: a1's request right after the pause must not be taken for a retry of
    # the request that claimed its task (which gets that same task back, paused or not).
    settings = broker_env(redis_url, sim.base_url, REPO, GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0")
    env = {**os.environ, **settings}
    broker = BrokerProcess(settings, tmp_path, "b").start()
    try:
        client = redis.Redis.from_url(redis_url)
        wait_for(lambda: client.zcard("gb:{repo::acme::widgets}:ready") == 3, 30, "sync")
        client.close()
        task = post(broker.url, "/request-task", {"agent_id": "a1"}).json()
        n = task["issue_id"]

        def cli(*args: str) -> str:
            out = subprocess.run(
                [sys.executable, "-m", "github_broker", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            )
            return out.stdout

        assert "queued for the next heartbeat of a1" in cli("note", str(n), "look at #2")
        beat = post(
            broker.url,
            f"/tasks/{REPO}/{n}/heartbeat",
            {"agent_id": "a1", "token": task["lease"]["token"]},
        ).json()
        assert [note["text"] for note in beat["notes"]] == ["look at #2"]
        assert "paused: its current task may finish" in cli("pause", "a1", "--reason", "drain")
        assert post(broker.url, "/request-task", {"agent_id": "a1"}).status_code == 409
        assert "resumed" in cli("resume", "a1")
        held = post(broker.url, "/request-task", {"agent_id": "a2"}).json()
        assert "lease of a2 revoked" in cli("revoke", f"{REPO}#{held['issue_id']}", "--reason", "x")
        log = cli("audit")
        for action in ("pause_agent", "resume_agent", "revoke", "note"):
            assert action in log, log
        assert "cli:" in log
    finally:
        broker.stop()


def test_a_token_removed_from_the_tokens_file_is_refused_without_a_restart(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    tokens = tmp_path / "agents.yml"
    tokens.write_text("a1: token-one-0123456789\na2: token-two-0123456789\n")
    settings = make_settings(
        redis={"url": redis_url},
        github={"base_url": sim.base_url},
        server={"run_poller": False, "agent_tokens_file": str(tokens), "admin_token": "adm"},
    )
    synced(settings)
    with TestClient(create_app(settings)) as c:
        one = {"authorization": "Bearer token-one-0123456789"}
        assert c.post("/request-task", json={"agent_id": "a1"}, headers=one).status_code == 200
        tokens.write_text("a2: token-two-0123456789\n")
        wait_until(
            lambda: (
                c.post("/request-task", json={"agent_id": "a1"}, headers=one).status_code == 401
            ),
            3,
            "the removed token refused",
        )
        two = {"authorization": "Bearer token-two-0123456789"}
        assert c.post("/request-task", json={"agent_id": "a2"}, headers=two).status_code == 200


def test_the_audit_file_gets_every_entry_once_as_json_lines(
    client: TestClient, tmp_path: Path, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    from github_broker.leader.audit_file import AuditFile
    from github_broker.store import Store

    task = claim(client, "a1")
    client.post(f"/admin/tasks/{REPO}/{task['issue_id']}/revoke", json={"reason": "r1"})
    client.post("/admin/agents/a9/pause", json={"reason": "r2"})
    path = tmp_path / "audit" / "log.jsonl"

    async def export() -> int:
        store = Store.from_settings(make_settings(redis={"url": redis_url}))
        try:
            return await AuditFile(path, store).append_new()
        finally:
            await store.close()

    assert asyncio.run(export()) == 2
    assert asyncio.run(export()) == 0  # nothing new: nothing appended twice
    client.post("/admin/agents/a9/resume", json={})
    assert asyncio.run(export()) == 1
    lines = [json.loads(row) for row in path.read_text().splitlines()]
    # The deployment's stream first, then each repository's, per pass.
    assert [row["action"] for row in lines] == ["pause_agent", "revoke", "resume_agent"]
    assert {row["reason"] for row in lines} >= {"r1", "r2"}
    assert all(row["at"].endswith("Z") and row["actor"] == "admin" for row in lines)


def test_an_agent_the_broker_does_not_know_is_refused_404_naming_the_known_ones(
    client: TestClient,
) -> None:
    """Reassigning to, stopping or resuming an agent id nobody uses would be a silent no-op
    (the task reserved for a name that never asks; `A1` stopped while `a1` works on)."""
    task = claim(client, "a1")
    n = task["issue_id"]
    typo = client.post(f"/admin/tasks/{REPO}/{n}/reassign", json={"agent_id": "nobody-yet"})
    assert typo.status_code == 404 and "no agent 'nobody-yet'" in typo.json()["detail"]
    assert "known: a0, a1" in typo.json()["detail"]
    case = client.post("/admin/agents/A1/stop", json={"reason": "runaway"})
    assert case.status_code == 404 and "did you mean 'a1'?" in case.json()["detail"]
    assert lease_call(client, task, "a1", "heartbeat").status_code == 200  # a1 works on
    assert client.post("/admin/agents/A1/resume", json={}).status_code == 404
    assert client.post("/admin/agents/a1/stop", json={"reason": "runaway"}).status_code == 200
    assert lease_call(client, task, "a1", "heartbeat").status_code == 409
