"""How work is handed out and watched: polling, leases, reviews, failures, progress, budgets."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

from pydantic import (
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from github_broker.settings.base import Section
from github_broker.settings.keyfile import default_keys_file, read_or_create
from github_broker.settings.server import ServerSettings

#: The key id of the key once derived from the admin token (verifies only).
DERIVED_KID = "admin"


def _derived(admin_token: str) -> str:
    message = b"github-broker lease signing"
    return hmac.new(admin_token.encode(), message, hashlib.sha256).hexdigest()


class PollSettings(Section):
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


class LeaseSettings(Section):
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
    #: file; a `signing_keys_file` that does not exist yet is created with a fresh key. With
    #: neither, a deployment that has tokens signs with a key the broker generates once into
    #: `$GITHUB_BROKER_STATE_DIR/signing_keys.yaml` (settings/keyfile.py); an open one (no
    #: token) hands out plain random tokens, and says so at start.
    signing_keys: dict[str, SecretStr] = {}
    signing_keys_file: Path | None = None

    def resolved_signing_keys(self, server: ServerSettings) -> dict[str, bytes]:
        keys = {kid: secret.get_secret_value() for kid, secret in self.signing_keys.items()}
        path = self.signing_keys_file
        if path is None and not keys and server.tokens_configured:
            path = default_keys_file()
        if path is not None:
            keys.update(read_or_create(path))
        if keys and server.admin_token is not None:
            # Verifies (never signs: it comes last) the tokens signed before keys stopped
            # being derived from the admin token, so those leases keep their proof.
            keys.setdefault(DERIVED_KID, _derived(server.admin_token.get_secret_value()))
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


class ReviewSettings(Section):
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


class FailureSettings(Section):
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


class SteeringSettings(Section):
    """What maintainers' decisions keep in place after they are taken."""

    #: Seconds an agent whose lease a person revoked (or reassigned to another agent) is not
    #: handed that issue again, unless a maintainer retries it sooner; 0: it may be, at once.
    revoke_keeps_agent_away_s: int = Field(86400, ge=0)


class ProgressSettings(Section):
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


class BudgetSettings(Section):
    """Optional limits per task; a task that reaches one waits for a person (not killed)."""

    #: Seconds a task may be held (0: no limit).
    wall_clock_s: float = Field(0.0, ge=0)
    #: Tokens an issue's attempts may report in all (heartbeat `usage.tokens`; 0: no limit).
    tokens: int = Field(0, ge=0)
    #: Cost an issue's attempts may report in all (heartbeat `usage.cost`; 0: no limit).
    cost: float = Field(0.0, ge=0)
