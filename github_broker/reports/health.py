"""The health of the integrations, per repository: sync, mirror, webhooks, write queue, GitHub
quota, and what a maintainer should do about anything that is wrong. Read by `/status`, the
dashboard (its warning at the top) and `/metrics`."""

from __future__ import annotations

import time
from collections.abc import Collection

from pydantic import BaseModel

from github_broker.clock import iso_from_ms, now_ms, span
from github_broker.errors import GitHubError, GitHubNotFound, GitHubUnavailable, RateLimited
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

#: Write-queue lag (seconds) above which the dashboard warns.
WRITE_LAG_WARN_S = 300.0
#: Remaining GitHub calls below which the dashboard warns.
QUOTA_WARN = 200


#: What to do about a failing sync, by kind of failure (failure_kind); {url}: GitHub's API.
SYNC_ADVICE = {
    "unreachable": "GitHub cannot be reached from the broker: check the network, a proxy or "
    "firewall, github.base_url ({url}) and GitHub's status",
    "rate_limited": "GitHub's rate limit: the sync resumes by itself when it resets",
    "credentials": "GitHub refuses the broker's credentials: check the token (GITHUB_TOKEN) "
    "or the GitHub App's key and installation",
    "no_access": "check that the repository exists under this name and that the token or "
    "GitHub App can read it",
    "github": "check the error: GitHub refuses what the broker asks for this repository "
    "(the token's or App's permissions, the repository's settings)",
}


def failure_kind(error: BaseException) -> str:
    """The kind of a sync failure, the key of SYNC_ADVICE ("" for none of them)."""
    if isinstance(error, GitHubUnavailable):
        return "unreachable"
    if isinstance(error, RateLimited):
        return "rate_limited"
    if isinstance(error, GitHubNotFound):
        return "no_access"
    if isinstance(error, GitHubError):
        # GitHub answers 403 (or 404 for a private repository) to a token that may not read.
        kinds = {401: "credentials", 403: "no_access", 404: "no_access"}
        return kinds.get(error.status or 0, "github")
    return ""


class WebhookHealth(BaseModel):
    configured: bool
    #: A verified delivery (or ping) arrived within webhooks.healthy_within_s.
    healthy: bool
    last_delivery: str | None
    #: Deliveries queued for the leader's worker, and taken but not finished.
    queued: int
    inflight: int
    #: The incremental sync runs every poll.interval_with_webhooks_s instead of interval_s.
    polling_slowed: bool


class RepoHealth(BaseModel):
    repository: str
    #: ok | failing
    sync: str
    sync_reason: str | None = None
    #: What to do about the failing sync (by the kind of failure).
    sync_advice: str | None = None
    sync_failing_since: str | None = None
    last_sync: str | None = None
    #: The mirror is being rebuilt from GitHub (first sync, or after Redis lost its data).
    mirror_rebuilding: bool
    webhooks: WebhookHealth
    pending_github_writes: int
    github_write_lag_s: float
    #: What is wrong, each with what to do.
    problems: list[str] = []


class RefusedDelivery(BaseModel):
    """The last webhook delivery the broker refused, and why."""

    at: str
    reason: str
    count: int


class Health(BaseModel):
    repositories: list[RepoHealth]
    quota_remaining: int | None
    quota_reset: str | None
    webhook_refused: RefusedDelivery | None
    problems: list[str]


async def repo_health(rstore: RepoStore, settings: Settings) -> RepoHealth:
    name = rstore.repository
    state = await rstore.sync_state()
    failing = await rstore.sync_failing()
    since = await rstore.sync_failing_since()
    rebuilding = not await rstore.mirror_rebuilt()
    hooks = settings.webhooks
    configured = hooks.secret is not None or hooks.secret_file is not None
    seen = await rstore.webhooks_seen_ms()
    healthy = seen is not None and now_ms() - seen < hooks.healthy_within_s * 1000
    webhooks = WebhookHealth(
        configured=configured,
        healthy=configured and healthy,
        last_delivery=iso_from_ms(seen) if seen else None,
        queued=await rstore.webhook_backlog(),
        inflight=await rstore.webhook_inflight(),
        polling_slowed=configured and healthy,
    )
    lag = await rstore.outbox_lag_s()
    synced = state.get("synced_at")
    health = RepoHealth(
        repository=name,
        sync="failing" if failing else "ok",
        sync_reason=failing,
        sync_advice=_advice(await rstore.sync_failing_kind(), settings) if failing else None,
        sync_failing_since=iso_from_ms(since) if since else None,
        last_sync=iso_from_ms(int(float(synced) * 1000)) if synced else None,
        mirror_rebuilding=rebuilding,
        webhooks=webhooks,
        pending_github_writes=await rstore.outbox_size(),
        github_write_lag_s=round(lag, 3),
    )
    health.problems = _problems(health, settings)
    return health


def _advice(kind: str, settings: Settings) -> str:
    if kind in SYNC_ADVICE:
        return SYNC_ADVICE[kind].format(url=settings.github.base_url)
    return "check the error, GitHub's status and the broker's access to the repository"


def _problems(h: RepoHealth, settings: Settings) -> list[str]:
    out = []
    if h.sync == "failing":
        when = f" since {h.sync_failing_since}" if h.sync_failing_since else ""
        out.append(
            f"{h.repository}: its sync keeps failing{when} ({h.sync_reason}); {h.sync_advice}"
        )
    if h.mirror_rebuilding:
        out.append(
            f"{h.repository}: the mirror is being rebuilt from GitHub (first sync, or Redis "
            "lost its data); agents are told to retry until it is done"
        )
    if h.webhooks.configured and not h.webhooks.healthy:
        out.append(
            f"{h.repository}: no verified webhook delivery within "
            f"{span(int(settings.webhooks.healthy_within_s))}; check the hook's URL and secret "
            "on GitHub (Settings → Webhooks → Recent deliveries); polling covers meanwhile"
        )
    if h.github_write_lag_s > WRITE_LAG_WARN_S:
        out.append(
            f"{h.repository}: GitHub writes lag {span(int(h.github_write_lag_s))} behind "
            "(GitHub down or rate limited); labels on GitHub are late, nothing is lost"
        )
    return out


async def health(
    store: Store, settings: Settings, repositories: Collection[str] | None = None
) -> Health:
    """The integrations' health; `repositories`: only those repositories' rows."""
    shown = [r for n, r in store.repos.items() if repositories is None or n in repositories]
    repos = [await repo_health(r, settings) for r in shown]
    quota = await store.quota()
    refused = await store.webhook_refused()
    problems = [p for r in repos for p in r.problems]
    if quota is not None and quota.remaining is not None and quota.remaining < QUOTA_WARN:
        reset = f", resets {iso_from_ms(int(quota.reset_s * 1000))}" if quota.reset_s else ""
        problems.append(f"GitHub quota low: {quota.remaining} calls left{reset}")
    if refused is not None and time.time() * 1000 - refused[0] < 86_400_000:
        problems.append(
            f"webhook deliveries refused ({refused[2]} so far, last {iso_from_ms(refused[0])}:"
            f" {refused[1]}); check the webhook secret on GitHub and in webhooks.secret"
        )
    return Health(
        repositories=repos,
        quota_remaining=quota.remaining if quota else None,
        quota_reset=iso_from_ms(int(quota.reset_s * 1000)) if quota and quota.reset_s else None,
        webhook_refused=RefusedDelivery(
            at=iso_from_ms(refused[0]), reason=refused[1], count=refused[2]
        )
        if refused
        else None,
        problems=problems,
    )
