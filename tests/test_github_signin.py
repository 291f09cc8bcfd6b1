"""Signing in with a GitHub identity, on a real `serve` and the simulator: a pasted GitHub token
or the OAuth device flow makes the person a maintainer of the served repositories where GitHub
grants them maintain or admin (write alone gives nothing on the dashboard by default), in a
bounded number of GitHub calls; a maintainer of the file with `github_rights` is looked up per
repository, once, when they act there."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, wait_for

#: The simulator's tokens: the broker's own, and people's.
TOKENS = {
    "test-token": "broker-bot",
    "carol-gh-token": "carol",
    "dave-gh-token": "dave",
    "erin-gh-token": "erin",
}
ERIN = "erin-broker-token-0123456789"
BOSS = "boss-token-0123456789abcdef"
REPOS = ("widgets", "gadgets", "sprockets")
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@dataclass
class Stack:
    sim: Simulator
    broker: BrokerProcess

    def calls(self, route: str) -> int:
        counted: dict[str, int] = self.sim.stats.snapshot()["by_route"]
        return counted.get(route, 0)

    def revoke(self, web: requests.Session, page: str, repository: str) -> requests.Response:
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None
        return web.post(
            f"{self.broker.url}/ui/actions/pause_repo",
            data={"csrf": csrf.group(1), "repository": repository, "reason": "signed in"},
            headers={**FORM, "Accept": "application/json"},
        )


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    collaborators = {
        "widgets": {"carol": "maintain", "dave": "write", "erin": "admin"},
        "gadgets": {"carol": "write", "erin": "write"},
        "sprockets": {"carol": "admin"},
    }
    seed = {
        "repositories": [
            {
                "owner": "acme",
                "name": name,
                "issues": generate_issues(1),
                "collaborators": collaborators[name],
            }
            for name in REPOS
        ]
    }
    people = tmp_path / "maintainers.yml"
    people.write_text(
        f"bob:\n  token_sha256: {hashlib.sha256(BOSS.encode()).hexdigest()}\n"
        "  authority: admin\n"
        f"erin:\n  token_sha256: {hashlib.sha256(ERIN.encode()).hexdigest()}\n"
        "  github: erin\n  github_rights: true\n"
    )
    with Simulator(seed, tokens=TOKENS) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            "acme/widgets,acme/gadgets",  # acme/sprockets is not served
            GITHUB_BROKER_SERVER__MAINTAINERS_FILE=str(people),
            GITHUB_BROKER_SIGNIN__GITHUB="true",
            GITHUB_BROKER_SIGNIN__GITHUB_CLIENT_ID="Iv1.simulated",
        )
        broker = BrokerProcess(env, tmp_path, "broker", single_process=True).start()
        try:
            up = Stack(sim, broker)
            wait_for(lambda: up.calls("GET /repos/{owner}/{repo}/issues") >= 2, 30, "a sync")
            yield up
        finally:
            broker.stop()


def signed_in_page(stack: Stack, web: requests.Session) -> str:
    page = web.get(f"{stack.broker.url}/ui", allow_redirects=False)
    assert page.status_code == 200, page.status_code
    return page.text


def test_a_github_token_signs_in_as_a_maintainer_where_github_grants_maintain(
    stack: Stack,
) -> None:
    web = requests.Session()
    r = web.post(
        f"{stack.broker.url}/ui/login/github",
        data={"github_token": "carol-gh-token"},
        allow_redirects=False,
    )
    assert r.status_code == 303, r.text
    page = signed_in_page(stack, web)
    assert '<p class="who" id="who">github:carol (a maintainer of acme/widgets)</p>' in page
    assert "carol-gh-token" not in r.headers.get("set-cookie", "")
    assert stack.revoke(web, page, "acme/widgets").status_code == 200
    refused = stack.revoke(web, page, "acme/gadgets")  # write only there
    assert refused.status_code == 403
    audit = requests.get(
        f"{stack.broker.url}/admin/audit",
        headers={"Authorization": f"Bearer {BOSS}"},
        timeout=10,
    ).json()
    mine = [
        (e["action"], e["repository"], e["outcome"][:8])
        for e in audit
        if e["actor"] == "github:carol"
    ]
    assert ("pause_repo", "acme/gadgets", "refused:") in mine
    assert ("pause_repo", "acme/widgets", "paused: ") in mine


def test_signing_in_costs_a_bounded_number_of_github_calls_and_page_views_none(
    stack: Stack,
) -> None:
    before = {route: stack.calls(route) for route in ("GET /user", "GET /user/repos")}
    web = requests.Session()
    web.post(f"{stack.broker.url}/ui/login/github", data={"github_token": "carol-gh-token"})
    for _ in range(5):
        signed_in_page(stack, web)
    assert stack.calls("GET /user") - before["GET /user"] == 1
    assert stack.calls("GET /user/repos") - before["GET /user/repos"] == 1  # 3 repositories: 1 page
    assert stack.calls("GET /repos/{owner}/{repo}/collaborators/{username}/permission") == 0


def test_write_alone_or_a_refused_token_does_not_sign_in(stack: Stack) -> None:
    web = requests.Session()
    r = web.post(f"{stack.broker.url}/ui/login/github", data={"github_token": "dave-gh-token"})
    assert r.status_code == 403 and "dave is not granted maintain" in r.text
    r = web.post(f"{stack.broker.url}/ui/login/github", data={"github_token": "not-a-token"})
    assert r.status_code == 401 and "GitHub does not accept that token" in r.text
    assert web.get(f"{stack.broker.url}/ui", allow_redirects=False).status_code == 303


def test_the_device_flow_signs_in_once_the_person_enters_the_code_on_github(
    stack: Stack,
) -> None:
    web = requests.Session()
    started = web.post(f"{stack.broker.url}/ui/login/github/device")
    assert started.status_code == 200, started.text
    code = re.search(r'id="user-code"><strong>([A-Z0-9]{4}-[A-Z0-9]{4})<', started.text)
    assert code is not None and f"{stack.sim.base_url}/login/device" in started.text
    pending = web.post(f"{stack.broker.url}/ui/login/github/device/poll", allow_redirects=False)
    assert pending.status_code == 200 and "has not seen the code entered yet" in pending.text
    approve = {"user_code": code.group(1), "login": "carol"}
    assert requests.post(f"{stack.sim.base_url}/_sim/device/authorize", json=approve).ok
    done = web.post(f"{stack.broker.url}/ui/login/github/device/poll", allow_redirects=False)
    assert done.status_code == 303, done.text
    assert "github:carol (a maintainer of acme/widgets)" in signed_in_page(stack, web)
    again = web.post(f"{stack.broker.url}/ui/login/github/device/poll", allow_redirects=False)
    assert again.status_code == 401  # that sign-in is over


def test_a_file_maintainer_with_github_rights_is_looked_up_once_per_repository(
    stack: Stack,
) -> None:
    route = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"
    bearer = {"Authorization": f"Bearer {ERIN}"}

    def pause(repository: str) -> requests.Response:
        return requests.post(
            f"{stack.broker.url}/admin/repos/{repository}/pause",
            json={"reason": "erin"},
            headers=bearer,
            timeout=10,
        )

    assert pause("acme/widgets").status_code == 200  # admin there
    assert pause("acme/gadgets").status_code == 403  # write only
    looked_up = stack.calls(route)
    assert looked_up == 2
    for _ in range(3):
        assert pause("acme/widgets").status_code == 200
        assert pause("acme/gadgets").status_code == 403
    assert stack.calls(route) == looked_up  # cached
    status: dict[str, Any] = requests.get(
        f"{stack.broker.url}/status", headers=bearer, timeout=10
    ).json()
    assert [r["repository"] for r in status["repositories"]] == ["acme/widgets"]
