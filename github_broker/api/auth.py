"""Bearer tokens: each agent token is bound to one agent id; the admin token to maintainers."""

from __future__ import annotations

import hmac

from fastapi import Request

from github_broker.errors import AuthError
from github_broker.settings import ServerSettings


class Forbidden(AuthError):
    """Valid credentials, but not for this agent id or endpoint."""

    forbidden = True


class Authenticator:
    def __init__(self, server: ServerSettings) -> None:
        self.agent_tokens = server.resolved_agent_tokens()
        self.admin_token = server.admin_token.get_secret_value() if server.admin_token else None

    @property
    def open(self) -> bool:
        """No tokens configured: loopback-only deployments (settings refuse anything else)."""
        return not self.agent_tokens and self.admin_token is None

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
        bound = next(
            (agent for tok, agent in self.agent_tokens.items() if hmac.compare_digest(tok, token)),
            None,
        )
        if bound is None:
            raise AuthError("unknown token")
        if bound != agent_id:
            raise Forbidden(f"this token belongs to agent {bound!r}, not {agent_id!r}")

    def admin(self, request: Request) -> None:
        if self.open:
            return
        token = self._bearer(request)
        if token is None:
            raise AuthError("missing bearer token (Authorization: Bearer <admin token>)")
        if self.admin_token is None or not hmac.compare_digest(token, self.admin_token):
            raise Forbidden("this endpoint needs the admin token")
