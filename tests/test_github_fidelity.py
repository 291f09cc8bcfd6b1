"""The simulator refuses what GitHub refuses, and the gateway reads GitHub's answers right."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from github_broker.errors import GitHubRefused
from github_broker.gateway import GitHubGateway
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from tests.factories import body
from tests.world import REPO, running_world, simulated

TOKENS = {"t-broker": "broker-bot", "t-alice": "alice", "t-dev": "dev-bot"}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "issues": []}]}
    with Simulator(seed, tokens=TOKENS) as s:
        yield s


def call(sim: Simulator, verb: str, path: str, token: str = "t-broker", **kw: Any) -> Any:
    headers = {"Authorization": f"token {token}", "User-Agent": "fidelity-test"}
    return requests.request(verb, sim.base_url + path, headers=headers, timeout=5, **kw)


def test_label_with_an_invalid_colour_is_refused(sim: Simulator) -> None:
    answer = call(sim, "POST", "/repos/acme/widgets/labels", json={"name": "x", "color": "invalid"})
    assert answer.status_code == 422
    assert answer.json()["errors"] == [{"resource": "Label", "field": "color", "code": "invalid"}]
    made = call(sim, "POST", "/repos/acme/widgets/labels", json={"name": "x", "color": "#a1B2c3"})
    assert made.status_code == 201 and made.json()["color"] == "a1B2c3"
    again = call(sim, "POST", "/repos/acme/widgets/labels", json={"name": "X", "color": "ffffff"})
    assert again.status_code == 422 and again.json()["errors"][0]["code"] == "already_exists"


@pytest.mark.parametrize(
    ("ref", "sha", "message"),
    [
        ("refs/heads/bad name..x", None, "refs/heads/bad name..x is not a valid ref name."),
        ("refs/heads/ok", "not-a-sha", "Object does not exist"),
        ("refs/heads/ok", "0" * 40, "Object does not exist"),
        ("refs/heads/main/sub", None, "Reference update failed"),
        ("refs/heads/main", None, "Reference already exists"),
    ],
)
def test_ref_github_would_not_create_is_refused(
    sim: Simulator, ref: str, sha: str | None, message: str
) -> None:
    tip = call(sim, "GET", "/repos/acme/widgets/git/ref/heads/main").json()["object"]["sha"]
    answer = call(sim, "POST", "/repos/acme/widgets/git/refs", json={"ref": ref, "sha": sha or tip})
    assert answer.status_code == 422 and answer.json()["message"] == message


def test_pending_review_is_seen_only_by_its_author(sim: Simulator) -> None:
    sim.state.create_pull("acme", "widgets", title="x", head="feature/x", user="dev-bot")
    draft = call(sim, "POST", "/repos/acme/widgets/pulls/1/reviews", "t-alice", json={"body": "d"})
    assert draft.status_code == 200 and draft.json()["state"] == "PENDING"
    mine = call(sim, "GET", "/repos/acme/widgets/pulls/1/reviews", "t-alice").json()
    theirs = call(sim, "GET", "/repos/acme/widgets/pulls/1/reviews", "t-broker").json()
    assert [r["state"] for r in mine] == ["PENDING"]
    assert theirs == []


def test_request_without_a_user_agent_is_forbidden(sim: Simulator) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    conn.request("GET", "/repos/acme/widgets", headers={"Authorization": "token t-broker"})
    answer = conn.getresponse()
    assert answer.status == 403
    assert "User-Agent" in json.loads(answer.read())["message"]
    conn.close()


def test_gateway_tells_already_exists_from_invalid(
    sim: Simulator, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(github={"base_url": sim.base_url, "token": "t-broker"})
    gateway = GitHubGateway(settings.github)
    try:
        assert gateway.ensure_label(REPO, "P1", "ff0000", "") is True
        assert gateway.ensure_label(REPO, "P1", "ff0000", "") is False
        with pytest.raises(GitHubRefused) as bad_colour:
            gateway.ensure_label(REPO, "P2", "invalid", "")
        assert bad_colour.value.code == "invalid"
        assert gateway.create_branch(REPO, "feature/a", "main") is True
        assert gateway.create_branch(REPO, "feature/a", "main") is False
        with pytest.raises(GitHubRefused) as bad_ref:
            gateway.create_branch(REPO, "bad name..x", "main")
        assert bad_ref.value.code == "invalid"
    finally:
        gateway.close()


@pytest.mark.anyio
async def test_renamed_repository_is_followed_with_its_query(
    redis_url: str, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    issues = [
        {"number": n, "title": f"t{n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in range(1, 41)
    ]
    with simulated(issues) as sim:
        sim.state.rename_repo("acme", "widgets", "acme-labs", "gadgets")
        moved = requests.get(
            f"{sim.base_url}/repos/acme/widgets/issues?state=all&per_page=100",
            headers={"User-Agent": "t"},
            allow_redirects=False,
            timeout=5,
        )
        assert moved.status_code == 301 and moved.json()["message"] == "Moved Permanently"
        assert moved.headers["Location"].endswith("/issues?state=all&per_page=100")
        caplog.set_level(logging.WARNING, logger="github_broker.gateway")
        async with running_world(sim, redis_url, make_settings) as world:
            await world.tick()  # a full pass: all 40, not GitHub's default 30
            assert len(await world.rstore.open_numbers()) == 40
            sim.state.update_issue("acme-labs", "gadgets", 7, state="closed")
            await world.tick()  # incremental: state=all&since=..., so the closure is seen
            assert 7 not in await world.rstore.open_numbers()
        assert any("acme-labs/gadgets" in r.getMessage() for r in caplog.records)


def test_control_api_renames_a_repository(sim: Simulator) -> None:
    renamed = requests.post(
        f"{sim.base_url}/_sim/repos/acme/widgets/rename", json={"name": "gadgets"}, timeout=5
    )
    assert renamed.status_code == 200 and renamed.json()["full_name"] == "acme/gadgets"
    old = call(sim, "GET", "/repos/acme/widgets/issues?state=closed", allow_redirects=False)
    assert old.status_code == 301
    repo_id = renamed.json()["id"]
    assert old.headers["Location"].endswith(f"/repositories/{repo_id}/issues?state=closed")
    followed = call(sim, "GET", "/repos/acme/widgets")
    assert followed.status_code == 200 and followed.json()["full_name"] == "acme/gadgets"
