"""Webhooks against a hostile sender and a new user's GitHub settings: replayed signed bodies,
bursts that would spend the quota, refused deliveries in the log, GitHub's default form
encoding, and the pings of organization and App webhooks (GitHub's published shapes)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jsonschema
import pytest
import redis
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.keys import RepoKeys
from github_broker.leader.budget import GitHubBudget
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.webhooks import receiver as receiver_module
from github_broker.webhooks.receiver import RefusalLog, WebhookReceiver
from tests.test_webhooks import SECRET, sign, unlabelled_issue
from tests.world import REPO, running_world, simulated

SCHEMAS = json.loads(
    (Path(__file__).parent / "fixtures" / "webhook_schemas" / "schema.json").read_text()
)["definitions"]


def comment_on_pull(pr: int, text: str = "please rename it") -> bytes:
    """An `issue_comment` on a pull request: the worker reads that PR from GitHub (one call)."""
    return json.dumps(
        {
            "action": "created",
            "issue": {
                "number": pr,
                "updated_at": "2026-11-01T12:00:00Z",
                "labels": [],
                "pull_request": {"url": f"https://api.github.com/repos/{REPO}/pulls/{pr}"},
            },
            "comment": {"id": pr * 10, "body": text},
            "repository": {"full_name": REPO},
        }
    ).encode()


def post(
    c: TestClient,
    data: bytes,
    delivery: str,
    event: str = "issue_comment",
    signature: str | None = None,
    content_type: str = "application/json",
) -> Any:
    return c.post(
        "/github/webhook",
        content=data,
        headers={
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": signature if signature is not None else sign(data),
            "Content-Type": content_type,
        },
    )


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(unlabelled_issue()) as s:
        yield s


@pytest.fixture
def hook_settings(
    redis_url: str, make_settings: Callable[..., Settings], sim: Simulator
) -> Settings:
    return make_settings(
        redis={"url": redis_url},
        github={"base_url": sim.base_url},
        server={"run_poller": False},
        webhooks={"secret": SECRET},
    )


def queued(redis_url: str) -> int:
    return int(redis.Redis.from_url(redis_url).llen(RepoKeys("gb", "acme", "widgets").webhooks))


def test_a_thousand_replays_under_fresh_ids_cost_at_most_one_github_request(
    sim: Simulator,
    hook_settings: Settings,
    redis_url: str,
    make_settings: Callable[..., Settings],
) -> None:
    data = comment_on_pull(7)
    with TestClient(create_app(hook_settings)) as c:
        answers = Counter(
            (r.status_code, r.json()["status"])
            for r in (post(c, data, f"fresh-{i}") for i in range(1000))
        )
        # GitHub's own redelivery (same id, same body) is still a plain duplicate.
        again = post(c, data, "fresh-0").json()
    assert answers == {(202, "queued"): 1, (200, "duplicate"): 999}
    assert again == {"status": "duplicate", "reason": "delivery fresh-0 was handled already"}
    assert queued(redis_url) == 1
    before = sim.stats.snapshot()["total"]

    async def apply() -> int:
        async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
            return await w.daemon.webhooks.drain(w.settings.repositories[0])

    assert asyncio.run(apply()) == 1
    assert sim.stats.snapshot()["total"] - before <= 1


@pytest.mark.anyio
async def test_a_burst_of_deliveries_spends_no_more_than_the_workers_github_budget(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Eight distinct deliveries, each worth one GitHub call, against a budget of three at
    once: three are applied, five wait queued (polling covers them), and they go on as the
    budget refills."""
    async with running_world(sim, redis_url, make_settings, webhooks={"secret": SECRET}) as w:
        receiver = WebhookReceiver(w.settings, w.store)
        for pr in range(100, 108):
            data = comment_on_pull(pr)
            receipt = await receiver.accept("issue_comment", f"burst-{pr}", data)
            assert receipt.status == "queued"
        now = [0.0]
        worker = w.daemon.webhooks
        worker.budget = GitHubBudget(3600, 3, clock=lambda: now[0])  # one call a second
        before = sim.stats.snapshot()["total"]
        caplog.set_level(logging.INFO, logger="github_broker.leader.deliveries")
        worker.start(lambda: True)
        try:
            deadline = time.monotonic() + 10
            while sim.stats.snapshot()["total"] - before < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # time enough to overspend, were it allowed to
            assert sim.stats.snapshot()["total"] - before == 3
            assert await w.rstore.webhook_backlog() == 5
            spent = [r for r in caplog.records if "budget is spent" in r.getMessage()]
            assert len(spent) == 1 and r"500 calls an hour" in spent[0].getMessage()
            for backlog in (2, 0):
                now[0] += 10.0  # the bucket refills, up to its burst of three
                deadline = time.monotonic() + 10
                while await w.rstore.webhook_backlog() > backlog and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)
                assert await w.rstore.webhook_backlog() == backlog
                assert sim.stats.snapshot()["total"] - before == 8 - backlog
        finally:
            await worker.stop()


def test_github_budget_goes_into_debt_and_waits_it_out() -> None:
    now = [0.0]
    budget = GitHubBudget(3600, 2, clock=lambda: now[0])
    assert budget.wait_s() == 0
    budget.spend(5)  # one delivery's review upkeep made five calls
    assert budget.wait_s() == pytest.approx(4.0)
    now[0] += 4.0
    assert budget.wait_s() == 0
    assert GitHubBudget(0, 1).wait_s() == 0  # the burst first
    empty = GitHubBudget(0, 1)
    empty.spend(1)
    assert empty.wait_s() == float("inf")


def test_a_form_encoded_delivery_is_accepted_as_github_signs_it(
    hook_settings: Settings, redis_url: str
) -> None:
    """GitHub's default content type for a new webhook is `form`: the JSON in a `payload`
    field, the signature over the raw form body."""
    form = urlencode({"payload": comment_on_pull(3).decode()}).encode()
    with TestClient(create_app(hook_settings)) as c:
        r = post(c, form, "form-1", content_type="application/x-www-form-urlencoded")
        assert (r.status_code, r.json()["status"]) == (202, "queued")
        no_payload = urlencode({"other": "{}"}).encode()
        r = post(c, no_payload, "form-2", content_type="application/x-www-form-urlencoded")
        assert r.status_code == 422 and "`payload` field" in r.json()["detail"]
        # Signed form body, signature checked on the raw bytes: a re-encoded copy is refused.
        r = post(
            c,
            comment_on_pull(3),
            "form-3",
            signature=sign(form),
            content_type="application/x-www-form-urlencoded",
        )
        assert r.status_code == 401
    raw = redis.Redis.from_url(redis_url).lindex(RepoKeys("gb", "acme", "widgets").webhooks, 0)
    assert raw is not None
    _, _, payload = raw.decode().partition("\n")
    assert json.loads(payload)["issue"]["number"] == 3


def test_refused_deliveries_are_logged_and_recorded_at_most_once_a_minute(
    hook_settings: Settings,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong secret is in the log (and in the integrations' health) at once; a flood of
    forged deliveries adds one line, and one Redis write, a minute."""
    now = [1000.0]
    for name in ("SIGNATURE_REFUSALS", "REFUSALS"):
        monkeypatch.setattr(receiver_module, name, RefusalLog(60, clock=lambda: now[0]))
    caplog.set_level(logging.WARNING, logger="github_broker.webhooks.receiver")
    refused = redis.Redis.from_url(redis_url)
    data = comment_on_pull(3)
    with TestClient(create_app(hook_settings)) as c:
        for i in range(20):
            r = post(c, data, f"forged-{i}", signature=sign(data, "not the secret"))
            assert r.status_code == 401
        lines = receiver_lines(caplog)
        assert len(lines) == 1
        assert "forged-0" in lines[0] and "does not match" in lines[0]
        assert "testclient" in lines[0]
        assert refused.hget("gb:webhooks:refused", "count") == b"1"
        foreign = json.dumps({"action": "opened", "repository": {"full_name": "x/y"}}).encode()
        assert post(c, foreign, "foreign-1", event="issues").status_code == 404
        now[0] += 61
        assert post(c, data, "forged-20", signature=sign(data, "other")).status_code == 401
        assert post(c, foreign, "foreign-2", event="issues").status_code == 404
    lines = receiver_lines(caplog)
    assert len(lines) == 4
    assert "x/y is not served" in lines[1]
    assert "forged-20" in lines[2] and "19 more refused" in lines[2]
    assert "foreign-2" in lines[3] and "more refused" not in lines[3]
    assert refused.hget("gb:webhooks:refused", "count") == b"21"
    assert b"does not match" in (refused.hget("gb:webhooks:refused", "reason") or b"")


def receiver_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the webhook receiver logged (start-up lines of the app are not its)."""
    return [r.getMessage() for r in caplog.records if r.name == "github_broker.webhooks.receiver"]


def _hook(kind: str, url: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "id": 266738161,
        "name": "web",
        "active": True,
        "events": ["issues", "issue_comment", "pull_request"],
        "config": {
            "content_type": "json",
            "url": "https://broker.example/github/webhook",
            "insecure_ssl": "0",
        },
        "updated_at": "2026-11-01T12:00:00Z",
        "created_at": "2026-11-01T12:00:00Z",
        "url": url,
        "ping_url": url + "/pings",
        "deliveries_url": url + "/deliveries",
        **extra,
    }


def org_ping(login: str) -> dict[str, Any]:
    """An organization webhook's ping, in the shape of GitHub's published `ping` schema."""
    return {
        "zen": "Anything added dilutes everything else.",
        "hook_id": 266738161,
        "hook": _hook("Organization", f"https://api.github.com/orgs/{login}/hooks/266738161"),
        "organization": {
            "login": login,
            "id": 38302899,
            "node_id": "MDEyOk9yZ2FuaXphdGlvbjM4MzAyODk5",
            "url": f"https://api.github.com/orgs/{login}",
            "repos_url": f"https://api.github.com/orgs/{login}/repos",
            "events_url": f"https://api.github.com/orgs/{login}/events",
            "hooks_url": f"https://api.github.com/orgs/{login}/hooks",
            "issues_url": f"https://api.github.com/orgs/{login}/issues",
            "members_url": f"https://api.github.com/orgs/{login}/members{{/member}}",
            "public_members_url": f"https://api.github.com/orgs/{login}/public_members{{/member}}",
            "avatar_url": "https://avatars.githubusercontent.com/u/38302899?v=4",
            "description": "",
        },
    }


def app_ping() -> dict[str, Any]:
    """A GitHub App's ping: `hook.type` App with the `app_id`, no repository."""
    return {
        "zen": "Keep it logically awesome.",
        "hook_id": 30,
        "hook": _hook("App", "https://api.github.com/app/hook/config", app_id=29310),
    }


def test_organization_and_app_pings_are_named_for_what_they_are(
    hook_settings: Settings, redis_url: str
) -> None:
    validator = jsonschema.Draft7Validator(
        {"definitions": SCHEMAS, "$ref": "#/definitions/ping$event"}
    )
    for payload in (org_ping("acme"), org_ping("Globex"), app_ping()):
        errors = [e.message for e in validator.iter_errors(payload)]
        assert not errors, errors
    seen = RepoKeys("gb", "acme", "widgets").webhooks_seen
    with TestClient(create_app(hook_settings)) as c:
        r = post(c, json.dumps(org_ping("ACME")).encode(), "p-1", event="ping")
        assert r.status_code == 200
        assert r.json() == {
            "status": "pong",
            "reason": "organization webhook of ACME reachable (1 repositories served)",
        }
        # The organization hook delivers this repository's events: it counts as alive.
        assert redis.Redis.from_url(redis_url).get(seen)
        r = post(c, json.dumps(org_ping("Globex")).encode(), "p-2", event="ping")
        assert r.status_code == 404
        assert r.json()["detail"] == "organization Globex has no repository served by this broker"
        r = post(c, json.dumps(app_ping()).encode(), "p-3", event="ping")
        assert r.json() == {"status": "pong", "reason": "ping from a GitHub App webhook"}
