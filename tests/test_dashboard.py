"""The dashboard page, its login and offline /docs, in-process on Redis and the simulator."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.settings import Settings
from github_broker.ui import live, session
from tests.conftest import free_port
from tests.test_api import app_factory, sim  # noqa: F401  (fixtures)
from tests.waiting import wait_until

TOKENS = {"admin_token": "boss-token", "agent_tokens": {"a1": "t1-0123456789abcdef"}}


@pytest.fixture
def client(app_factory: Callable[..., TestClient]) -> Iterator[TestClient]:  # noqa: F811
    with app_factory() as c:
        yield c


def test_root_redirects_to_the_dashboard(client: TestClient) -> None:
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui"


def test_dashboard_shows_leases_queue_blockers_skipped_and_events(client: TestClient) -> None:
    task = client.post("/request-task", json={"agent_id": "agent-7"}).json()
    assert task["issue_id"] == 1
    r = client.get("/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    leases = page.split('<table class="leases">')[1].split("</table>")[0]
    assert "Urgent fix" in leases and "agent-7" in leases and "none yet" in leases
    assert "/acme/widgets/issues/1" in leases
    # Issue 3 is P1: ready, but the P0 bucket (issues 1 and 2) holds it back.
    queue = page.split('<table class="queue">')[1].split("</table>")[0]
    assert re.search(r'class="blocked".*Later.*waits for the bucket', queue, re.S)
    blockers = page.split('<table class="blockers">')[1].split("</table>")[0]
    assert "development held by agent-7" in blockers and "ready (development task)" in blockers
    assert "No branch" not in blockers  # skipped issues do not pin the bucket
    skipped = page.split('<table class="skipped">')[1].split("</table>")[0]
    assert "No branch" in skipped
    events = page.split('class="timeline"')[1]
    assert "claim" in events and "agent-7" in events
    assert 'http-equiv="refresh"' in page and "cdn" not in page.lower()


def test_dashboard_needs_a_login_when_tokens_are_configured(
    app_factory: Callable[..., TestClient],  # noqa: F811
) -> None:
    with app_factory(server=TOKENS) as c:
        r = c.get("/ui", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        assert "Your token" in c.get("/ui/login").text
        wrong = c.post("/ui/login", data={"token": "t1-0123456789abcdef"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not the token of anyone here" in wrong.text
        assert session.COOKIE not in wrong.cookies
        ok = c.post("/ui/login", data={"token": "boss-token"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/ui"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "boss-token" not in cookie
        assert "samesite=strict" in cookie.lower()
        page = c.get("/ui", follow_redirects=False)
        assert page.status_code == 200 and "acme/widgets" in page.text
        assert '<p class="who" id="who">admin (an administrator)</p>' in page.text
        c.post("/ui/logout", follow_redirects=False)
        c.cookies.clear()
        assert c.get("/ui", follow_redirects=False).status_code == 303
        # A forged or expired cookie is refused.
        c.cookies.set(session.COOKIE, "9999999999.deadbeef", path="/ui")
        assert c.get("/ui", follow_redirects=False).status_code == 303


def test_login_refuses_json_bodies(app_factory: Callable[..., TestClient]) -> None:  # noqa: F811
    with app_factory(server=TOKENS) as c:
        r = c.post("/ui/login", json={"token": "boss-token"}, follow_redirects=False)
        assert r.status_code == 415 and "x-www-form-urlencoded" in r.text


SESSION_ID = "s" * 32


def test_session_cookie_expires_and_binds_the_secret() -> None:
    value = session.issue(b"secret", SESSION_ID, now_s=1000.0)
    assert session.session_of(b"secret", value, now_s=1001.0) == SESSION_ID
    assert session.session_of(b"other", value, now_s=1001.0) is None
    assert session.session_of(b"secret", value, now_s=1000.0 + session.SESSION_TTL_S + 1) is None
    expires, _, mac = value.split(".")
    assert session.session_of(b"secret", f"{expires}.{'t' * 32}.{mac}", now_s=1001.0) is None


def test_odd_session_cookies_are_refused_not_500() -> None:
    # Found by a hostile client: a non-ASCII MAC and a 5,000-digit expiry answered 500.
    assert session.session_of(b"secret", "9999999999.\xe9") is None
    assert session.session_of(b"secret", f"9999999999.{SESSION_ID}.\xe9") is None
    assert session.session_of(b"secret", "9" * 5000 + ".abc") is None
    assert session.session_of(b"secret", "١٢٣.abc") is None  # non-ASCII digits
    assert session.session_of(b"secret", "9999999999.bad*id.abc") is None


def test_docs_load_swagger_from_the_package(client: TestClient) -> None:
    page = client.get("/docs").text
    assert "cdn" not in page.lower()
    js = re.search(r'src="([^"]+swagger-ui-bundle\.js)"', page)
    css = re.search(r'href="([^"]+swagger-ui\.css)"', page)
    assert js and css and js.group(1).startswith("/")
    asset = client.get(js.group(1))
    assert asset.status_code == 200 and len(asset.content) > 100_000
    assert client.get(css.group(1)).status_code == 200


def test_openapi_lists_the_dashboard_answers(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"200", "303"} <= set(paths["/ui"]["get"]["responses"])
    assert {"303", "401", "415"} <= set(paths["/ui/login"]["post"]["responses"])


def test_dashboard_says_when_redis_is_down(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(
        redis={"url": f"redis://127.0.0.1:{free_port()}"}, server={"run_poller": False}
    )
    with TestClient(create_app(settings)) as c:
        r = c.get("/ui")
    assert r.status_code == 503 and "Redis unavailable: connection refused" in r.text
    assert 'http-equiv="refresh"' in r.text


def test_dashboard_shows_failure_streaks(client: TestClient) -> None:
    task = client.post("/request-task", json={"agent_id": "flaky-bot"}).json()
    body = {"agent_id": "flaky-bot", "token": task["lease"]["token"], "reason": "failed"}
    r = client.post(f"/tasks/acme/widgets/{task['issue_id']}/release", json=body)
    assert r.status_code == 200
    page = client.get("/ui").text
    streaks = page.split('<table class="streaks">')[1].split("</table>")[0]
    assert "flaky-bot" in streaks and "1 in a row" in streaks
    assert re.search(r">failed<.*flaky-bot", page.split('class="timeline"')[1], re.S)


# --- the maintainers' controls, CSRF, the agent page, live updates ------------------------

AGENT_TOKENS = {"a1": "t1-0123456789abcdef", "a2": "t2-0123456789abcdef"}
STEER = {"admin_token": "boss-token", "agent_tokens": AGENT_TOKENS}
ADMIN = {"Authorization": "Bearer boss-token"}
JSON = {"Accept": "application/json"}


@pytest.fixture
def steer(app_factory: Callable[..., TestClient]) -> Iterator[TestClient]:  # noqa: F811
    """The app with tokens, logged in on the dashboard."""
    with app_factory(server=STEER, leases={"settle_grace_s": 0}) as c:
        ok = c.post("/ui/login", data={"token": "boss-token"}, follow_redirects=False)
        assert ok.status_code == 303
        yield c


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def claim(c: TestClient, agent: str) -> dict[str, Any]:
    bearer = {"Authorization": f"Bearer {AGENT_TOKENS[agent]}"}
    r = c.post("/request-task", json={"agent_id": agent}, headers=bearer)
    assert r.status_code == 200, r.text
    task: dict[str, Any] = r.json()
    return task


def heartbeat(c: TestClient, agent: str, task: dict[str, Any], **extra: Any) -> Any:
    bearer = {"Authorization": f"Bearer {AGENT_TOKENS[agent]}"}
    body = {"agent_id": agent, "token": task["lease"]["token"], **extra}
    return c.post(f"/tasks/acme/widgets/{task['issue_id']}/heartbeat", json=body, headers=bearer)


def act(c: TestClient, action: str, csrf: str, **fields: Any) -> Any:
    """A control as the page's script sends it (JSON answer)."""
    return c.post(f"/ui/actions/{action}", data={"csrf": csrf, **fields}, headers=JSON)


def audit(c: TestClient) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = c.get("/admin/audit", headers=ADMIN).json()
    return entries


def held(c: TestClient) -> dict[int, str]:
    repo = c.get("/status", headers=ADMIN).json()["repositories"][0]
    return {lease["issue"]: lease["agent_id"] for lease in repo["leases"]}


def section(page: str, cls: str) -> str:
    return page.split(f'<table class="{cls}">')[1].split("</table>")[0]


def test_a_cross_site_post_without_the_csrf_token_is_refused_and_changes_nothing(
    steer: TestClient,
) -> None:
    task = claim(steer, "a1")
    n = task["issue_id"]
    form = {"repository": "acme/widgets", "issue": str(n), "confirmed": "1"}
    # The session cookie rides along (as it would where SameSite is not enforced): the
    # missing or foreign token alone refuses it.
    for sent in ({}, {"csrf": ""}, {"csrf": "0" * 64}):
        r = steer.post("/ui/actions/revoke", data={**form, **sent}, follow_redirects=False)
        assert r.status_code == 403 and "cross-site request refused" in r.text
    r = steer.post("/ui/actions/stop_agent", data={"agent": "a1", "confirmed": "1"}, headers=JSON)
    assert r.status_code == 403 and r.json()["reason"] == "forbidden"
    assert "CSRF token" in r.json()["detail"]
    assert held(steer) == {n: "a1"}
    assert heartbeat(steer, "a1", task).status_code == 200
    assert [e for e in audit(steer) if e["actor"] == "admin"] == []
    # The token of another session is refused too.
    page = steer.get("/ui").text
    other = session.csrf_token(b"boss-token", "x" * 32)
    assert csrf_of(page) != other
    r = steer.post("/ui/actions/revoke", data={**form, "csrf": other}, follow_redirects=False)
    assert r.status_code == 403 and held(steer) == {n: "a1"}


def test_an_open_dashboard_guards_its_forms_with_a_token_derived_from_a_server_secret(
    client: TestClient,
) -> None:
    form = {"repository": "acme/widgets", "reason": "maintenance"}
    r = client.post("/ui/actions/pause_repo", data={**form, "csrf": "x" * 43}, headers=JSON)
    assert r.status_code == 403 and "no dashboard cookie" in r.json()["detail"]
    page = client.get("/ui")
    cookie = page.cookies["github_broker_csrf"]
    assert "samesite=strict" in page.headers["set-cookie"].lower()
    assert csrf_of(page.text) != cookie
    r = client.post("/ui/actions/pause_repo", data={**form, "csrf": "y" * 43}, headers=JSON)
    assert r.status_code == 403
    # A client that picks its own cookie value gets no token from it.
    chosen = "z" * 43
    client.cookies.set("github_broker_csrf", chosen, path="/ui")
    r = client.post("/ui/actions/pause_repo", data={**form, "csrf": chosen}, headers=JSON)
    assert r.status_code == 403 and "CSRF token" in r.json()["detail"]
    client.cookies.set("github_broker_csrf", cookie, path="/ui")
    r = client.post("/ui/actions/pause_repo", data={**form, "csrf": cookie}, headers=JSON)
    assert r.status_code == 403
    r = client.post(
        "/ui/actions/pause_repo", data={**form, "csrf": csrf_of(page.text)}, headers=JSON
    )
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "paused: nothing new is handed out here; leases keep running"


def test_revoke_without_javascript_asks_first_then_redirects_with_its_real_outcome(
    steer: TestClient,
) -> None:
    task = claim(steer, "a1")
    n = task["issue_id"]
    csrf = csrf_of(steer.get("/ui").text)
    form = {"csrf": csrf, "repository": "acme/widgets", "issue": str(n), "reason": "wrong way"}
    ask = steer.post("/ui/actions/revoke", data=form, follow_redirects=False)
    assert ask.status_code == 200 and "Yes, revoke" in ask.text
    assert 'name="confirmed" value="1"' in ask.text and 'value="wrong way"' in ask.text
    assert held(steer) == {n: "a1"}  # asking did nothing
    done = steer.post("/ui/actions/revoke", data={**form, **csrf_of_step(ask.text)})
    assert done.history and done.history[0].status_code == 303
    assert done.history[0].headers["location"] == "/ui"
    assert (
        "Revoke acme/widgets#1: lease of a1 revoked; a1 is not handed #1 again until a retry; "
        "task back in the pool" in done.text
    )
    assert 'class="flash ok"' in done.text
    assert 'class="flash ok"' not in steer.get("/ui").text  # shown once
    assert held(steer) == {}
    beat = heartbeat(steer, "a1", task)
    assert beat.status_code == 409 and "revoked by admin: wrong way" in beat.json()["detail"]
    revokes = [e for e in audit(steer) if e["action"] == "revoke"]
    assert len(revokes) == 1
    assert (revokes[0]["actor"], revokes[0]["reason"]) == ("admin", "wrong way")
    assert revokes[0]["outcome"] == (
        "lease of a1 revoked; a1 is not handed #1 again until a retry; task back in the pool"
    )
    audit_table = section(steer.get("/ui").text, "audit")
    assert audit_table.count(">revoke<") == 1 and ">admin<" in audit_table


def csrf_of_step(page: str) -> dict[str, str]:
    """The hidden fields the confirmation page adds (confirmed=1)."""
    return dict(re.findall(r'<input type="hidden" name="(confirmed)" value="([^"]*)">', page))


def test_issue_controls_act_and_each_lands_once_in_the_audit_log(steer: TestClient) -> None:
    task = claim(steer, "a1")
    n = task["issue_id"]
    csrf = csrf_of(steer.get("/ui").text)
    issue = {"repository": "acme/widgets", "issue": str(n)}
    answers = {}
    r = act(steer, "note", csrf, **issue, text="Use the new parser.")
    answers["note"] = r.json()["outcome"]
    assert answers["note"] == "queued for the next heartbeat of a1"
    notes = heartbeat(steer, "a1", task).json()["notes"]
    assert [(x["by"], x["text"]) for x in notes] == [("admin", "Use the new parser.")]
    missing = act(steer, "reassign", csrf, **issue, confirmed="1")
    assert missing.status_code == 422 and "reassign to which agent" in missing.json()["detail"]
    unconfirmed = act(steer, "reassign", csrf, **issue, to_agent="a2")
    assert unconfirmed.status_code == 422 and "confirm first" in unconfirmed.json()["detail"]
    r = act(steer, "reassign", csrf, **issue, to_agent="a2", confirmed="1")
    answers["reassign"] = r.json()["outcome"]
    assert claim(steer, "a2")["issue_id"] == n
    r = act(steer, "revoke", csrf, **issue, hold="1", confirmed="1", reason="needs a decision")
    answers["revoke"] = r.json()["outcome"]
    assert "held for a person" in answers["revoke"]
    page = steer.get("/ui").text
    waiting = section(page, "waiting")
    assert "Urgent fix" in waiting and "waiting_for_user" in waiting and "held" in waiting
    assert 'action="/ui/actions/retry"' in waiting
    r = act(steer, "retry", csrf, **issue)
    answers["retry"] = r.json()["outcome"]
    assert answers["retry"].startswith("no longer waiting (held)")
    unknown = act(steer, "retry", csrf, repository="acme/widgets", issue="999")
    assert unknown.status_code == 404
    mine = [e for e in audit(steer) if e["actor"] == "admin"]
    assert sorted(e["action"] for e in mine) == sorted(answers)
    for e in mine:
        assert e["outcome"] == answers[e["action"]] and e["issue"] == n


def test_agent_controls_and_the_agent_page(steer: TestClient) -> None:
    failed = claim(steer, "a2")
    bearer = {"Authorization": f"Bearer {AGENT_TOKENS['a2']}"}
    body = {"agent_id": "a2", "token": failed["lease"]["token"], "reason": "failed"}
    r = steer.post(f"/tasks/acme/widgets/{failed['issue_id']}/release", json=body, headers=bearer)
    assert r.status_code == 200
    task = claim(steer, "a1")
    page = steer.get("/ui/agents/a1")
    assert page.status_code == 200
    csrf = csrf_of(page.text)
    holds = section(page.text, "leases")
    assert f"#{task['issue_id']}" in holds and "in_progress" in holds
    assert "Active: it gets new tasks." in page.text
    assert ">claim<" in section(page.text, "events")
    streaks = section(steer.get("/ui/agents/a2").text, "streaks")
    assert "acme/widgets" in streaks and "1 in a row" in streaks
    agents = section(steer.get("/ui").text, "agents")
    assert 'href="/ui/agents/a1"' in agents and "1 in a row" in agents

    r = act(steer, "pause_agent", csrf, agent="a1", reason="maintenance", back="/ui/agents/a1")
    paused = r.json()["outcome"]
    assert paused == "paused: its current task may finish, no new one"
    page = steer.get("/ui/agents/a1").text
    assert "paused by admin: maintenance" in page and held(steer) == {task["issue_id"]: "a1"}
    assert 'formaction="/ui/actions/resume_agent"' in page
    assert 'formaction="/ui/actions/pause_agent"' not in page
    r = act(steer, "stop_agent", csrf, agent="a1", confirmed="1")
    stopped = r.json()["outcome"]
    assert stopped.startswith("stopped") and held(steer) == {}
    page = steer.get("/ui/agents/a1").text
    assert "stopped by admin" in page and "It holds no task." in page
    # Without JavaScript: the answer redirects back to the agent page.
    r = steer.post(
        "/ui/actions/resume_agent",
        data={"csrf": csrf, "agent": "a1", "back": "/ui/agents/a1"},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/ui/agents/a1"
    page = steer.get("/ui/agents/a1").text
    assert "Resume a1: resumed" in page and "Active: it gets new tasks." in page
    mine = [e for e in audit(steer) if e["actor"] == "admin"]
    assert [(e["action"], e["outcome"]) for e in reversed(mine)] == [
        ("pause_agent", paused),
        ("stop_agent", stopped),
        ("resume_agent", "resumed"),
    ]
    actions = section(page, "audit")
    assert ">pause_agent<" in actions and ">stop_agent<" in actions
    assert steer.get("/ui/agents/-bad").status_code == 422


def test_repository_and_broker_pauses_from_the_dashboard(steer: TestClient) -> None:
    csrf = csrf_of(steer.get("/ui").text)
    r = act(steer, "pause_repo", csrf, repository="acme/widgets", reason="migrating")
    repo_paused = r.json()["outcome"]
    page = steer.get("/ui").text
    assert "Paused by admin: migrating" in page and 'class="badge paused"' in page
    bearer = {"Authorization": f"Bearer {AGENT_TOKENS['a1']}"}
    assert steer.post("/request-task", json={"agent_id": "a1"}, headers=bearer).status_code == 204
    assert act(steer, "resume_repo", csrf, repository="acme/widgets").json()["outcome"] == (
        "resumed"
    )
    assert act(steer, "pause_broker", csrf).status_code == 422  # destructive: confirm first
    r = act(steer, "pause_broker", csrf, confirmed="1", reason="upgrade")
    broker_paused = r.json()["outcome"]
    assert broker_paused == "paused in 1 repositories; leases keep running"
    page = steer.get("/ui").text
    assert "The whole broker is paused by admin: upgrade" in page
    assert 'formaction="/ui/actions/resume_broker"' in page
    assert act(steer, "resume_broker", csrf).json()["outcome"] == "resumed"
    assert act(steer, "pause_repo", csrf, repository="acme/gone").status_code == 404
    mine = [(e["action"], e["outcome"]) for e in audit(steer) if e["actor"] == "admin"]
    assert list(reversed(mine)) == [
        ("pause_repo", repo_paused),
        ("resume_repo", "resumed"),
        ("pause_broker", broker_paused),
        ("resume_broker", "resumed"),
    ]


def test_lease_rows_show_the_api_states_progress_and_stall_evidence(steer: TestClient) -> None:
    task = claim(steer, "a1")
    assert heartbeat(steer, "a1", task, note="writing the parser").status_code == 200
    leases = section(steer.get("/ui").text, "leases")
    assert ">in_progress<" in leases and "writing the parser" in leases
    assert 'class="stalled"' not in leases
    rstore = steer.app.state.services.store.repo("acme/widgets")  # type: ignore[attr-defined]
    evidence = "held 31m 00s, no push, PR or review reply seen, 1 heartbeat"
    # What the leader's progress check does (progress.py) once stall_after_s has passed.
    (lease,) = steer.portal.call(rstore.leases)  # type: ignore[union-attr]
    flagged = steer.portal.call(  # type: ignore[union-attr]
        rstore.lease_upkeep, "stall", lease.issue, lease.token, evidence
    )
    assert flagged
    page = steer.get("/ui").text
    leases = section(page, "leases")
    assert 'class="stalled"' in leases and ">idle<" in leases
    assert f"⚠ stalled: {evidence}" in leases
    assert ">queued<" in section(page, "queue")
    assert "No branch" in section(page, "skipped")


def test_the_health_block_warns_with_what_to_do_only_when_something_is_wrong(
    steer: TestClient,
) -> None:
    page = steer.get("/ui").text
    assert 'id="problems"' not in page
    health = section(page, "health")
    assert '<td class="sync">ok' in health and "complete" in health
    assert "not configured (polling only)" in health
    rstore = steer.app.state.services.store.repo("acme/widgets")  # type: ignore[attr-defined]
    # What the poller records after failed passes (the browser test fails a real sync).
    reason = "GitHub answered 404: Not Found"
    steer.portal.call(rstore.mark_sync_failing, reason, 60, "no_access")  # type: ignore[union-attr]
    page = steer.get("/ui").text
    problems = page.split('id="problems"')[1].split("</section>")[0]
    assert "acme/widgets: its sync keeps failing" in problems
    assert "check that the repository exists under this name" in problems
    assert "<strong>failing</strong>" in section(page, "health")


def events_of(stream: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in stream.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            found.append((lines["event"], json.loads(lines["data"])))
    return found


@pytest.fixture
def quick_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """Streams of 2 s that notice a change within 0.1 s and refresh only on changes."""
    monkeypatch.setattr(live, "STREAM_S", 2.0)
    monkeypatch.setattr(live, "POLL_S", 0.1)
    monkeypatch.setattr(live, "REFRESH_S", 60.0)


def test_the_live_stream_sends_the_fresh_page_when_a_lease_changes_then_ends(
    steer: TestClient, quick_live: None
) -> None:
    assert 'data-stream="/ui/live"' in steer.get("/ui").text
    later = threading.Timer(0.7, lambda: claim(steer, "a1"))
    later.start()
    started = time.monotonic()
    r = steer.get("/ui/live")  # the test client reads the stream to its end
    took = time.monotonic() - started
    later.join()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.startswith("retry: ")
    updates = [data["html"] for kind, data in events_of(r.text) if kind == "update"]
    assert updates, r.text
    assert 'id="lease-acme--widgets-1"' in updates[-1] and "a1" in updates[-1]
    assert 'name="csrf"' in updates[-1]  # its forms work like the page's
    assert 1.9 < took < 5, took
    assert steer.app.state.live_feed.streams == 0  # type: ignore[attr-defined]


def test_live_streams_need_a_login_and_are_capped_per_process(
    app_factory: Callable[..., TestClient],  # noqa: F811
    quick_live: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(live, "MAX_STREAMS", 2)
    monkeypatch.setattr(live, "STREAM_S", 1.0)
    with app_factory(server=STEER) as c:
        r = c.get("/ui/live")
        assert r.status_code == 401 and r.json()["reason"] == "unauthorized"
        c.post("/ui/login", data={"token": "boss-token"}, follow_redirects=False)
        assert c.get("/ui/live", params={"agent": "-x"}).status_code == 422
        feed = c.app.state.live_feed  # type: ignore[attr-defined]
        streams = [threading.Thread(target=c.get, args=("/ui/live",)) for _ in range(2)]
        for t in streams:
            t.start()
        wait_until(lambda: feed.streams >= 2, 5, "the two streams open")
        full = c.get("/ui/live", params={"agent": "a1"})
        assert full.status_code == 503 and full.headers["retry-after"] == "30"
        assert "serves 2 live pages already" in full.json()["detail"]
        for t in streams:
            t.join()
        assert feed.streams == 0
        # HEAD answers the stream's headers without holding a slot.
        head = c.head("/ui/live")
        assert head.status_code == 200 and head.content == b"" and feed.streams == 0
        assert head.headers["content-type"].startswith("text/event-stream")
        # A stream that reconnects gets the page at once (it may have missed a change).
        again = c.get("/ui/live", params={"agent": "a1"}, headers={"Last-Event-ID": "update"})
        assert again.status_code == 200 and again.text.startswith("retry: ")
        updates = [data["html"] for kind, data in events_of(again.text) if kind == "update"]
        assert len(updates) == 1 and 'data-agent="a1"' in updates[0]


def test_a_live_stream_ends_when_its_session_logs_out(
    steer: TestClient, quick_live: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "REFRESH_S", 0.3)
    later = threading.Timer(0.5, lambda: steer.post("/ui/logout", follow_redirects=False))
    later.start()
    started = time.monotonic()
    r = steer.get("/ui/live")  # sent with the cookie the logout then ends
    later.join()
    assert [kind for kind, _ in events_of(r.text)][-1] == "logout"
    assert time.monotonic() - started < 1.9


def test_the_dashboard_has_an_icon_where_browsers_look_for_it(client: TestClient) -> None:
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    assert icon.content.startswith(b"<svg")
    page = client.get("/ui").text
    assert '<link rel="icon" href="/ui/static/favicon.svg"' in page
    assert client.get("/ui/static/favicon.svg").content == icon.content
    declared = client.get("/openapi.json").json()["paths"]["/favicon.ico"]["get"]["responses"]
    assert "image/svg+xml" in declared["200"]["content"]
