"""The dashboard login against a guessing client: throttled per client and overall (429 with
Retry-After), the right token works again after the window, a logout ends the session for
every serve process, and the cookie is Secure over HTTPS (a proxy believed only when
configured)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from github_broker.settings import Settings
from github_broker.store import Store
from github_broker.ui import session
from tests.test_api import app_factory, sim  # noqa: F401  (fixtures)

TOKENS = {"admin_token": "boss-token", "agent_tokens": {"a1": "t1-0123456789abcdef"}}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def log_in(c: TestClient, token: str, **headers: str) -> object:
    return c.post(
        "/ui/login",
        content=f"token={token}".encode(),
        headers={**FORM, **headers},
        follow_redirects=False,
    )


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> float:
    """A window long enough for a test's attempts on a busy machine, short enough to wait."""
    monkeypatch.setattr(session, "LOGIN_WINDOW_S", 6.0)
    return 6.0


def test_login_is_throttled_after_a_handful_of_wrong_tokens_then_works_again(
    app_factory: Callable[..., TestClient],  # noqa: F811
    short_window: float,
) -> None:
    with app_factory(server=TOKENS) as c:
        first = log_in(c, "guess-0").status_code
        # The window began while the first attempt was answered: it ends before started + 6 s
        # (measured before the attempt, a slow first answer made the wait too short).
        started = time.monotonic()
        wrong = [first] + [log_in(c, f"guess-{i}").status_code for i in range(1, 8)]
        assert wrong == [401] * 5 + [429] * 3
        # Throttled: even the right token is not checked until the window ends.
        r = log_in(c, "boss-token")
        assert r.status_code == 429 and "too many login attempts" in r.text
        assert 1 <= int(r.headers["retry-after"]) <= short_window
        assert session.COOKIE not in r.cookies
        time.sleep(max(0.0, short_window - (time.monotonic() - started)) + 0.2)
        ok = log_in(c, "boss-token")
        assert ok.status_code == 303 and session.COOKIE in ok.cookies
        assert c.get("/ui", follow_redirects=False).status_code == 200


def test_login_is_throttled_overall_across_client_addresses(
    app_factory: Callable[..., TestClient],  # noqa: F811
    short_window: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guesses spread over many addresses (here forwarded by a trusted proxy) stop at the
    overall limit."""
    monkeypatch.setattr(session, "LOGIN_ATTEMPTS_OVERALL", 12)
    with app_factory(server={**TOKENS, "trusted_proxies": ["*"]}) as c:
        answers = [
            log_in(c, "guess", **{"X-Forwarded-For": f"198.51.100.{i}"}).status_code
            for i in range(15)
        ]
        assert answers == [401] * 12 + [429] * 3
        r = log_in(c, "boss-token", **{"X-Forwarded-For": "203.0.113.9"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def test_logout_ends_the_session_in_every_serve_process(
    app_factory: Callable[..., TestClient],  # noqa: F811
) -> None:
    with app_factory(server=TOKENS) as one, app_factory(server=TOKENS) as other:
        ok = log_in(one, "boss-token")
        cookie = ok.cookies[session.COOKIE]
        other.cookies.set(session.COOKIE, cookie, path="/ui")
        assert other.get("/ui", follow_redirects=False).status_code == 200
        out = other.post("/ui/logout", follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        # The copy of the cookie the first process saw is void too.
        one.cookies.set(session.COOKIE, cookie, path="/ui")
        r = one.get("/ui", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"


def test_session_cookie_is_secure_over_https_and_behind_a_trusted_proxy_only(
    app_factory: Callable[..., TestClient],  # noqa: F811
) -> None:
    with app_factory(server=TOKENS) as c:
        plain = log_in(c, "boss-token").headers["set-cookie"]
        spoofed = log_in(c, "boss-token", **{"X-Forwarded-Proto": "https"}).headers["set-cookie"]
    assert "secure" not in plain.lower() and "secure" not in spoofed.lower()
    with app_factory(server=TOKENS) as c:
        c.base_url = c.base_url.copy_with(scheme="https")
        direct = log_in(c, "boss-token").headers["set-cookie"]
    assert "; secure" in direct.lower()
    with app_factory(server={**TOKENS, "trusted_proxies": ["testclient"]}) as c:
        proxied = log_in(c, "boss-token", **{"X-Forwarded-Proto": "https"}).headers["set-cookie"]
    assert "; secure" in proxied.lower()


@pytest.mark.anyio
async def test_login_attempts_and_sessions_on_every_redis_engine(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """login_attempt.lua's two keys share one Cluster slot; fakeredis (the sandbox) agrees."""
    store = Store.from_settings(make_settings(redis={"url": lua_redis_url}))
    logins = store.logins
    try:
        assert [await logins.attempt("10.0.0.1", 60, 2, 3) for _ in range(2)] == [0, 0]
        assert 0 < await logins.attempt("10.0.0.1", 60, 2, 3) <= 60  # refused, not counted
        assert await logins.attempt("10.0.0.2", 60, 2, 3) == 0  # the third overall
        assert await logins.attempt("10.0.0.3", 60, 2, 3) > 0  # everyone's window is full
        await logins.succeeded("10.0.0.1")
        session_id = await logins.open_session(60)
        assert await logins.session_alive(session_id)
        await logins.end_session(session_id)
        assert not await logins.session_alive(session_id)
    finally:
        await store.close()
