"""People by name, rights by repository, on a real `serve`: a maintainer of acme/widgets named in
the maintainers file steers widgets through the API, the CLI and the dashboard, is refused (403)
on acme/gadgets and on the whole broker, every refusal audited as refused under their name;
they read only their repositories; removing them from the file ends their access without a
restart."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, wait_for
from tests.waiting import wait_until

ALICE = "alice-token-0123456789abcdef"
BOSS = "boss-token-0123456789abcdef"
AGENT = "agent-token-0123456789abcdef"
AGENTS = {"a1": AGENT, "a2": "agent-two-token-0123456789"}
REPOS = ("acme/widgets", "acme/gadgets")


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def maintainers(alice: bool = True) -> str:
    entries = [f"bob:\n  token_sha256: {digest(BOSS)}\n  authority: admin\n"]
    if alice:
        entries.append(
            f"alice:\n  token_sha256: {digest(ALICE)}\n  authority: maintainer\n"
            "  repositories: [acme/widgets]\n"
        )
    return "".join(entries)


@dataclass
class Deployment:
    broker: BrokerProcess
    file: Path

    def call(self, token: str, method: str, path: str, body: Any = None) -> requests.Response:
        return requests.request(
            method,
            self.broker.url + path,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def audit(self, token: str = BOSS) -> list[dict[str, Any]]:
        r = self.call(token, "GET", "/admin/audit?limit=200")
        assert r.status_code == 200, r.text
        entries: list[dict[str, Any]] = r.json()
        return entries

    def claim(self, repository: str, agent: str = "a1") -> dict[str, Any]:
        r = requests.post(
            self.broker.url + "/request-task",
            json={"agent_id": agent, "repositories": [repository]},
            headers={"Authorization": f"Bearer {AGENTS[agent]}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        task: dict[str, Any] = r.json()
        return task


@pytest.fixture
def deployment(redis_url: str, tmp_path: Path) -> Iterator[Deployment]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": name, "issues": generate_issues(2, priorities=("P1",))}
            for name in ("widgets", "gadgets")
        ]
    }
    file = tmp_path / "maintainers.yml"
    file.write_text(maintainers())
    with Simulator(seed) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            ",".join(REPOS),
            GITHUB_BROKER_SERVER__MAINTAINERS_FILE=str(file),
            GITHUB_BROKER_SERVER__AGENT_TOKENS=json.dumps(AGENTS),
            GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
        )
        broker = BrokerProcess(env, tmp_path, "broker", single_process=True).start()
        try:
            up = Deployment(broker, file)
            wait_for(lambda: _queued(up) == 4, 30, "the first sync of both repositories")
            yield up
        finally:
            broker.stop()


def _queued(up: Deployment) -> int:
    status = up.call(BOSS, "GET", "/status").json()
    return sum(sum(r["ready_by_priority"].values()) for r in status["repositories"])


def refusals(entries: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["actor"] == name and e["outcome"].startswith("refused")]


def test_a_maintainer_steers_their_repository_and_is_refused_and_audited_elsewhere(
    deployment: Deployment,
) -> None:
    up = deployment
    widget = up.claim("acme/widgets", "a2")
    gadget = up.claim("acme/gadgets")
    theirs = f"/admin/tasks/acme/gadgets/{gadget['issue_id']}/revoke"
    r = up.call(ALICE, "POST", theirs, {"reason": "not mine"})
    assert r.status_code == 403 and r.json()["reason"] == "forbidden"
    assert "alice (a maintainer of acme/widgets) may not act on acme/gadgets" in r.json()["detail"]
    assert up.call(ALICE, "POST", "/admin/broker/pause", {"reason": "x"}).status_code == 403
    assert up.call(ALICE, "POST", "/admin/repos/acme/gadgets/pause", {}).status_code == 403
    mine = f"/admin/tasks/acme/widgets/{widget['issue_id']}/note"
    ok = up.call(ALICE, "POST", mine, {"text": "use\x1b[31m the \u202eparser\x00"})
    assert ok.status_code == 200, ok.text
    entries = up.audit()
    refused = refusals(entries, "alice")
    assert {(e["action"], e["repository"]) for e in refused} == {
        ("revoke", "acme/gadgets"),
        ("pause_broker", None),
        ("pause_repo", "acme/gadgets"),
    }
    assert all(e["authority"] == 3 for e in refused)  # a maintainer
    notes = [e for e in entries if e["action"] == "note"]
    assert [(e["actor"], e["authority"], e["reason"]) for e in notes] == [
        ("alice", 3, "use[31m the parser")
    ]
    # Nothing was done on gadgets: its lease still heartbeats.
    beat = requests.post(
        f"{up.broker.url}/tasks/acme/gadgets/{gadget['issue_id']}/heartbeat",
        json={"agent_id": "a1", "token": gadget["lease"]["token"]},
        headers={"Authorization": f"Bearer {AGENT}"},
        timeout=10,
    )
    assert beat.status_code == 200, beat.text
    # Every entry names a person (or the broker, or an agent).
    assert all(e["actor"] in ("alice", "bob", "broker", "a1", "a2") for e in entries), entries


def test_a_maintainer_reads_only_their_repositories(deployment: Deployment) -> None:
    up = deployment
    widget = up.claim("acme/widgets", "a2")
    gadget = up.claim("acme/gadgets")
    revoke = f"/admin/tasks/acme/gadgets/{gadget['issue_id']}/revoke"
    assert up.call(BOSS, "POST", revoke, {"reason": "boss did it"}).status_code == 200
    status = up.call(ALICE, "GET", "/status").json()
    assert [r["repository"] for r in status["repositories"]] == ["acme/widgets"]
    assert [r["repository"] for r in status["health"]["repositories"]] == ["acme/widgets"]
    seen = up.audit(ALICE)
    assert all(e["repository"] == "acme/widgets" or e["actor"] == "alice" for e in seen)
    assert any(e["actor"] == "bob" for e in up.audit(BOSS))
    rows = up.call(ALICE, "GET", "/admin/agents").json()
    assert [(a["agent_id"], a["holds"]) for a in rows] == [
        ("a2", [f"acme/widgets#{widget['issue_id']}"])
    ]
    assert {a["agent_id"] for a in up.call(BOSS, "GET", "/admin/agents").json()} == {"a2"}
    explained = up.call(ALICE, "GET", "/explain?agent_id=a2").json()
    assert list(explained) == ["acme/widgets"]
    assert up.call(ALICE, "GET", "/explain?repository=acme/gadgets").status_code == 403


def test_the_cli_acts_as_the_person_of_its_token_through_the_api(deployment: Deployment) -> None:
    up = deployment
    gadget = up.claim("acme/gadgets")
    widget = up.claim("acme/widgets", "a2")
    env = {**os.environ, "GITHUB_BROKER_TOKEN": ALICE, "GITHUB_BROKER_URL": up.broker.url}

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "github_broker", *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = cli("revoke", f"acme/gadgets#{gadget['issue_id']}", "--reason", "from the cli")
    assert refused.returncode == 1, refused.stderr
    assert "Forbidden: 403" in refused.stderr and "may not act on acme/gadgets" in refused.stderr
    done = cli("revoke", f"acme/widgets#{widget['issue_id']}", "--reason", "from the cli")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"revoke acme/widgets#{widget['issue_id']}: ")
    stop = cli("stop", "a2", "--reason", "everywhere?")
    assert stop.returncode == 0, stop.stderr
    assert "stopped in acme/widgets" in stop.stdout
    entries = up.audit()
    mine = [
        (e["action"], e["repository"], e["outcome"][:8]) for e in entries if e["actor"] == "alice"
    ]
    assert ("revoke", "acme/gadgets", "refused:") in mine
    assert any(a == "revoke" and r == "acme/widgets" and o != "refused:" for a, r, o in mine)
    listed = cli("audit", "--limit", "5")
    assert listed.returncode == 0 and "alice" in listed.stdout


def test_the_dashboard_logs_in_as_the_person_and_refuses_elsewhere(deployment: Deployment) -> None:
    up = deployment
    gadget = up.claim("acme/gadgets")
    web = requests.Session()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    login = web.post(f"{up.broker.url}/ui/login", data={"token": ALICE}, allow_redirects=False)
    assert login.status_code == 303, login.text
    page = web.get(f"{up.broker.url}/ui").text
    assert '<p class="who" id="who">alice (a maintainer of acme/widgets)</p>' in page
    assert "acme/gadgets" not in page and "act-broker" not in page
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None
    r = web.post(
        f"{up.broker.url}/ui/actions/revoke",
        data={
            "csrf": csrf.group(1),
            "repository": "acme/gadgets",
            "issue": str(gadget["issue_id"]),
            "confirmed": "1",
            "reason": "from the page",
        },
        headers={**form, "Accept": "application/json"},
    )
    assert r.status_code == 403 and "may not act on acme/gadgets" in r.json()["detail"]
    refused = refusals(up.audit(), "alice")
    assert [(e["action"], e["repository"]) for e in refused] == [("revoke", "acme/gadgets")]


def test_a_person_removed_from_the_file_is_refused_without_a_restart(
    deployment: Deployment,
) -> None:
    up = deployment
    assert up.call(ALICE, "GET", "/status").status_code == 200
    web = requests.Session()
    assert web.post(f"{up.broker.url}/ui/login", data={"token": ALICE}).status_code == 200
    up.file.write_text(maintainers(alice=False))
    wait_until(
        lambda: up.call(ALICE, "GET", "/status").status_code == 401,
        5,
        "alice's token refused",
    )
    # Her dashboard session ended with her.
    r = web.get(f"{up.broker.url}/ui", allow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert up.call(BOSS, "GET", "/status").status_code == 200
