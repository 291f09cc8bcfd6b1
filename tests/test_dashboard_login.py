"""The dashboard login against guessing clients: each client slowed by a delay that grows with
its own failures (429 with Retry-After), nobody else's guesses ever delaying a correct login, a
logout ends the session for every serve process, and the cookie is Secure over HTTPS (a proxy
believed only when configured)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import Store
from github_broker.store.logins import Throttle
from github_broker.ui import session
from tests.processes import BrokerProcess, broker_env
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


class Clock:
    """The login throttle's clock, driven by the test."""

    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from github_broker.store import logins

    driven = Clock()
    monkeypatch.setattr(logins, "now_ms", driven)
    return driven


def test_a_clients_wrong_logins_are_slowed_by_a_growing_delay_then_the_right_one_works(
    app_factory: Callable[..., TestClient],  # noqa: F811
    clock: Clock,
) -> None:
    with app_factory(server=TOKENS) as c:
        wrong = [log_in(c, f"guess-{i}") for i in range(6)]
        assert [r.status_code for r in wrong] == [401] * 6
        assert [r.headers.get("retry-after") for r in wrong] == [None] * 5 + ["1"]
        # During the delay even the right token is not checked: a guesser learns nothing.
        r = log_in(c, "boss-token")
        assert r.status_code == 429 and "too many wrong attempts" in r.text
        assert r.headers["retry-after"] == "1" and session.COOKIE not in r.cookies
        clock.ms += 1000
        assert log_in(c, "guess-6").headers["retry-after"] == "2"  # each failure doubles it
        clock.ms += 1999
        assert log_in(c, "boss-token").status_code == 429
        clock.ms += 1
        ok = log_in(c, "boss-token")
        assert ok.status_code == 303 and session.COOKIE in ok.cookies
        assert c.get("/ui", follow_redirects=False).status_code == 200
        # Getting in forgave the client's failures.
        assert [log_in(c, "guess").status_code for _ in range(5)] == [401] * 5


def test_guesses_from_other_addresses_never_delay_a_correct_login(
    app_factory: Callable[..., TestClient],  # noqa: F811
    clock: Clock,
) -> None:
    """Forwarded by a trusted proxy: 200 wrong guesses from 40 addresses, then the right
    token from another address gets in at once."""
    with app_factory(server={**TOKENS, "trusted_proxies": ["*"]}) as c:
        answers = [
            log_in(c, "guess", **{"X-Forwarded-For": f"198.51.100.{i % 40}"}).status_code
            for i in range(200)
        ]
        assert answers.count(401) >= 40 * 5 and set(answers) <= {401, 429}
        r = log_in(c, "boss-token", **{"X-Forwarded-For": "203.0.113.9"})
        assert r.status_code == 303


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
    lua_redis_url: str, make_settings: Callable[..., Settings], clock: Clock
) -> None:
    """login_attempt.lua on a real Redis, a Cluster and fakeredis (the sandbox): a client's
    delay, an IPv6 client counted by its /64, and sessions naming a person."""
    store = Store.from_settings(make_settings(redis={"url": lua_redis_url}))
    logins = store.logins
    rule = Throttle(free=2, first_delay_ms=1000, max_delay_ms=4000, forget_ms=60_000)
    try:
        first = [await logins.attempt("2001:db8::1", False, rule) for _ in range(3)]
        assert [(v.allowed, v.waiting, v.wait_s) for v in first] == [
            (False, False, 0.0),
            (False, False, 0.0),
            (False, False, 1.0),
        ]
        # Another address of the same /64 is the same client; another /64 is not.
        assert (await logins.attempt("2001:db8::ffff", True, rule)).waiting
        assert (await logins.attempt("2001:db8:0:1::1", None, rule)).allowed
        clock.ms += 1000
        assert (await logins.attempt("2001:db8::2", True, rule)).allowed
        assert logins.client_id("::ffff:192.0.2.1") == logins.client_id("192.0.2.1")
        session_id = await logins.open_session(60, {"via": "token", "name": "alice"})
        assert await logins.session(session_id) == {"via": "token", "name": "alice"}
        await logins.end_session(session_id)
        assert await logins.session(session_id) is None
        assert await logins.secret() == await logins.secret()
    finally:
        await store.close()


def _post_login(port: int, source: str, token: str) -> int:
    """POST /ui/login from the loopback address `source` (a client of its own)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request("POST", "/ui/login", body=f"token={token}", headers=FORM)
        return conn.getresponse().status
    finally:
        conn.close()


def test_twelve_guessing_addresses_never_keep_the_right_login_out_of_a_real_broker(
    sim: Simulator,  # noqa: F811
    redis_url: str,
    tmp_path: Path,
) -> None:
    """The distributed lockout, measured: 12 addresses (127.0.0.2-13) guess without pause
    while the administrator logs in from 127.0.0.1 every 0.2 s; every one of those logins
    gets in. 60 s of the default schedule, run ten times faster through the settings (first
    delay 0.1 s, longest 6 s)."""
    scaled = {
        "GITHUB_BROKER_SERVER__ADMIN_TOKEN": "boss-token",
        "GITHUB_BROKER_SIGNIN__LOGIN_FIRST_DELAY_S": "0.1",
        "GITHUB_BROKER_SIGNIN__LOGIN_MAX_DELAY_S": "6",
        "GITHUB_BROKER_SIGNIN__LOGIN_FORGET_S": "90",
    }
    env = broker_env(redis_url, sim.base_url, "acme/widgets", **scaled)
    broker = BrokerProcess(env, tmp_path, "broker", single_process=True).start()
    guessed: dict[int, int] = {}
    stop = threading.Event()

    def guess(source: str) -> None:
        while not stop.is_set():
            status = _post_login(broker.port, source, "guess")
            guessed[status] = guessed.get(status, 0) + 1

    guessers = [
        threading.Thread(target=guess, args=(f"127.0.0.{i}",), daemon=True) for i in range(2, 14)
    ]
    admin: list[int] = []
    try:
        for thread in guessers:
            thread.start()
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:
            admin.append(_post_login(broker.port, "127.0.0.1", "boss-token"))
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in guessers:
            thread.join(timeout=15)
        broker.stop()
    assert len(admin) >= 10 and set(admin) == {303}, (admin, guessed)
    assert guessed.get(401, 0) >= 12 * 5, guessed  # every address spent its free guesses
    assert guessed.get(429, 0) >= 12, guessed  # and was slowed down
