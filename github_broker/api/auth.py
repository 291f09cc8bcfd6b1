"""Bearer tokens: each agent token is bound to one agent id; the admin token to maintainers.

Any token that is not a configured one gets 401; a configured token used where it does not
belong (another agent's id, an agent token on an admin endpoint) gets 403.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time

import yaml
from fastapi import Request

from github_broker.errors import AuthError, Forbidden
from github_broker.settings import ServerSettings

logger = logging.getLogger(__name__)

#: Seconds between two looks at the agent tokens file for changes.
TOKEN_FILE_CHECK_S = 1.0


class Authenticator:
    def __init__(self, server: ServerSettings) -> None:
        self.server = server
        self.admin_token = server.admin_token.get_secret_value() if server.admin_token else None
        self._admin = _raw(self.admin_token) if self.admin_token is not None else None
        #: The agent tokens file's (mtime, size, inode) when last read, and when it was checked.
        self._stamp: tuple[int, int, int] | None = None
        self._checked_s = 0.0
        self._use(server.resolved_agent_tokens())
        self._stamp = self._file_stamp()

    def _use(self, tokens: dict[str, str]) -> None:
        self.agent_tokens = tokens
        # Found by their SHA-256 (one dict lookup, however many agents), then compared in
        # constant time as bytes: hmac.compare_digest refuses non-ASCII str (a 500 otherwise).
        self._agents = {_digest(_raw(tok)): (_raw(tok), agent) for tok, agent in tokens.items()}

    def _file_stamp(self) -> tuple[int, int, int] | None:
        path = self.server.agent_tokens_file
        if path is None:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _refresh(self) -> None:
        """Re-read `server.agent_tokens_file` when it changed (checked at most once per
        TOKEN_FILE_CHECK_S): a token removed there is refused from then on, no restart. A file
        that no longer reads keeps the tokens read last (and says so in the log)."""
        if self.server.agent_tokens_file is None:
            return
        now = time.monotonic()
        if now - self._checked_s < TOKEN_FILE_CHECK_S:
            return
        self._checked_s = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return
        try:
            tokens = self.server.resolved_agent_tokens()
        except (OSError, ValueError, AttributeError, yaml.YAMLError) as e:
            logger.warning(
                "agent tokens file %s unreadable, keeping the tokens read last: %s",
                self.server.agent_tokens_file,
                e,
            )
            return
        self._stamp = stamp
        self._use(tokens)
        logger.info(
            "agent tokens re-read from %s: %d tokens", self.server.agent_tokens_file, len(tokens)
        )

    @property
    def open(self) -> bool:
        """No tokens configured: loopback-only deployments (settings refuse anything else)."""
        return (
            not self.server.agent_tokens
            and self.server.agent_tokens_file is None
            and self.admin_token is None
        )

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
            if self._is_admin(_raw(token)):
                raise Forbidden("the admin token cannot act as an agent; use the agent's token")
            raise AuthError("unknown token")
        if bound != agent_id:
            raise Forbidden(f"this token belongs to agent {bound!r}, not {agent_id!r}")

    def admin(self, request: Request) -> None:
        if self.open:
            return
        token = self._bearer(request)
        if token is None:
            raise AuthError("missing bearer token (Authorization: Bearer <admin token>)")
        raw = _raw(token)
        if self._is_admin(raw):
            return
        if self._agent_of(raw) is not None:
            raise Forbidden("this endpoint needs the admin token, not an agent token")
        raise AuthError("unknown token (this endpoint needs the admin token)")

    def _agent_of(self, raw: bytes) -> str | None:
        self._refresh()
        found = self._agents.get(_digest(raw))
        return found[1] if found is not None and hmac.compare_digest(found[0], raw) else None

    def _is_admin(self, raw: bytes) -> bool:
        return self._admin is not None and hmac.compare_digest(raw, self._admin)


def _raw(token: str) -> bytes:
    # Header values arrive decoded as latin-1; any str encodes to UTF-8 (surrogates escaped).
    return token.encode("utf-8", "surrogateescape")


def _digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()
