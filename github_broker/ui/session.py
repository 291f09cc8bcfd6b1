"""The dashboard's login: a session cookie signed with the admin token (never the token), the
session it names kept in Redis (a logout ends it everywhere), and the login throttle."""

from __future__ import annotations

import hashlib
import hmac
import re
import time

#: Name of the HttpOnly cookie the login form sets.
COOKIE = "github_broker_ui"
#: Seconds a dashboard login lasts.
SESSION_TTL_S = 12 * 3600
#: Seconds of the login throttle's window: attempts are counted per window.
LOGIN_WINDOW_S = 60.0
#: Login attempts one client (by address) may make per window; a success forgives its own.
LOGIN_ATTEMPTS_PER_CLIENT = 5
#: Login attempts every client together may make per window (many addresses guessing).
LOGIN_ATTEMPTS_OVERALL = 60

#: A session id as `open_session` makes them (token_urlsafe(24)).
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _mac(admin_token: str, expires_s: int, session_id: str) -> str:
    message = f"github-broker-ui:{expires_s}:{session_id}".encode()
    return hmac.new(admin_token.encode(), message, hashlib.sha256).hexdigest()


def issue(admin_token: str, session_id: str, now_s: float | None = None) -> str:
    """A cookie value naming `session_id`, valid for SESSION_TTL_S; changing the admin token
    voids it."""
    expires_s = int((now_s if now_s is not None else time.time()) + SESSION_TTL_S)
    return f"{expires_s}.{session_id}.{_mac(admin_token, expires_s, session_id)}"


def session_of(admin_token: str, value: str | None, now_s: float | None = None) -> str | None:
    """The session id a cookie names when its signature and expiry hold (whether the session
    is still open is Redis's to say), else None."""
    if not value:
        return None
    expires, _, rest = value.partition(".")
    session_id, _, mac = rest.partition(".")
    # A cookie is the client's input: ASCII digits of a sane length only, compared as bytes.
    if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
        return None
    if not _SESSION_ID.match(session_id):
        return None
    if int(expires) < (now_s if now_s is not None else time.time()):
        return None
    expected = _mac(admin_token, int(expires), session_id).encode()
    if not hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), expected):
        return None
    return session_id


def csrf_token(admin_token: str, session_id: str) -> str:
    """The CSRF token of a session: every form of the dashboard carries it, and an action is
    refused unless it matches. Derived (HMAC with the admin token), so it needs no storage and
    dies with the session; a page of another site can neither read nor guess it."""
    message = f"github-broker-ui-csrf:{session_id}".encode()
    return hmac.new(admin_token.encode(), message, hashlib.sha256).hexdigest()


def same_token(expected: str, given: str | None) -> bool:
    """Whether a form's token is the expected one, compared in constant time (as bytes: the
    form is the client's input and may hold any character)."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))
