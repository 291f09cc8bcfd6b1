"""How the broker reaches GitHub (a token or a GitHub App, pacing, quota) and Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    SecretStr,
    model_validator,
)

from github_broker.settings.base import Section


class GitHubSettings(Section):
    base_url: str = "https://api.github.com"
    token: SecretStr | None = None
    token_file: Path | None = None
    #: Seconds before a single GitHub request is abandoned.
    timeout_s: float = Field(15.0, gt=0)
    #: Items per page when listing (GitHub allows at most 100).
    per_page: int = Field(100, ge=1, le=100)
    #: Minimum pause between content-creating calls (GitHub asks for about 80 a minute).
    seconds_between_writes: float = Field(0.75, ge=0)
    #: Content-creating calls allowed at once before `seconds_between_writes` paces them.
    write_burst: int = Field(10, ge=1)
    #: Content-creating calls per hour at most (GitHub's secondary limit; 0: no hourly cap).
    #: `seconds_between_writes: 0` turns all pacing off.
    writes_per_hour: int = Field(500, ge=0)
    #: Below this many remaining calls the broker waits for the quota reset.
    min_remaining_quota: int = Field(50, ge=0)
    #: GitHub App authentication instead of a token: all three, and a private key.
    app_id: int | None = None
    app_installation_id: int | None = None
    app_private_key: SecretStr | None = None
    app_private_key_file: Path | None = None
    #: Hand each lease a short-lived GitHub token of the App's installation, limited to the
    #: task's repository and `agent_permissions` (POST /tasks/{o}/{r}/{n}/credential).
    agent_credentials: bool = False
    #: What an agent's token may do (GitHub App permission -> read or write).
    agent_permissions: dict[
        Literal["contents", "pull_requests", "issues", "metadata"], Literal["read", "write"]
    ] = {"contents": "write", "pull_requests": "write", "issues": "read"}

    @model_validator(mode="after")
    def _one_way_to_authenticate(self) -> GitHubSettings:
        app_fields = [
            self.app_id,
            self.app_installation_id,
            self.app_private_key or self.app_private_key_file,
        ]
        if any(f is not None for f in app_fields):
            if any(f is None for f in app_fields):
                raise ValueError(
                    "GitHub App authentication needs app_id, app_installation_id and "
                    "app_private_key (or app_private_key_file); set all of them or none"
                )
            if self.token is not None or self.token_file is not None:
                raise ValueError("set either a token or a GitHub App, not both")
            _check_private_key(self)
        elif self.agent_credentials:
            raise ValueError(
                "agent_credentials needs a GitHub App (app_id, app_installation_id and "
                "app_private_key): agents' tokens are minted from its installation"
            )
        return self

    def app_key(self) -> str | None:
        if self.app_private_key is not None:
            return self.app_private_key.get_secret_value()
        if self.app_private_key_file is not None:
            return self.app_private_key_file.read_text()
        return None

    def resolved_token(self) -> str | None:
        if self.token is not None:
            return self.token.get_secret_value()
        if self.token_file is not None:
            return self.token_file.read_text().strip()
        return None


def _check_private_key(github: GitHubSettings) -> None:
    """A key PyGithub cannot read would only fail at the first GitHub call, deep inside it."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    where = (
        f"app_private_key_file {github.app_private_key_file}"
        if github.app_private_key is None
        else "app_private_key"
    )
    try:
        key = github.app_key() or ""
    except OSError as e:
        raise ValueError(f"{where}: cannot be read ({e.strerror})") from e
    try:
        load_pem_private_key(key.encode(), password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"{where} is not a PEM private key without a passphrase (-----BEGIN RSA PRIVATE "
            "KEY-----...); download a new key from the App's settings page"
        ) from e


class RedisSettings(Section):
    url: str = "redis://127.0.0.1:6379/0"
    #: Prefix of every key; each repository adds a Cluster hash tag after it.
    key_prefix: str = Field("gb", pattern=r"^[A-Za-z0-9_.-]+$")
    #: Seconds one Redis call may take before it fails (503 + Retry-After to the client); a
    #: hung Redis must not hold requests for long.
    socket_timeout_s: float = Field(2.0, gt=0)
    #: Seconds to open a connection to Redis.
    connect_timeout_s: float = Field(1.0, gt=0)
    #: After Redis restarted with data (loaded from its RDB or AOF file) or failed over to a
    #: replica, that data may be older than GitHub: leases ended since look live, queued
    #: label writes since applied come back. With this on, the poller's leader drops each
    #: repository's data and rebuilds it from GitHub, as after a total loss, unless the data
    #: holds the mark that leader wrote last (a graceful restart's save). Turn it off only
    #: with `appendfsync always` and no failover. Default (unset): on, unless `durability`
    #: is `replica` or `aof`, whose acknowledged writes survive a restart or a failover.
    rebuild_after_restart: bool | None = None
    #: When a claim, completion or release is answered: `none` as soon as Redis ran it (a
    #: single box), `replica` once `durable_replicas` replicas acknowledged it (WAIT),
    #: `aof` once Redis wrote it to its append-only file (WAITAOF on Redis >= 7.2, or a
    #: server with `appendfsync always`). A bound missed answers 503 (retry).
    durability: Literal["none", "replica", "aof"] = "none"
    #: Replicas that must have a write (durability `replica`).
    durable_replicas: int = Field(1, ge=1, le=16)
    #: Milliseconds to wait for that acknowledgement before answering 503.
    durable_timeout_ms: int = Field(500, ge=1, le=60_000)

    @property
    def rebuilds_after_restart(self) -> bool:
        if self.rebuild_after_restart is not None:
            return self.rebuild_after_restart
        return self.durability == "none"
