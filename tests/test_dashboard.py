"""The dashboard page, its login and offline /docs, in-process on Redis and the simulator."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.settings import Settings
from github_broker.ui import session
from tests.conftest import free_port
from tests.test_api import app_factory, sim  # noqa: F401  (fixtures)

TOKENS = {"admin_token": "boss-token", "agent_tokens": {"t1": "a1"}}


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
    assert "development held by agent-7" in blockers and "ready: development:2" in blockers
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
        assert "Admin token" in c.get("/ui/login").text
        wrong = c.post("/ui/login", data={"token": "t1"}, follow_redirects=False)
        assert wrong.status_code == 401 and "not the admin token" in wrong.text
        assert session.COOKIE not in wrong.cookies
        ok = c.post("/ui/login", data={"token": "boss-token"}, follow_redirects=False)
        assert ok.status_code == 303 and ok.headers["location"] == "/ui"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "boss-token" not in cookie
        assert "samesite=strict" in cookie.lower()
        page = c.get("/ui", follow_redirects=False)
        assert page.status_code == 200 and "acme/widgets" in page.text
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


def test_session_cookie_expires_and_binds_the_token() -> None:
    value = session.issue("secret", SESSION_ID, now_s=1000.0)
    assert session.session_of("secret", value, now_s=1001.0) == SESSION_ID
    assert session.session_of("other", value, now_s=1001.0) is None
    assert session.session_of("secret", value, now_s=1000.0 + session.SESSION_TTL_S + 1) is None
    expires, _, mac = value.split(".")
    assert session.session_of("secret", f"{expires}.{'t' * 32}.{mac}", now_s=1001.0) is None


def test_odd_session_cookies_are_refused_not_500() -> None:
    # Found by a hostile client: a non-ASCII MAC and a 5,000-digit expiry answered 500.
    assert session.session_of("secret", "9999999999.\xe9") is None
    assert session.session_of("secret", f"9999999999.{SESSION_ID}.\xe9") is None
    assert session.session_of("secret", "9" * 5000 + ".abc") is None
    assert session.session_of("secret", "١٢٣.abc") is None  # non-ASCII digits
    assert session.session_of("secret", "9999999999.bad*id.abc") is None


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
    assert r.status_code == 503 and "StoreUnavailable" in r.text
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
