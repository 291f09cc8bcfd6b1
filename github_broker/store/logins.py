"""The dashboard's logins: each client's failed attempts (a growing delay, never anyone else's),
the sessions a login opens (in Redis, so a logout ends a session for every serve process) and
whom each names, the secret the dashboard signs with, and GitHub sign-ins waiting for their
device code."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import secrets
from dataclasses import dataclass
from typing import Any

from github_broker.clock import now_ms
from github_broker.keys import GlobalKeys
from github_broker.store.connection import as_text, awaited, json_object, translate_errors
from github_broker.store.scripts import Scripts

#: Bytes of the dashboard's secret (HMAC key of its cookies and CSRF tokens).
SECRET_BYTES = 32


@dataclass(frozen=True)
class Throttle:
    """How a client's failed logins slow it down."""

    #: Failures with no delay.
    free: int
    #: The delay after the first failure past those (ms); each further one doubles it.
    first_delay_ms: int
    #: The longest delay (ms).
    max_delay_ms: int
    #: How long a client's failures are remembered after its last one (ms).
    forget_ms: int


@dataclass(frozen=True)
class Verdict:
    """What the throttle says of one login attempt."""

    #: Let it in (or, when only asked, it may try).
    allowed: bool
    #: Refused unchecked: the client waits out a delay.
    waiting: bool
    #: Seconds until the client may try again (0: at once).
    wait_s: float


class DashboardLogins:
    """Login throttle, sessions and secret of the dashboard, shared by every serve process."""

    def __init__(
        self, client: Any, scripts: Scripts, keys: GlobalKeys, call_timeout_s: float
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.call_timeout_s = call_timeout_s

    @staticmethod
    def client_id(address: str) -> str:
        """A bounded key part for a client address (a forwarded one may be anything): an
        IPv6 client is its /64 (one host's share of addresses), an IPv4-mapped one its IPv4."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            part = address
        else:
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            part = (
                str(ipaddress.ip_network(f"{ip}/64", strict=False))
                if ip.version == 6
                else str(ip)
            )
        return hashlib.sha256(part.encode("utf-8", "replace")).hexdigest()[:32]

    @translate_errors
    async def attempt(self, address: str, correct: bool | None, throttle: Throttle) -> Verdict:
        """One login attempt of `address`, its credential already checked (`correct`; None:
        only ask whether the client may try now). Refused during the client's delay, whatever
        the credential."""
        code, wait_ms = await self.scripts.login_attempt(
            keys=[self.keys.ui_client_logins(self.client_id(address))],
            args=[
                now_ms(),
                "?" if correct is None else "1" if correct else "0",
                throttle.free,
                throttle.first_delay_ms,
                throttle.max_delay_ms,
                throttle.forget_ms,
            ],
        )
        return Verdict(allowed=int(code) == 1, waiting=int(code) == 2, wait_s=int(wait_ms) / 1000)

    @translate_errors
    async def secret(self) -> bytes:
        """The dashboard's secret, made once for the deployment (every serve process signs
        with the same one); a Redis that lost it makes a new one, ending every session."""
        fresh = secrets.token_hex(SECRET_BYTES)
        await self.client.set(self.keys.ui_secret, fresh, nx=True)
        value = await self.client.get(self.keys.ui_secret)
        return as_text(value if value is not None else fresh).encode()

    @translate_errors
    async def open_session(self, ttl_s: int, who: dict[str, Any]) -> str:
        """A session naming `who` (the person, as the dashboard keeps them) for `ttl_s`."""
        session_id = secrets.token_urlsafe(24)
        await self.client.set(self.keys.ui_session(session_id), json.dumps(who), ex=ttl_s)
        return session_id

    @translate_errors
    async def session(self, session_id: str) -> dict[str, Any] | None:
        """Whom an open session names, or None once it ended (logout, expiry)."""
        return json_object(await awaited(self.client.get(self.keys.ui_session(session_id))))

    @translate_errors
    async def session_alive(self, session_id: str) -> bool:
        return bool(await awaited(self.client.exists(self.keys.ui_session(session_id))))

    @translate_errors
    async def end_session(self, session_id: str) -> None:
        await self.client.delete(self.keys.ui_session(session_id))

    @translate_errors
    async def device_wait(self, ttl_s: int, pending: dict[str, Any]) -> str:
        """Keep a GitHub device-flow sign-in while the person enters its code; its id."""
        attempt = secrets.token_urlsafe(24)
        await self.client.set(self.keys.ui_device(attempt), json.dumps(pending), ex=ttl_s)
        return attempt

    @translate_errors
    async def device_pending(self, attempt: str) -> dict[str, Any] | None:
        return json_object(await awaited(self.client.get(self.keys.ui_device(attempt))))

    @translate_errors
    async def device_done(self, attempt: str) -> None:
        await self.client.delete(self.keys.ui_device(attempt))
