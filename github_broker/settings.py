"""Configuration: `broker.yaml` + `agents.yml`, overridden by environment variables.

Precedence, highest first: environment (`GITHUB_BROKER_<SECTION>__<FIELD>`), the config
directory's files, the defaults embedded in the package. Secrets (GitHub token, agent and
admin tokens) come from the environment or from files named in the config, never from
the YAML itself being committed with them.
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from github_broker.errors import ConfigError

#: Where the embedded defaults live; the sandbox runs on these alone.
DEFAULTS_DIR = Path(__file__).parent / "defaults"
ENV_PREFIX = "GITHUB_BROKER_"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
#: Agent ids become GitHub labels (at most 50 characters) and parts of Redis keys.
AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Repository(_Section):
    owner: str = Field(min_length=1)
    name: str = Field(min_length=1)
    #: Branch new work starts from; None means the repository's default branch.
    base_branch: str | None = None

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class GitHubSettings(_Section):
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


class RedisSettings(_Section):
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


class PollSettings(_Section):
    #: Seconds between two incremental sync passes.
    interval_s: float = Field(60.0, gt=0)
    #: Seconds between full reconcile passes (catch deletions and transfers).
    full_sync_interval_s: float = Field(3600.0, gt=0)
    #: TTL of the poller's leader lease; renewed every interval_s / 2 at the latest.
    leader_ttl_s: float = Field(30.0, gt=0)
    #: Seconds between two drains of the GitHub write queue.
    outbox_interval_s: float = Field(1.0, gt=0)
    #: Seconds between incremental sync passes while webhooks are healthy (the safety net).
    interval_with_webhooks_s: float = Field(600.0, gt=0)


class LeaseSettings(_Section):
    #: Lifetime of `issue_lock_{n}` unless renewed by a heartbeat.
    lease_ttl_s: int = Field(600, ge=1)
    #: Lifetime of `agent_current_task:{agent}`; refreshed by heartbeat.
    agent_task_ttl_s: int = Field(3600, ge=1)
    #: How long `task_candidate:{n}:{agent}` audit records are kept.
    candidate_ttl_s: int = Field(86400, ge=60)
    #: A task held for less than this many seconds is never settled as completed by the
    #: agent's next request-task (a concurrent or retried request); that request gets the
    #: same task and lease back instead.
    settle_grace_s: float = Field(2.0, ge=0, le=3600)
    #: Keys that sign lease tokens (key id -> secret, at least 16 characters): the first
    #: signs, every one verifies, so a new key goes first and an old one stays until the
    #: tokens it signed have expired. Usually GITHUB_BROKER_LEASES__SIGNING_KEYS (JSON) or a
    #: file. Without any, tokens are signed with a key derived from the admin token, and
    #: without that they are plain random values (no proof after a Redis loss).
    signing_keys: dict[str, SecretStr] = {}
    signing_keys_file: Path | None = None

    def resolved_signing_keys(self, server: ServerSettings) -> dict[str, bytes]:
        keys = {kid: secret.get_secret_value() for kid, secret in self.signing_keys.items()}
        if self.signing_keys_file is not None:
            loaded = yaml.safe_load(self.signing_keys_file.read_text()) or {}
            keys.update({str(kid): str(secret) for kid, secret in loaded.items()})
        if not keys and server.admin_token is not None:
            derived = hmac.new(
                server.admin_token.get_secret_value().encode(),
                b"github-broker lease signing",
                hashlib.sha256,
            ).hexdigest()
            keys = {"admin": derived}
        return {kid: secret.encode("utf-8") for kid, secret in keys.items()}

    @field_validator("signing_keys")
    @classmethod
    def _strong_keys(cls, keys: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for kid, secret in keys.items():
            if not re.match(r"^[A-Za-z0-9_-]{1,32}$", kid):
                raise ValueError(f"key id {kid!r}: 1-32 characters from A-Z a-z 0-9 _ -")
            if len(secret.get_secret_value()) < 16:
                raise ValueError(f"signing key {kid!r} is shorter than 16 characters")
        return keys

    @model_validator(mode="after")
    def _agent_key_outlives_lease(self) -> LeaseSettings:
        if self.agent_task_ttl_s < self.lease_ttl_s:
            raise ValueError(
                "agent_task_ttl_s must be >= lease_ttl_s, or an agent would forget a task it "
                "still holds; raise agent_task_ttl_s or lower lease_ttl_s"
            )
        return self


class ReviewSettings(_Section):
    #: Seconds after needs-review is first seen before the issue is handed out for review.
    delay_s: float = Field(300.0, ge=0)
    #: Age (seconds) of a linked PR after which the poller labels it review-done, once.
    timeout_s: float = Field(600.0, ge=0)
    #: New feedback becomes a fix task once no comment arrived for this many seconds.
    fix_debounce_s: float = Field(60.0, ge=0)
    #: Fix rounds per issue before the broker gives up and labels it needs-human.
    max_fix_rounds: int = Field(3, ge=1)
    #: Only feedback from these GitHub logins counts; empty means anyone not ignored.
    allowed_authors: list[str] = []
    #: Feedback from these logins is ignored (bots and the broker's own login always are).
    ignored_authors: list[str] = []
    #: The agent that did the work gets its own review only after nobody else took it
    #: for this many seconds.
    author_fallback_s: float = Field(600.0, ge=0)
    #: Lifetime of `task:fix:{pr}`.
    fix_task_ttl_s: int = Field(86400, ge=60)
    #: Role review tasks ask for; None: the issue's own role label.
    review_role: str | None = None


class FailureSettings(_Section):
    """The failure budget: failed, abandoned and expired tasks."""

    #: Seconds a task an agent failed, abandoned or let expire is not handed back to it.
    cooldown_s: int = Field(1800, ge=0)
    #: Failures of one issue's tasks, each by an agent that proved healthy since (it completed
    #: a task after failing this one), before the issue is labelled needs-human.
    max_failures: int = Field(3, ge=1)
    #: Consecutive failures of one agent, on different issues, after which the circuit
    #: breaker pauses the agent (a maintainer resumes it) and those failures are not charged
    #: to the issues; 0 turns the breaker off.
    breaker_streak: int = Field(3, ge=0)
    #: Failures an agent reports inside the settle grace (it cannot have worked on the task)
    #: in a row before they count like any other failure (a runner that fails every task at
    #: once must not ping-pong between issues for ever).
    instant_failures_allowed: int = Field(2, ge=0)


class ProgressSettings(_Section):
    """After the hand-out: progress read from GitHub, stalls, tasks completed without a PR."""

    #: A live lease with no progress (push to its branch, PR opened or updated, review reply,
    #: or the agent's own progress note) for this many seconds is flagged stalled, once;
    #: 0 never flags.
    stall_after_s: float = Field(1800.0, ge=0)
    #: Revoke a stalled lease once it has shown no progress for this many seconds (the task
    #: returns to the pool, no failure budget spent); 0 (the default) never does: restarting
    #: a slow but healthy agent destroys work.
    revoke_stalled_after_s: float = Field(0.0, ge=0)
    #: Seconds between two conditional reads of a held task's branch (a free 304 while it
    #: does not move); only while webhooks are not healthy, which report pushes themselves.
    branch_check_interval_s: float = Field(300.0, gt=0)
    #: Seconds between two looks at the held tasks for stalls and budgets (Redis reads only).
    check_interval_s: float = Field(15.0, gt=0)
    #: A development task completed with no PR for its branch or issue, and no commit on
    #: its branch, after this many seconds goes back to the pool as a failed attempt.
    no_pr_grace_s: float = Field(600.0, ge=0)


class BudgetSettings(_Section):
    """Optional limits per task; a task that reaches one waits for a person (not killed)."""

    #: Seconds a task may be held (0: no limit).
    wall_clock_s: float = Field(0.0, ge=0)
    #: Tokens an issue's attempts may report in all (heartbeat `usage.tokens`; 0: no limit).
    tokens: int = Field(0, ge=0)
    #: Cost an issue's attempts may report in all (heartbeat `usage.cost`; 0: no limit).
    cost: float = Field(0.0, ge=0)


class AuditSettings(_Section):
    """The audit log of actions by maintainers and by the broker itself."""

    #: Entries kept per repository (and for the deployment) in Redis, approximately.
    max_entries: int = Field(10000, ge=100)
    #: Append every entry to this JSONL file as well (written by the poller leader).
    file: Path | None = None


class LabelNames(_Section):
    in_progress: str = "in-progress"
    needs_review: str = "needs-review"
    review_done: str = "review-done"
    needs_human: str = "needs-human"
    story: str = "story"
    epic: str = "epic"
    #: Regex with one group capturing the priority number; lower is more urgent.
    priority_pattern: str = r"^P(\d+)$"

    @field_validator("priority_pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        if compiled.groups != 1:
            raise ValueError("must contain exactly one capturing group for the number")
        return value


class BodyPatterns(_Section):
    """How an assignable body is recognised (multiline regexes, searched, not matched)."""

    deliverables: list[str] = [r"^#{1,6}\s*成果物", r"^#{1,6}\s*Deliverables\b"]
    #: Each pattern captures the branch name in group 1.
    branch: list[str] = [
        r"作業ブランチ[^\n]*?[:\uff1a]\*{0,2}\s*`?([^\s`*]+)`?",
        r"^##\s*ブランチ名[ \t]*\n(?:[ \t]*\n)*[ \t]*(?:[-*][ \t]*)?`?([^\s`*]+)`?",
        r"^\s*(?:[-*]\s*)?\**Branch\**\s*:\**\s*`?([^\s`*]+)`?",
    ]
    #: Replaced by `issue-<n>` inside branch names.
    placeholder: str = "issue-xx"

    @field_validator("deliverables", "branch")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern, re.MULTILINE)
            except re.error as e:
                raise ValueError(f"pattern {pattern!r} is not a valid regex: {e}") from e
        return patterns


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    #: Bind beyond loopback without agent tokens; only for trusted networks.
    allow_unauthenticated: bool = False
    #: token -> agent id; usually from GITHUB_BROKER_SERVER__AGENT_TOKENS (JSON) or a file.
    agent_tokens: dict[str, str] = {}
    agent_tokens_file: Path | None = None
    admin_token: SecretStr | None = None
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
        tokens = dict(self.agent_tokens)
        if self.agent_tokens_file is not None:
            loaded = yaml.safe_load(self.agent_tokens_file.read_text()) or {}
            tokens.update({str(token): str(agent) for agent, token in loaded.items()})
        return tokens

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
        if not loopback and not has_tokens and not self.allow_unauthenticated:
            raise ValueError(
                f"host {self.host!r} is not loopback but no agent tokens are configured; set "
                "server.agent_tokens / agent_tokens_file, or server.allow_unauthenticated: true"
            )
        return self


class WebhookSettings(_Section):
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


class CommandSettings(_Section):
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


class Role(_Section):
    role: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""


class Settings(BaseSettings):
    """Everything the broker needs; built once per process (or per test) and passed down."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    #: `owner/name` strings or mappings; the environment takes `a/b,c/d` or JSON.
    repositories: Annotated[list[Repository], NoDecode] = []
    priority_mode: Literal["strict", "best_effort"] = "strict"
    #: Whether issues skipped for their body (no branch, no deliverables, bad branch) hold
    #: the strict bucket at their priority; by default only work someone can take does.
    bucket_counts_unassignable: bool = False
    #: Whether issues that wait on a person (reviewed and awaiting merge or new feedback,
    #: needs-human, a budget reached, held by a maintainer) still hold the strict bucket at
    #: their priority: the stricter rule, nothing lower until the PR is merged. By default
    #: they do not, so agents never idle because a person is slow.
    bucket_holds_for_people: bool = False
    github: GitHubSettings = GitHubSettings()
    redis: RedisSettings = RedisSettings()
    poll: PollSettings = PollSettings()
    leases: LeaseSettings = LeaseSettings()
    failures: FailureSettings = FailureSettings()
    progress: ProgressSettings = ProgressSettings()
    budgets: BudgetSettings = BudgetSettings()
    audit: AuditSettings = AuditSettings()
    labels: LabelNames = LabelNames()
    review: ReviewSettings = ReviewSettings()
    body: BodyPatterns = BodyPatterns()
    server: ServerSettings = ServerSettings()
    webhooks: WebhookSettings = WebhookSettings()
    commands: CommandSettings = CommandSettings()
    agents: list[Role] = []

    @field_validator("repositories", mode="before")
    @classmethod
    def _repo_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = json.loads(text)
            else:
                value = [part.strip() for part in text.split(",") if part.strip()]
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, str):
                if not _REPO_RE.match(item):
                    raise ValueError(f"{item!r} is not of the form owner/name")
                owner, name = item.split("/")
                out.append({"owner": owner, "name": name})
            else:
                out.append(item)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        names = [r.full_name for r in self.repositories]
        if len(set(names)) != len(names):
            raise ValueError(f"repositories lists a repository twice: {names}")
        roles = [a.role for a in self.agents]
        if len(set(roles)) != len(roles):
            raise ValueError(f"agents.yml lists a role twice: {roles}")
        clashing = sorted(
            agent
            for agent in self.server.resolved_agent_tokens().values()
            if label_clash(agent, self.labels, roles)
        )
        if clashing:
            raise ValueError(
                f"agent ids {clashing} are also labels the broker relies on (roles, priorities, "
                "in-progress, ...), compared case-insensitively as GitHub does; the agent id "
                "becomes a label that is removed after each task, so give those agents other ids"
            )
        malformed = sorted(
            agent
            for agent in self.server.resolved_agent_tokens().values()
            if not AGENT_ID_RE.match(agent)
        )
        if malformed:
            raise ValueError(
                f"agent ids {malformed} are not usable as GitHub labels: use 1-50 characters "
                "from A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
        return self

    @property
    def roles(self) -> list[str]:
        return [a.role for a in self.agents]

    def label_clash(self, agent_id: str) -> str | None:
        """The label `agent_id` would collide with on GitHub, or None."""
        return label_clash(agent_id, self.labels, self.roles)

    def repository(self, full_name: str) -> Repository | None:
        return next((r for r in self.repositories if r.full_name == full_name), None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the files, which arrive as init kwargs from load_settings().
        return env_settings, init_settings


def label_clash(agent_id: str, labels: LabelNames, roles: list[str]) -> str | None:
    """The label the broker reads or writes that `agent_id` equals, or None. GitHub compares
    label names case-insensitively, so `p0` is the `P0` label and `Needs-Review` is ours."""
    names = [*labels.model_dump(exclude={"priority_pattern"}).values(), *roles]
    folded = agent_id.casefold()
    hit = next((name for name in names if name.casefold() == folded), None)
    if hit is not None:
        return hit
    if re.match(labels.priority_pattern, agent_id, re.IGNORECASE):
        return f"the priority labels ({labels.priority_pattern})"
    return None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML ({e.problem}). Fix the syntax there; "
            "indent with spaces and quote values that contain ':' or '#'."
        ) from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror}).") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of settings, not a list or text."
        )
    return data


def default_config_dir() -> Path:
    """`$GITHUB_BROKER_CONFIG_DIR`, else `./config` when it has a broker.yaml, else defaults."""
    env = os.environ.get(f"{ENV_PREFIX}CONFIG_DIR")
    if env:
        return Path(env)
    local = Path("config")
    return local if (local / "broker.yaml").exists() else DEFAULTS_DIR


def load_settings(
    config_dir: Path | None = None, *, flags: dict[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build Settings from a config directory; raise ConfigError with a readable message.

    `flags` names the command-line option behind an environment variable the CLI set
    (`{"GITHUB_BROKER_SERVER__HOST": "--host"}`), so errors blame the option."""
    config_dir = config_dir or default_config_dir()
    broker_file = config_dir / "broker.yaml"
    agents_file = config_dir / "agents.yml"
    data: dict[str, Any] = {}
    if broker_file.exists():
        data.update(_read_yaml(broker_file))
    elif config_dir != DEFAULTS_DIR and config_dir.exists():
        raise ConfigError(f"{broker_file}: missing. Copy {DEFAULTS_DIR / 'broker.yaml'} there.")
    agents_source = agents_file if agents_file.exists() else DEFAULTS_DIR / "agents.yml"
    agents_data = _read_yaml(agents_source)
    unknown = set(agents_data) - {"agents"}
    if unknown:
        raise ConfigError(
            f"{agents_source}: unknown top-level key(s) {sorted(unknown)}; the file holds "
            "`agents: [{role: NAME, description: TEXT}, ...]`."
        )
    data["agents"] = agents_data.get("agents") or []
    if "GITHUB_TOKEN" in os.environ and f"{ENV_PREFIX}GITHUB__TOKEN" not in os.environ:
        data.setdefault("github", {})
        if isinstance(data["github"], dict) and "token" not in data["github"]:
            data["github"]["token"] = os.environ["GITHUB_TOKEN"]
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as e:
        own_file = broker_file.exists() and config_dir != DEFAULTS_DIR
        file_keys = set(data) - set(overrides) - {"agents"} if own_file else set()
        origin = _Origin(broker_file, agents_source, file_keys, flags or {})
        raise ConfigError(_explain(e, origin)) from e
    except SettingsError as e:
        raise ConfigError(
            f"Invalid configuration in the environment: {e}. Fix: complex values such as "
            f"{ENV_PREFIX}SERVER__AGENT_TOKENS must be JSON."
        ) from e


class _Origin:
    """Where a setting came from: a command-line option, the environment, a file, a default."""

    def __init__(
        self, broker_file: Path, agents_file: Path, file_keys: set[str], flags: dict[str, str]
    ) -> None:
        self.broker_file = broker_file
        self.agents_file = agents_file
        self.file_keys = file_keys
        self.flags = flags

    def __call__(self, loc: list[str]) -> str:
        env_name = ENV_PREFIX + "__".join(p.upper() for p in loc if not p.isdigit())
        if env_name in os.environ:
            names = [env_name]
        else:
            # A whole section refused (a cross-field rule): every variable inside it counts.
            names = sorted(n for n in os.environ if loc and n.startswith(env_name + "__"))
        sources = [self.flags[n] for n in names if n in self.flags]
        env = [n for n in names if n not in self.flags]
        if env:
            sources.append(f"environment variable{'s' if len(env) > 1 else ''} {', '.join(env)}")
        in_file = loc[0] in self.file_keys if loc else bool(self.file_keys)
        if loc and loc[0] == "agents":
            sources.append(str(self.agents_file))
        elif in_file:
            sources.append(str(self.broker_file))
        elif not names:
            sources.append("the built-in defaults")
        return " and ".join(dict.fromkeys(sources))


def _explain(error: ValidationError, origin: _Origin) -> str:
    lines = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        field = ".".join(loc) or "(top level)"
        source = origin(loc)
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            fix = _suggest(loc)
        else:
            shown = item.get("input")
            got = f" (got {shown!r})" if shown is not None and not isinstance(shown, dict) else ""
            message += got
            fix = f"correct `{field}` in {source}"
        lines.append(f"{source}: field `{field}`: {message}. Fix: {fix}.")
    return "Invalid configuration. " + " ".join(lines)


def _suggest(loc: list[str]) -> str:
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if part.isdigit():
            continue
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        inner = getattr(annotation, "__args__", (annotation,))
        candidates = [a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            break
        model = candidates[0]
    known = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return f"remove the unknown field `{loc[-1]}`; {hint}known fields here: {', '.join(known)}"
