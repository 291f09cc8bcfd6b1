"""Bearer tokens: each agent token is bound to one agent id; a person's token (the admin
token, or a maintainers file entry) names that person.

Any token that is not a configured one gets 401; a configured token used where it does not
belong (another agent's id, an agent token on an admin endpoint, a person's on an agent's)
gets 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Collection

from fastapi import Request

from github_broker.errors import AuthError, Forbidden
from github_broker.models import Authority
from github_broker.people.directory import People, Person, token_digest
from github_broker.people.watched import WatchedFile
from github_broker.settings import ServerSettings
from github_broker.settings.people import ADMIN_NAME


class Authenticator:
    def __init__(self, server: ServerSettings, served: Collection[str] = ()) -> None:
        self.server = server
        self.people = People(server, served)
        self._agent_file = WatchedFile(
            server.agent_tokens_file,
            lambda: self._index(server.resolved_agent_tokens()),
            "agent tokens file",
        )

    @staticmethod
    def _index(tokens: dict[str, str]) -> dict[bytes, tuple[bytes, str]]:
        # Found by their SHA-256 (one dict lookup, however many agents), then compared in
        # constant time as bytes: hmac.compare_digest refuses non-ASCII str (a 500 otherwise).
        return {token_digest(_raw(tok)): (_raw(tok), agent) for tok, agent in tokens.items()}

    @property
    def open(self) -> bool:
        """No tokens configured: loopback-only deployments (settings refuse anything else)."""
        return open_deployment(self.server)

    def _bearer(self, request: Request) -> str | None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def agent(self, request: Request, agent_id: str) -> None:
        """Allow the request to act as `agent_id`, or raise."""
        if self.open:
            return
        token = self._bearer(request)
        if token is None:
            raise AuthError("missing bearer token (Authorization: Bearer <agent token>)")
        bound = self._agent_of(_raw(token))
        if bound is None:
            if self.people.by_token(_raw(token)) is not None:
                raise Forbidden("a person's token cannot act as an agent; use the agent's token")
            raise AuthError("unknown token")
        if bound != agent_id:
            raise Forbidden(f"this token belongs to agent {bound!r}, not {agent_id!r}")

    def person(self, request: Request) -> Person:
        """The person the request's token names (an open deployment: the administrator
        `admin`), or raise."""
        if self.open:
            return OPEN_ADMIN
        token = self._bearer(request)
        if token is None:
            raise AuthError("missing bearer token (Authorization: Bearer <your token>)")
        raw = _raw(token)
        found = self.people.by_token(raw)
        if found is not None:
            return found
        if self._agent_of(raw) is not None:
            raise Forbidden("this endpoint needs a maintainer's or the admin token, not an agent's")
        raise AuthError("unknown token (this endpoint needs a maintainer's or the admin token)")

    def _agent_of(self, raw: bytes) -> str | None:
        found = self._agent_file.current().get(token_digest(raw))
        return found[1] if found is not None and hmac.compare_digest(found[0], raw) else None


#: Who acts when no token is configured (loopback only): the administrator.
OPEN_ADMIN = Person(ADMIN_NAME, Authority.ADMIN)


def open_deployment(server: ServerSettings) -> bool:
    """No token configured (agents', the admin's, a maintainers file): loopback only, and the
    Host and Origin rules of api/hosts.py apply."""
    return not server.tokens_configured


def _raw(token: str) -> bytes:
    # Header values arrive decoded as latin-1; any str encodes to UTF-8 (surrogates escaped).
    return token.encode("utf-8", "surrogateescape")


