"""GitHub's OAuth device flow, on the web host's paths (`POST /login/device/code`,
`POST /login/oauth/access_token`), with GitHub's answers: HTTP 200 whatever happens, an
`error` field (`authorization_pending`, `slow_down`, `expired_token`, `access_denied`,
`incorrect_device_code`, `unsupported_grant_type`) until the person approved, then a bearer
token that names them. Answered as JSON, as GitHub does when asked (`Accept:
application/json`; without it GitHub answers form-encoded, which the broker never asks for).

A test or the sandbox approves a code in the person's place: `POST /_sim/device/authorize
{"user_code": ..., "login": ...}` (or `"deny": true`).
"""

from __future__ import annotations

import secrets
import string
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from .messages import ApiError, Response

#: Seconds a device code lives, and the polling interval GitHub asks for.
EXPIRES_S = 900
INTERVAL_S = 5
#: Seconds `slow_down` adds to the interval, as GitHub does.
SLOW_DOWN_S = 5
GRANT = "urn:ietf:params:oauth:grant-type:device_code"
PATHS = frozenset({"/login/device/code", "/login/oauth/access_token"})
ERROR_URI = (
    "https://docs.github.com/developers/apps/building-oauth-apps/authorizing-oauth-apps"
    "#error-codes-for-the-device-flow"
)


@dataclass
class _Code:
    client_id: str
    scope: str
    user_code: str
    expires_at: float
    interval: int = INTERVAL_S
    polled_at: float = 0.0
    login: str | None = None
    denied: bool = False


class DeviceFlow:
    """Device codes waiting for, or given, a person's approval."""

    def __init__(self, tokens: dict[str, str] | None) -> None:
        #: The simulator's token table (token -> login), None when it takes any token.
        self.tokens = tokens
        self._codes: dict[str, _Code] = {}
        self._lock = threading.Lock()
        #: Seconds between polls that `slow_down` enforces; tests may lower it.
        self.min_interval_s: float = INTERVAL_S

    def handle(self, method: str, path: str, raw: bytes, base_url: str) -> Response:
        if method != "POST":
            raise ApiError(404, "Not Found")
        form = {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        if path == "/login/device/code":
            return Response(200, self._start(form, base_url))
        return Response(200, self._poll(form))

    def _start(self, form: dict[str, str], base_url: str) -> dict[str, Any]:
        client_id = form.get("client_id", "")
        if not client_id:
            return {"error": "unauthorized_client", "error_description": "client_id missing"}
        device_code = secrets.token_hex(20)
        letters = string.ascii_uppercase + string.digits
        user_code = "".join(secrets.choice(letters) for _ in range(8))
        user_code = f"{user_code[:4]}-{user_code[4:]}"
        with self._lock:
            self._codes[device_code] = _Code(
                client_id, form.get("scope", ""), user_code, time.monotonic() + EXPIRES_S
            )
        return {
            "device_code": device_code,
            "user_code": user_code,
            "verification_uri": f"{base_url}/login/device",
            "expires_in": EXPIRES_S,
            "interval": INTERVAL_S,
        }

    def _poll(self, form: dict[str, str]) -> dict[str, Any]:
        if form.get("grant_type") != GRANT:
            return _error("unsupported_grant_type", "The grant type is not supported.")
        with self._lock:
            code = self._codes.get(form.get("device_code", ""))
            if code is None or code.client_id != form.get("client_id"):
                return _error("incorrect_device_code", "The device_code provided is not valid.")
            now = time.monotonic()
            if now > code.expires_at:
                return _error("expired_token", "The device_code has expired.")
            if code.denied:
                return _error("access_denied", "The authorization request was denied.")
            if code.login is None:
                too_soon = now - code.polled_at < self.min_interval_s
                code.polled_at = now
                if too_soon:
                    code.interval += SLOW_DOWN_S
                    answer = _error("slow_down", "Too many requests have been made.")
                    answer["interval"] = code.interval
                    return answer
                return _error("authorization_pending", "The authorization request is pending.")
            del self._codes[form["device_code"]]
            token = "gho_" + secrets.token_hex(18)
            if self.tokens is not None:
                self.tokens[token] = code.login
        return {"access_token": token, "token_type": "bearer", "scope": code.scope}

    def authorize(self, user_code: str, login: str, *, deny: bool = False) -> None:
        """The person `login` entered `user_code` on GitHub and approved (or denied) it."""
        with self._lock:
            code = next((c for c in self._codes.values() if c.user_code == user_code), None)
            if code is None:
                raise ApiError(404, f"no pending device code {user_code!r}")
            code.denied = deny
            code.login = None if deny else login


def _error(error: str, description: str) -> dict[str, Any]:
    return {
        "error": error,
        "error_description": description,
        "error_uri": ERROR_URI,
    }
