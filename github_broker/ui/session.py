"""The dashboard's login: a session cookie signed with the dashboard's secret (made once per
deployment and kept in Redis, never a token), the session it names kept in Redis with whom it
names (a logout ends it everywhere), and the CSRF tokens derived from that secret."""

from __future__ import annotations

import hashlib
import hmac
import re
import time

#: Name of the HttpOnly cookie the login form sets.
COOKIE = "github_broker_ui"
#: Seconds a dashboard login with a token lasts (a GitHub sign-in: `signin.github_rights_s`).
SESSION_TTL_S = 12 * 3600

#: A session id as `open_session` makes them (token_urlsafe(24)).
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def _mac(key: bytes, expires_s: int, session_id: str) -> str:
    message = f"github-broker-ui:{expires_s}:{session_id}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def issue(
    key: bytes, session_id: str, ttl_s: int = SESSION_TTL_S, now_s: float | None = None
) -> str:
    """A cookie value naming `session_id`, valid for `ttl_s`; a new secret voids it."""
    expires_s = int((now_s if now_s is not None else time.time()) + ttl_s)
    return f"{expires_s}.{session_id}.{_mac(key, expires_s, session_id)}"


def session_of(key: bytes, value: str | None, now_s: float | None = None) -> str | None:
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
    expected = _mac(key, int(expires), session_id).encode()
    if not hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), expected):
        return None
    return session_id


def csrf_token(key: bytes, visit: str) -> str:
    """The CSRF token of a visit (a session id, or an open dashboard's browser cookie): every
    form of the dashboard carries it, and an action is refused unless it matches. Derived from
    the server's secret, so it needs no storage, dies with the session, and neither a page of
    another site nor a client choosing its own cookie can make one."""
    message = f"github-broker-ui-csrf:{visit}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def same_token(expected: str, given: str | None) -> bool:
    """Whether a form's token is the expected one, compared in constant time (as bytes: the
    form is the client's input and may hold any character)."""
    if not expected or not given:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "surrogateescape"))
