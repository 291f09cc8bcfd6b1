"""Lease tokens that prove themselves: the broker's signature over what a lease grants.

A token is `<nonce>.<payload>.<signature>`. Redis keeps the nonce as the lease's token (its
tombstone, its hand-out record); the payload says what the lease granted — repository, issue,
agent, task type, when it was claimed, until when the proof holds — and the signature is an
HMAC-SHA256 of it under one of the broker's signing keys (its key id travels in the payload,
so keys rotate without ending live leases: every configured key verifies, the first signs).

After Redis lost its data, an agent presenting a valid, unexpired token for the issue it
heartbeats is re-adopted even if no label reached GitHub (lease_refusal_of in _lib.lua).
Without signing keys tokens are plain random nonces, as before.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from github_broker.settings import Settings

#: Bytes of randomness in a token's nonce (the part Redis keeps).
NONCE_BYTES = 18
#: Bytes of the HMAC-SHA256 kept in a token.
SIGNATURE_BYTES = 16
#: The payload's format version.
VERSION = "1"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def new_nonce() -> str:
    return secrets.token_urlsafe(NONCE_BYTES)


@dataclass(frozen=True)
class Grant:
    """What a signed token says its lease granted."""

    repository: str
    issue: int
    agent: str
    task_type: str
    claimed_ms: int
    until_ms: int


class Signer:
    """Signs and verifies lease tokens with the deployment's keys."""

    def __init__(self, keys: dict[str, bytes], proof_s: int) -> None:
        #: key id -> secret; the first one signs.
        self.keys = keys
        #: How long a token proves its lease after its claim (seconds).
        self.proof_s = proof_s

    @classmethod
    def from_settings(cls, settings: Settings) -> Signer:
        return cls(
            settings.leases.resolved_signing_keys(settings.server), settings.leases.agent_task_ttl_s
        )

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def token(self, nonce: str, grant: Grant) -> str:
        """The token the agent gets for the lease Redis knows by `nonce`."""
        if not self.keys:
            return nonce
        kid, secret = next(iter(self.keys.items()))
        payload = _b64(
            "|".join(
                [
                    VERSION,
                    kid,
                    grant.repository,
                    str(grant.issue),
                    grant.agent,
                    grant.task_type,
                    str(grant.claimed_ms),
                    str(grant.until_ms),
                ]
            ).encode("utf-8")
        )
        return f"{nonce}.{payload}.{_b64(self._mac(secret, nonce, payload))}"

    def until(self, claimed_ms: int) -> int:
        return claimed_ms + self.proof_s * 1000

    @staticmethod
    def nonce(token: str) -> str:
        """The part of a token Redis keeps."""
        return token.split(".", 1)[0]

    def verify(self, token: str) -> Grant | None:
        """What a token grants, when its signature is one of ours; None otherwise (a plain
        nonce, a forged or damaged token, a retired key). Expiry is the caller's check."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        nonce, payload, signature = parts
        try:
            fields = _unb64(payload).decode("utf-8").split("|")
            given = _unb64(signature)
        except (ValueError, UnicodeDecodeError):
            return None
        if len(fields) != 8 or fields[0] != VERSION:
            return None
        secret = self.keys.get(fields[1])
        if secret is None or not hmac.compare_digest(self._mac(secret, nonce, payload), given):
            return None
        try:
            return Grant(
                repository=fields[2],
                issue=int(fields[3]),
                agent=fields[4],
                task_type=fields[5],
                claimed_ms=int(fields[6]),
                until_ms=int(fields[7]),
            )
        except ValueError:
            return None

    @staticmethod
    def _mac(secret: bytes, nonce: str, payload: str) -> bytes:
        message = f"{nonce}.{payload}".encode("ascii")
        return hmac.new(secret, message, hashlib.sha256).digest()[:SIGNATURE_BYTES]
