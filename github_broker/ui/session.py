"""The dashboard's login cookie: an expiry signed with the admin token, never the token."""

from __future__ import annotations

import hashlib
import hmac
import time

#: Name of the HttpOnly cookie the login form sets.
COOKIE = "github_broker_ui"
#: Seconds a dashboard login lasts.
SESSION_TTL_S = 12 * 3600


def _mac(admin_token: str, expires_s: int) -> str:
    message = f"github-broker-ui:{expires_s}".encode()
    return hmac.new(admin_token.encode(), message, hashlib.sha256).hexdigest()


def issue(admin_token: str, now_s: float | None = None) -> str:
    """A cookie value valid for SESSION_TTL_S; changing the admin token voids it."""
    expires_s = int((now_s if now_s is not None else time.time()) + SESSION_TTL_S)
    return f"{expires_s}.{_mac(admin_token, expires_s)}"


def valid(admin_token: str, value: str | None, now_s: float | None = None) -> bool:
    if not value:
        return False
    expires, _, mac = value.partition(".")
    # A cookie is the client's input: ASCII digits of a sane length only, compared as bytes.
    if not (expires.isascii() and expires.isdigit() and len(expires) <= 12):
        return False
    if int(expires) < (now_s if now_s is not None else time.time()):
        return False
    expected = _mac(admin_token, int(expires)).encode()
    return hmac.compare_digest(mac.encode("utf-8", "surrogateescape"), expected)
