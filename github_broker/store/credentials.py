"""The GitHub token minted for a lease, kept until it expires: handed again to the same lease,
and taken (to revoke it) when the lease completes or is released."""

from __future__ import annotations

import json
from typing import Any

from github_broker.store.connection import awaited, json_object, translate_errors


class CredentialLedger:
    """One repository's minted agent tokens, by issue."""

    def __init__(self, rstore: Any) -> None:
        self.client = rstore.client
        self.keys = rstore.keys
        self.call_timeout_s = rstore.call_timeout_s

    @translate_errors
    async def held(self, number: int) -> dict[str, Any] | None:
        """The record of the token minted for the lease on `number`, if it has not expired."""
        return json_object(await awaited(self.client.get(self.keys.credential(number))))

    @translate_errors
    async def remember(self, number: int, record: dict[str, Any], ttl_ms: int) -> None:
        await self.client.set(self.keys.credential(number), json.dumps(record), px=max(1, ttl_ms))

    @translate_errors
    async def take(self, number: int) -> dict[str, Any] | None:
        """The record, removed: its token is to be revoked."""
        return json_object(await awaited(self.client.getdel(self.keys.credential(number))))
