"""Scoped GitHub credentials for agents, on a real `serve` with a GitHub App and the simulator:
each lease gets a short-lived installation token limited to its task's repository and the
permissions an agent needs; it works there, GitHub refuses it elsewhere and beyond those
permissions; the same lease gets the same token again; completing the task revokes it. The
SDK, the runner and the MCP server's session hand it to the agent."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import requests

from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import BrokerClient
from github_broker.agent.mcp_tools import describe
from github_broker.agent.runner import Runner
from github_broker.agent.runner.config import RunnerConfig
from github_broker.agent.session import AgentSession
from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, wait_for
from tests.test_github_app import APP_ID, INSTALLATION, pem_pair

AGENT_TOKEN = "agent-a-token-0123456789"
MINT = "POST /app/installations/{installation_id}/access_tokens"


@dataclass
class AppStack:
    sim: Simulator
    broker: BrokerProcess

    def client(self) -> BrokerClient:
        return BrokerClient(self.broker.url, "agent-a", token=AGENT_TOKEN, backoff_s=0.1)

    def github(self, token: str, method: str, path: str, body: object = None) -> int:
        r = requests.request(
            method,
            self.sim.base_url + path,
            json=body,
            headers={"Authorization": f"token {token}", "User-Agent": "test"},
            timeout=10,
        )
        return r.status_code

    def mints(self) -> int:
        counted: dict[str, int] = self.sim.stats.snapshot()["by_route"]
        return counted.get(MINT, 0)


@pytest.fixture(scope="module")
def keys() -> tuple[str, str]:
    return pem_pair()


@pytest.fixture
def stack(keys: tuple[str, str], redis_url: str, tmp_path: Path) -> Iterator[AppStack]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": name, "issues": generate_issues(1, priorities=("P1",))}
            for name in ("widgets", "gadgets")
        ]
    }
    # tokens={}: the simulator accepts only the tokens it minted itself.
    with Simulator(seed, tokens={}, apps={APP_ID: keys[1]}) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            "acme/widgets,acme/gadgets",
            GITHUB_BROKER_GITHUB__APP_ID=str(APP_ID),
            GITHUB_BROKER_GITHUB__APP_INSTALLATION_ID=str(INSTALLATION),
            GITHUB_BROKER_GITHUB__APP_PRIVATE_KEY=keys[0],
            GITHUB_BROKER_GITHUB__AGENT_CREDENTIALS="true",
            GITHUB_BROKER_SERVER__AGENT_TOKENS=json.dumps({"agent-a": AGENT_TOKEN}),
            GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
        )
        del env["GITHUB_BROKER_GITHUB__TOKEN"]
        broker = BrokerProcess(env, tmp_path, "broker", single_process=True).start()
        try:
            client = redis.Redis.from_url(redis_url)
            ready = [RepoKeys("gb", "acme", n).ready for n in ("widgets", "gadgets")]
            try:
                wait_for(
                    lambda: all(client.zcard(k) == 1 for k in ready), 30, "the first syncs"
                )
            finally:
                client.close()
            yield AppStack(sim, broker)
        finally:
            broker.stop()


def test_a_lease_token_works_on_its_repository_and_is_refused_on_another(
    stack: AppStack,
) -> None:
    with stack.client() as client:
        task = client.request_task(repositories=["acme/widgets"])
        assert task is not None and task.credential_path == "/tasks/acme/widgets/1/credential"
        before = stack.mints()
        credential = client.credential(task)
        assert credential is not None and credential.repository == "acme/widgets"
        assert credential.permissions == {
            "contents": "write",
            "pull_requests": "write",
            "issues": "read",
        }
        token = credential.token
        assert stack.github(token, "GET", "/repos/acme/widgets/issues/1") == 200
        ref = {"ref": "refs/heads/agent-work", "sha": "0" * 40}
        assert stack.github(token, "POST", "/repos/acme/widgets/git/refs", ref) in (201, 422)
        # Elsewhere, and beyond its permissions, GitHub refuses it.
        assert stack.github(token, "GET", "/repos/acme/gadgets/issues/1") == 403
        assert stack.github(token, "POST", "/repos/acme/gadgets/git/refs", ref) == 403
        comment = {"body": "not allowed to write issues"}
        assert stack.github(token, "POST", "/repos/acme/widgets/issues/1/comments", comment) == 403
        assert stack.github(token, "GET", "/user") == 403
        # The same lease gets the same token again, without a new mint.
        again = client.credential(task)
        assert again is not None and again.token == token
        assert stack.mints() - before == 1
        client.complete(task)
    # Completing the task revoked it.
    wait_for(
        lambda: stack.github(token, "GET", "/repos/acme/widgets/issues/1") == 401,
        10,
        "the token's revocation",
    )


def test_only_the_leases_holder_gets_a_token(stack: AppStack) -> None:
    with stack.client() as client:
        task = client.request_task(repositories=["acme/gadgets"])
        assert task is not None
        forged = task.model_copy(update={"lease": task.lease.model_copy(update={"token": "x"})})
        r = requests.post(
            f"{stack.broker.url}{task.credential_path}",
            json={"agent_id": "agent-a", "token": forged.lease.token},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
            timeout=10,
        )
        assert r.status_code == 409 and r.json()["reason"] == "not_owner"
        client.release(task)


def test_the_runner_hands_the_token_to_its_command(stack: AppStack, tmp_path: Path) -> None:
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, sys; json.dump({k: os.environ.get(k) for k in "
        "('GH_TOKEN', 'GITHUB_TOKEN', 'GB_REPOSITORY')}, open(sys.argv[1], 'w'))"
    )
    with stack.client() as client:
        config = RunnerConfig(
            command=[sys.executable, "-c", script, str(seen)],
            workdir=tmp_path,
            once=True,
            wait_s=5,
        )
        assert Runner(client, config).run() == 0
    env = json.loads(seen.read_text())
    assert env["GH_TOKEN"] == env["GITHUB_TOKEN"] and env["GH_TOKEN"].startswith("ghs_")
    repository = env["GB_REPOSITORY"]
    other = "acme/gadgets" if repository == "acme/widgets" else "acme/widgets"
    assert stack.github(env["GH_TOKEN"], "GET", f"/repos/{other}/issues/1") in (401, 403)


@pytest.mark.anyio
async def test_the_mcp_session_tells_the_agent_its_token(stack: AppStack) -> None:
    client = AsyncBrokerClient(stack.broker.url, "agent-a", token=AGENT_TOKEN)
    session = AgentSession(client)
    try:
        task = await session.claim(None, ["acme/gadgets"], 5, None, None)
        assert task is not None
        credential = await session.credential(task)
        assert credential is not None
        text = describe(task, session.check_interval_s, credential)
        assert f"GH_TOKEN={credential.token}" in text and "acme/gadgets only" in text
        assert stack.github(credential.token, "GET", "/repos/acme/gadgets/issues/1") == 200
        await session.finish("abandoned")
    finally:
        await session.close()
        await client.aclose()
