"""The broker's edges: the HTTP server and its tokens, webhooks, `/broker` commands, audit."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import (
    Field,
    SecretStr,
    model_validator,
)

from github_broker.settings.base import AGENT_ID_RE, Section
from github_broker.settings.people import ADMIN_NAME, MaintainerEntry, read_maintainers

#: Shortest agent token accepted: a short one is guessed, and it tells a map written the
#: wrong way round (token -> agent id) from the right one.
MIN_TOKEN_CHARS = 16


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: Bind beyond loopback without agent tokens; only for trusted networks.
    allow_unauthenticated: bool = False
    #: agent id -> token (at least 16 characters), the same way round as the file; usually
    #: from GITHUB_BROKER_SERVER__AGENT_TOKENS (JSON) or `agent_tokens_file`.
    agent_tokens: dict[str, str] = {}
    agent_tokens_file: Path | None = None
    #: The administrator's token: acts as the person named `admin`.
    admin_token: SecretStr | None = None
    #: Named people: a token digest, an authority and the repositories each maintains
    #: (settings/people.py); re-read when it changes, like the agent tokens file.
    maintainers_file: Path | None = None
    #: Host names the API answers besides loopback's (`localhost`, `127.0.0.1`, `[::1]`)
    #: while no token is configured; any other Host gets 421 (a DNS-rebinding page).
    allowed_hosts: list[str] = []
    #: Upper bound of `wait_seconds` a request may ask for.
    max_wait_s: int = Field(60, ge=0, le=300)
    #: Also run the polling daemon inside `serve` (one leader among all processes).
    run_poller: bool = True
    #: A long-polling request re-checks this often even without a wake-up event.
    long_poll_recheck_s: float = Field(5.0, gt=0)
    #: Largest request body (bytes) the API reads; a larger one gets 413 unread.
    max_body_bytes: int = Field(1024 * 1024, ge=1024)
    #: Connections one API worker holds at once (at most half the file limit, less a
    #: reserve); a new one beyond it closes the oldest that has no request in progress.
    max_connections: int = Field(4096, ge=16)
    #: Seconds a connection may take to send a request's headers, when new and after each
    #: response, before it is closed (a half-sent header must not hold it for ever).
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    #: Addresses of reverse proxies whose X-Forwarded-Proto and X-Forwarded-For are believed
    #: (`*`: any): the dashboard's cookie is `Secure` when the proxy says the request came
    #: over HTTPS, and its login throttle counts the forwarded client. Empty: none is.
    trusted_proxies: list[str] = []

    def resolved_agent_tokens(self) -> dict[str, str]:
        """token -> agent id, from the setting and the file (both written agent id -> token);
        ValueError, naming where and the fix, for a map written the other way round."""
        tokens = {token: agent for agent, token in _agent_map(self.agent_tokens, "agent_tokens")}
        if self.agent_tokens_file is not None:
            loaded = yaml.safe_load(self.agent_tokens_file.read_text()) or {}
            where = f"agent_tokens_file {self.agent_tokens_file}"
            tokens.update({token: agent for agent, token in _agent_map(loaded, where)})
        return tokens

    @property
    def tokens_configured(self) -> bool:
        """Whether any token is configured (agents', the admin's, a maintainers file): a
        deployment without is open, loopback only (api/hosts.py)."""
        return bool(
            self.agent_tokens or self.agent_tokens_file or self.admin_token or self.maintainers_file
        )

    def resolved_maintainers(self, served: set[str] | None = None) -> dict[str, MaintainerEntry]:
        if self.maintainers_file is None:
            return {}
        return read_maintainers(self.maintainers_file, served)

    @model_validator(mode="after")
    def _no_open_server_without_auth(self) -> ServerSettings:
        loopback = self.host in {"127.0.0.1", "localhost", "::1"}
        if self.agent_tokens_file is not None:
            try:
                tokens = self.resolved_agent_tokens()
            except (OSError, yaml.YAMLError, AttributeError) as e:
                raise ValueError(f"agent_tokens_file {self.agent_tokens_file}: {e}") from e
            if not tokens:
                raise ValueError(
                    f"agent_tokens_file {self.agent_tokens_file} holds no tokens; it maps "
                    "agent id -> token, one per line (`claude-1: <token>`)"
                )
        has_tokens = bool(self.resolved_agent_tokens())
        if ADMIN_NAME in self.resolved_maintainers() and self.admin_token is not None:
            raise ValueError(
                f"maintainers_file {self.maintainers_file} names a person {ADMIN_NAME!r}, the "
                "name server.admin_token acts as; rename them, or drop admin_token"
            )
        if not loopback and not has_tokens and not self.allow_unauthenticated:
            raise ValueError(
                f"host {self.host!r} is not loopback but no agent tokens are configured; set "
                "server.agent_tokens / agent_tokens_file, or server.allow_unauthenticated: true"
            )
        return self


def _agent_map(loaded: object, where: str) -> list[tuple[str, str]]:
    """(agent id, token) pairs of a map written agent id -> token, or ValueError: an entry
    whose key is no agent id or whose token is short is refused (most often, the map is
    written token -> agent id). The message never quotes a token."""
    if not isinstance(loaded, dict):
        raise ValueError(f"{where}: map each agent id to its token (`claude-1: <token>`)")
    pairs = [(str(agent), str(token)) for agent, token in loaded.items()]
    for i, (agent, token) in enumerate(pairs, start=1):
        if AGENT_ID_RE.match(agent) and len(token) >= MIN_TOKEN_CHARS:
            continue
        reversed_ = AGENT_ID_RE.match(token) is not None and len(token) < MIN_TOKEN_CHARS
        raise ValueError(
            f"{where}: entry {i}: the map is agent id -> token (`claude-1: <token>`): each key "
            f"an agent id (1-50 characters from A-Z a-z 0-9 . _ -), each token at least "
            f"{MIN_TOKEN_CHARS} characters (`openssl rand -hex 32`)."
            + (" This one looks written token -> agent id: swap each entry." if reversed_ else "")
        )
    return pairs


class WebhookSettings(Section):
    """`POST /github/webhook`: GitHub's signed deliveries beside polling."""

    #: The webhook's shared secret (HMAC-SHA256); deliveries are refused while none is set.
    secret: SecretStr | None = None
    secret_file: Path | None = None
    #: Largest delivery body accepted, in bytes (issue and PR events are a few kB).
    max_body_bytes: int = Field(1_048_576, ge=1024)
    #: Seconds a delivery id (X-GitHub-Delivery) is remembered, so redeliveries are ignored.
    delivery_ttl_s: int = Field(86400, ge=60)
    #: Webhooks count as healthy while a verified delivery or ping arrived this recently (s).
    healthy_within_s: float = Field(900.0, gt=0)
    #: GitHub calls an hour the webhook worker may make (issue and pull request reads, review
    #: upkeep of PR feedback), apart from polling's; 500 is a tenth of a token's 5,000.
    github_calls_per_hour: int = Field(500, ge=0)
    #: GitHub calls the webhook worker may make at once before the hourly rate applies: in
    #: any hour it spends at most github_burst + github_calls_per_hour. Deliveries over the
    #: budget wait in the queue; polling covers their changes meanwhile.
    github_burst: int = Field(50, ge=1)

    def resolved_secret(self) -> bytes | None:
        if self.secret is not None:
            return self.secret.get_secret_value().encode()
        if self.secret_file is not None:
            return self.secret_file.read_text().strip().encode()
        return None


class CommandSettings(Section):
    """`/broker …` commands in issue comments (github_broker/commands/)."""

    #: Read `/broker` lines in issue comments (webhooks and the poll); false ignores them.
    enabled: bool = True
    #: Seconds the permission GitHub reports for a commenter is trusted before it is asked
    #: again (a removed collaborator can steer for at most this long).
    permission_cache_s: int = Field(600, ge=10, le=86400)
    #: A comment older than this many seconds when the broker sees it is not acted on (a
    #: webhook redelivered days later, a poll after a long outage).
    max_age_s: int = Field(3600, ge=60, le=7 * 86400)
    #: Permission lookups for commenters not in the cache, per hour (a quarter of it at
    #: once): a flood of comments from many accounts cannot spend more GitHub calls.
    lookups_per_hour: int = Field(120, ge=4)


class AuditSettings(Section):
    """The audit log of actions by maintainers and by the broker itself."""

    #: Entries kept per repository (and for the deployment) in Redis, approximately.
    max_entries: int = Field(10000, ge=100)
    #: Append every entry to this JSONL file as well (written by the poller leader).
    file: Path | None = None
