"""The dashboard's logins: attempts counted per client and for everyone, and the sessions a
login opens (in Redis, so a logout ends a session for every serve process)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from github_broker.keys import GlobalKeys
from github_broker.store.connection import awaited, translate_errors
from github_broker.store.scripts import Scripts


class DashboardLogins:
    """Login throttle and sessions of the dashboard, shared by every serve process."""

    def __init__(
        self, client: Any, scripts: Scripts, keys: GlobalKeys, call_timeout_s: float
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.call_timeout_s = call_timeout_s

    @staticmethod
    def client_id(address: str) -> str:
        """A bounded key part for a client address (a forwarded one may be anything)."""
        return hashlib.sha256(address.encode("utf-8", "replace")).hexdigest()[:32]

    @translate_errors
    async def attempt(self, address: str, window_s: float, per_client: int, overall: int) -> float:
        """Count a login attempt of `address`: 0 when it may go on, else the seconds until
        the window that refuses it ends (its client's, or everyone's)."""
        keys = [self.keys.ui_client_logins(self.client_id(address)), self.keys.ui_logins]
        allowed, wait_ms = await self.scripts.login_attempt(
            keys=keys, args=[int(window_s * 1000), per_client, overall]
        )
        return 0.0 if int(allowed) else int(wait_ms) / 1000

    @translate_errors
    async def succeeded(self, address: str) -> None:
        """The client got in: its own failures are forgiven (everyone's window stays)."""
        await self.client.delete(self.keys.ui_client_logins(self.client_id(address)))

    @translate_errors
    async def open_session(self, ttl_s: int) -> str:
        session_id = secrets.token_urlsafe(24)
        await self.client.set(self.keys.ui_session(session_id), "1", ex=ttl_s)
        return session_id

    @translate_errors
    async def session_alive(self, session_id: str) -> bool:
        return bool(await awaited(self.client.exists(self.keys.ui_session(session_id))))

    @translate_errors
    async def end_session(self, session_id: str) -> None:
        await self.client.delete(self.keys.ui_session(session_id))
