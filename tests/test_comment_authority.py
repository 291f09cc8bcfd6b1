"""Comment commands act within their repository and never lift a higher authority's decision:
a real `serve` over two repositories, people commenting through the simulator (read by the
poll), the broker's replies on GitHub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator
from tests.conftest import sync_client
from tests.factories import body
from tests.processes import BrokerProcess, broker_env, post
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
WIDGETS, GADGETS = "acme/widgets", "acme/gadgets"


def issues(*numbers: int) -> list[dict[str, Any]]:
    return [
        {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in numbers
    ]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            # gus writes to gadgets only; mona maintains widgets.
            {
                "owner": "acme",
                "name": "widgets",
                "issues": issues(1, 2),
                "collaborators": {"mona": "maintain"},
            },
            {
                "owner": "acme",
                "name": "gadgets",
                "issues": issues(1, 2, 3),
                "collaborators": {"gus": "write"},
            },
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.fixture
def broker(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    # No settle grace: a1 asks right after completing.
    env = broker_env(
        redis_url, sim.base_url, f"{WIDGETS},{GADGETS}", GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0"
    )
    proc = BrokerProcess(env, tmp_path, "b").start()
    client = sync_client(redis_url)
    try:
        for name in (WIDGETS, GADGETS):
            keys = RepoKeys("gb", *name.split("/"))
            wait_until(lambda k=keys: client.exists(k.mirror), 30, f"the first sync of {name}")
            wait_until(
                lambda k=keys: client.hget(k.comments, "since") is not None,
                30,
                f"the first look at {name}'s comments",
            )
        yield proc
    finally:
        client.close()
        proc.stop()


def claim(broker: BrokerProcess, agent: str, repository: str) -> dict[str, Any]:
    r = post(broker.url, "/request-task", {"agent_id": agent, "repositories": [repository]})
    assert r.status_code == 200, r.text
    return dict(r.json())


def lease(task: dict[str, Any], agent: str) -> dict[str, str]:
    return {"agent_id": agent, "token": task["lease"]["token"]}


def beat(broker: BrokerProcess, task: dict[str, Any], agent: str) -> requests.Response:
    path = f"/tasks/{task['repository']}/{task['issue_id']}/heartbeat"
    return post(broker.url, path, lease(task, agent))


def audit(broker: BrokerProcess) -> list[dict[str, Any]]:
    answer = requests.get(f"{broker.url}/admin/audit", params={"limit": 50}, timeout=10)
    return list(answer.json())


def reply_to(sim: Simulator, repository: str, n: int, login: str) -> str:
    """The broker's reply to `login` on issue n, once there is one."""
    owner, name = repository.split("/")

    def found() -> str:
        for c in sim.state.list_issue_comments(owner, name, n):
            if c["body"].startswith(f"@{login}"):
                return str(c["body"])
        return ""

    return wait_until(found, 15, f"the broker's reply to {login} on {repository}#{n}")


def test_a_writer_of_one_repository_stops_an_agent_there_only(
    sim: Simulator, broker: BrokerProcess
) -> None:
    held = claim(broker, "a1", WIDGETS)
    sim.state.add_issue_comment("acme", "gadgets", 1, user="gus", body="/broker stop a1")
    stopped = wait_until(
        lambda: [e for e in audit(broker) if e["action"] == "stop_agent"], 15, "gus's stop"
    )[0]
    assert stopped["actor"] == "github:gus" and stopped["outcome"] == "stopped in acme/gadgets"
    # a1 keeps its widgets lease; once done with it, gadgets hands it nothing, widgets does.
    assert beat(broker, held, "a1").status_code == 200
    done = post(broker.url, f"/tasks/{WIDGETS}/{held['issue_id']}/complete", lease(held, "a1"))
    assert done.status_code == 200
    refused = post(broker.url, "/request-task", {"agent_id": "a1", "repositories": [GADGETS]})
    assert refused.status_code == 409 and refused.json()["reason"] == "agent_paused"
    assert claim(broker, "a1", WIDGETS)["repository"] == WIDGETS


def test_a_writers_comment_never_lifts_an_administrators_stop_or_the_breaker(
    sim: Simulator, broker: BrokerProcess
) -> None:
    claim(broker, "a4", GADGETS)
    r = post(broker.url, "/admin/agents/a4/stop", {"reason": "compromised, do not resume"})
    assert r.status_code == 200, r.text
    sim.state.add_issue_comment("acme", "gadgets", 2, user="gus", body="/broker resume a4")
    said = reply_to(sim, GADGETS, 2, "gus")
    assert "refused" in said and "an administrator" in said
    again = post(broker.url, "/request-task", {"agent_id": "a4", "repositories": [GADGETS]})
    assert again.status_code == 409 and again.json()["reason"] == "agent_paused"
    refused = [
        e for e in audit(broker) if e["action"] == "resume_agent" and e["actor"] == "github:gus"
    ]
    assert refused and refused[0]["outcome"].startswith("refused")
    assert refused[0]["authority"] == 1  # a writer
