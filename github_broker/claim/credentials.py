"""Scoped GitHub credentials for agents: the lease's holder asks for a token limited to its
task's repository (never the claim itself, which never waits on GitHub); the same lease gets
the same token again while it lives; completing or releasing the task revokes it, any other
end leaves it to expire (GitHub's installation tokens last an hour).

The minting and the revocation are GitHub calls (gateway/credentials.py), given to this use
case as functions: it never imports the gateway."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from typing import Any

from github_broker.clock import ms_from_iso, now_ms
from github_broker.errors import BrokerError, LeaseError, NotFound
from github_broker.models import AgentCredential
from github_broker.store import Store
from github_broker.store.credentials import CredentialLedger
from github_broker.store.tokens import Signer

logger = logging.getLogger(__name__)

#: A kept token is handed again only with at least this long left (ms); else a new one.
MIN_LEFT_MS = 5 * 60 * 1000

Mint = Callable[[str], dict[str, Any]]
Revoke = Callable[[str], None]


def _nothing() -> None:
    return None


def credential_path(repository: str, number: int) -> str:
    return f"/tasks/{repository}/{number}/credential"


class AgentCredentials:
    """Tokens minted per lease; `mint(repository)` and `revoke(token)` call GitHub."""

    def __init__(
        self, store: Store, mint: Mint, revoke: Revoke, closing: Callable[[], None] = _nothing
    ) -> None:
        self.store = store
        self.mint = mint
        self.revoke = revoke
        self._closing = closing
        self._revoking: set[asyncio.Task[None]] = set()

    async def for_lease(
        self, repository: str, number: int, agent_id: str, token: str
    ) -> AgentCredential:
        """The token of the live lease `token` of `agent_id` on `repository#number` (409 as a
        heartbeat would be refused when it is not that lease)."""
        if repository not in self.store.repos:
            raise NotFound(f"repository {repository!r} is not served by this broker")
        rstore = self.store.repo(repository)
        lease = await rstore.lease(number)
        nonce = Signer.nonce(token)
        if lease is None or lease.expires_ms <= now_ms():
            raise LeaseError("expired", f"no live lease on {repository}#{number}")
        mine = hmac.compare_digest(lease.token.encode(), nonce.encode())
        if lease.agent_id != agent_id or not mine:
            raise LeaseError("not_owner", f"{repository}#{number} is not leased with this token")
        ledger = CredentialLedger(rstore)
        kept = await ledger.held(number)
        if kept is not None and kept.get("nonce") == nonce:
            if ms_from_iso(kept["expires_at"]) - now_ms() > MIN_LEFT_MS:
                return _credential(repository, kept)
        elif kept is not None:
            self._revoke_later(str(kept.get("token", "")))  # a former lease's
        minted = await asyncio.to_thread(self.mint, repository)
        record = {
            "nonce": nonce,
            "token": minted["token"],
            "expires_at": minted["expires_at"],
            "permissions": minted.get("permissions") or {},
        }
        await ledger.remember(number, record, ms_from_iso(minted["expires_at"]) - now_ms())
        logger.info("%s#%d: GitHub token minted for %s", repository, number, agent_id)
        return _credential(repository, record)

    async def lease_ended(self, repository: str, number: int) -> None:
        """The lease completed or was released: its token is revoked (in the background)."""
        try:
            kept = await CredentialLedger(self.store.repo(repository)).take(number)
        except BrokerError as e:
            logger.warning("%s#%d: agent token left to expire: %s", repository, number, e)
            return
        if kept is not None:
            self._revoke_later(str(kept.get("token", "")))

    def _revoke_later(self, token: str) -> None:
        if not token:
            return
        task = asyncio.get_running_loop().create_task(self._revoke(token))
        self._revoking.add(task)
        task.add_done_callback(self._revoking.discard)

    async def _revoke(self, token: str) -> None:
        try:
            await asyncio.to_thread(self.revoke, token)
        except BrokerError as e:
            logger.warning("an agent token was not revoked (it expires by itself): %s", e)

    async def close(self) -> None:
        """Let revocations under way finish, then close the GitHub side."""
        if self._revoking:
            await asyncio.gather(*self._revoking, return_exceptions=True)
        self._closing()


def _credential(repository: str, record: dict[str, Any]) -> AgentCredential:
    return AgentCredential(
        token=record["token"],
        expires_at=record["expires_at"],
        repository=repository,
        permissions=record.get("permissions") or {},
    )
