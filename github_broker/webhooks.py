"""GitHub webhooks: verify and queue deliveries, and the leader's worker that applies them."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from github_broker.background import stop_task
from github_broker.errors import AuthError, BrokerError, InvalidRequest, NotFound
from github_broker.gateway import GitHubGateway
from github_broker.models import Issue
from github_broker.reviews import ReviewKeeper
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store
from github_broker.sync import Syncer

logger = logging.getLogger(__name__)

#: Events the broker reads; any other event is answered "ignored".
EVENTS = frozenset(
    {
        "issues",
        "issue_comment",
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
    }
)
#: Issue actions after which the issue is gone from the repository for good.
GONE_ACTIONS = frozenset({"deleted", "transferred"})
#: Marks a deleted or transferred issue in issue_version: sorts after every timestamp.
GONE = "~"
#: Seconds issue_version:{n} is kept; deliveries arriving later than that are rare.
VERSION_TTL_S = 86400
#: Seconds one blocking take waits before the worker re-checks leadership.
TAKE_TIMEOUT_S = 1.0
#: Seconds between two takes when the store does not block (the sandbox's fakeredis).
NON_BLOCKING_POLL_S = 0.05
#: Pause after a failed delivery or while not leading, in seconds.
IDLE_S = 0.5


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """`X-Hub-Signature-256: sha256=<hex>` is the HMAC-SHA256 of the raw body."""
    if not header or not header.startswith("sha256="):
        return False
    expected = b"sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, header.encode("ascii", "replace"))


@dataclass(frozen=True)
class Receipt:
    status: str  # queued | duplicate | ignored | pong
    reason: str


class WebhookReceiver:
    """The endpoint's use case: refuse what is not GitHub's or not ours, queue the rest."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store

    def verify(self, body: bytes, signature: str | None) -> None:
        secret = self.settings.webhooks.resolved_secret()
        if secret is None:
            raise NotFound("webhooks are not configured: set webhooks.secret")
        if not signature:
            raise AuthError("unsigned delivery: X-Hub-Signature-256 is missing")
        if not signature_ok(secret, body, signature):
            raise AuthError("X-Hub-Signature-256 does not match the body and the webhook secret")

    async def accept(self, event: str, delivery: str, body: bytes) -> Receipt:
        """Called with a verified body; refuses repositories not served before touching Redis."""
        if not event or not delivery or len(delivery) > 100:
            raise InvalidRequest("X-GitHub-Event and X-GitHub-Delivery (<= 100 chars) are needed")
        try:
            text = body.decode("utf-8")
            payload = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError included
            raise InvalidRequest(f"the delivery body is not UTF-8 JSON: {e}") from e
        except RecursionError as e:
            raise InvalidRequest("the delivery body is JSON nested too deep") from e
        if not isinstance(payload, dict):
            raise InvalidRequest("the delivery body must be a JSON object")
        repository = payload.get("repository")
        full_name = str(repository.get("full_name") or "") if isinstance(repository, dict) else ""
        if event == "ping" and not full_name:
            return Receipt("pong", "ping from a GitHub App webhook")
        repo = self.settings.repository(full_name) or next(
            (r for r in self.settings.repositories if r.full_name.lower() == full_name.lower()),
            None,
        )
        if repo is None:
            raise NotFound(f"repository {full_name or '(none)'} is not served by this broker")
        rstore = self.store.repo(repo.full_name)
        if event == "ping":
            await rstore.mark_webhooks_seen()
            return Receipt("pong", "webhook reachable")
        if event not in EVENTS:
            return Receipt("ignored", f"event {event!r} is not used by the broker")
        _check_shape(event, payload)
        envelope = json.dumps(
            {"event": event, "delivery": delivery, "received_ms": int(time.time() * 1000)}
        )
        # The raw body follows the envelope line untouched: no re-encoding on the hot path.
        queued = await rstore.enqueue_webhook(
            delivery, envelope + "\n" + text, self.settings.webhooks.delivery_ttl_s
        )
        if not queued:
            return Receipt("duplicate", f"delivery {delivery} was handled already")
        return Receipt("queued", f"{event} queued")


class WebhookWorker:
    """Applies queued deliveries in the leader: one targeted update per event, no listings."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        syncer: Syncer,
        reviews: ReviewKeeper,
    ) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.syncer = syncer
        self.reviews = reviews
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, is_leader: Callable[[], bool]) -> None:
        if not self.configured:
            return  # nothing can be queued without a secret
        self._tasks = [
            asyncio.create_task(self._loop(repo, is_leader), name=f"webhooks {repo.full_name}")
            for repo in self.settings.repositories
        ]

    async def stop(self) -> None:
        await asyncio.gather(*(stop_task(task) for task in self._tasks))
        self._tasks = []

    async def _loop(self, repo: Repository, is_leader: Callable[[], bool]) -> None:
        rstore = self.store.repo(repo.full_name)
        recovered = False
        while True:
            if not is_leader():
                recovered = False
                await asyncio.sleep(IDLE_S)
                continue
            try:
                if not recovered:
                    # A previous leader may have died holding deliveries: do them again.
                    moved = await rstore.requeue_inflight_webhooks()
                    if moved:
                        logger.info("%s: re-queued %d webhook deliveries", repo.full_name, moved)
                    recovered = True
                started = time.monotonic()
                envelope = await rstore.take_webhook(TAKE_TIMEOUT_S)
                if envelope is None:
                    if time.monotonic() - started < TAKE_TIMEOUT_S / 2:
                        # fakeredis (memory://) answers a blocking pop at once: pace it.
                        await asyncio.sleep(NON_BLOCKING_POLL_S)
                    continue
                try:
                    await self.apply(repo, rstore, envelope)
                except (KeyError, TypeError, ValueError) as e:
                    # Signed by GitHub but not the shape we read: retrying cannot help.
                    logger.error("webhook delivery for %s dropped: %r", repo.full_name, e)
                await rstore.webhook_done(envelope)
            except BrokerError as e:
                # The delivery stays in flight; the next leader start re-queues it, and
                # polling covers the change meanwhile.
                logger.warning("webhook delivery for %s not applied: %s", repo.full_name, e)
                await asyncio.sleep(IDLE_S)
            except Exception:
                # A defect of ours: the same, but it must not end this repository's worker
                # (deliveries would still mark webhooks healthy and keep polling slowed).
                logger.exception("webhook delivery for %s failed", repo.full_name)
                await asyncio.sleep(IDLE_S)

    async def drain(self, repo: Repository) -> int:
        """Apply every queued delivery now (tests, the CLI); returns how many."""
        rstore = self.store.repo(repo.full_name)
        done = 0
        while (envelope := await rstore.take_webhook(0)) is not None:
            await self.apply(repo, rstore, envelope)
            await rstore.webhook_done(envelope)
            done += 1
        return done

    @property
    def configured(self) -> bool:
        hooks = self.settings.webhooks
        return hooks.secret is not None or hooks.secret_file is not None

    async def healthy(self, repo: Repository) -> bool:
        seen = await self.store.repo(repo.full_name).webhooks_seen_ms()
        window_ms = self.settings.webhooks.healthy_within_s * 1000
        return seen is not None and time.time() * 1000 - seen < window_ms

    async def full_due(self, repo: Repository) -> bool:
        state = await self.store.repo(repo.full_name).sync_state()
        last_full = float(state.get("full_at", 0))
        return time.time() - last_full >= self.settings.poll.full_sync_interval_s

    # --- one delivery -------------------------------------------------------------------

    async def apply(self, repo: Repository, rstore: RepoStore, envelope: str) -> str:
        head, _, body = envelope.partition("\n")
        meta = json.loads(head)
        payload = json.loads(body)
        event, action = meta["event"], str(payload.get("action") or "")
        if event == "issues":
            outcome = await self._issue(repo, rstore, action, payload["issue"])
        elif event == "issue_comment" and "pull_request" not in payload["issue"]:
            # A comment's own action (deleted, ...) says nothing about the issue's life.
            outcome = await self._issue(repo, rstore, "commented", payload["issue"])
        elif event in EVENTS:
            outcome = await self._review_upkeep(repo, payload)
        else:
            outcome = "ignored"
        logger.info(
            "webhook %s %s.%s on %s: %s",
            meta["delivery"],
            event,
            action,
            repo.full_name,
            outcome,
        )
        return outcome

    async def _issue(
        self, repo: Repository, rstore: RepoStore, action: str, data: dict[str, Any]
    ) -> str:
        """Mirror one issue from the payload, unless the mirror already has a newer state."""
        n = int(data["number"])
        if action in GONE_ACTIONS:
            # The version first: a sync page landing between the two calls is refused by it.
            await rstore.set_issue_version(n, GONE, VERSION_TTL_S)
            await rstore.remove_issues([n], epoch=self.syncer.epoch)
            return "removed"
        cached = await rstore.get_issue(n)
        known = max(await rstore.issue_version(n) or "", cached.updated_at if cached else "")
        updated = str(data["updated_at"])
        if updated < known:
            return "stale"
        if updated == known:
            if cached is not None and cached == Issue.from_github(data):
                return "unchanged"
            # Two changes within one second (GitHub's resolution) arrive in either order:
            # only GitHub can say which came last, so read that one issue.
            fresh = await asyncio.to_thread(self.gateway.issue, repo.full_name, n)
            if fresh is None:
                await rstore.set_issue_version(n, GONE, VERSION_TTL_S)
                await rstore.remove_issues([n], epoch=self.syncer.epoch)
                return "removed"
            data, updated = fresh, str(fresh["updated_at"])
        if data.get("state") == "open":
            base = await self.syncer.base_branch(repo, rstore, await rstore.sync_state())
            # Fenced like the sync, and a vanished lease label is checked the same way.
            await self.syncer.apply_issues(rstore, [Issue.from_github(data)], base)
            outcome = "upserted"
        else:
            # The version before the removal: sync_upsert.lua refuses a page older than it,
            # so a sync that read the issue open just before it closed cannot bring it back.
            await rstore.set_issue_version(n, updated, VERSION_TTL_S)
            await rstore.remove_issues([n], epoch=self.syncer.epoch)
            return "removed"
        await rstore.set_issue_version(n, updated, VERSION_TTL_S)
        return outcome

    async def _review_upkeep(self, repo: Repository, payload: dict[str, Any]) -> str:
        """Feedback on a PR: run the review upkeep for that one PR now, not at the next poll."""
        pull = payload.get("pull_request")
        if pull is None:  # issue_comment on a PR: the payload has the issue side only
            number = int(payload["issue"]["number"])
            pull = await asyncio.to_thread(self.gateway.pull, repo.full_name, number)
        if pull is None or pull.get("state") != "open":
            return "ignored (pull request not open)"
        report = await self.reviews.run(repo, pulls=[pull])
        return f"review upkeep: {report.reviews_offered} review(s), {report.fixes_offered} fix(es)"


#: GitHub's timestamps: `2026-11-23T10:00:00Z` (compared as strings by the mirror).
_ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def _check_shape(event: str, payload: dict[str, Any]) -> None:
    """The fields the worker reads, checked before anything is queued."""
    key = "pull_request" if event.startswith("pull_request") else "issue"
    item = payload.get(key)
    number = item.get("number") if isinstance(item, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number < 2**53:
        raise InvalidRequest(f"{event} delivery without a valid `{key}.number`")
    if key != "issue":
        return
    assert isinstance(item, dict)
    updated = item.get("updated_at")
    if not isinstance(updated, str) or not _ISO_UTC.match(updated):
        raise InvalidRequest(f"{event} delivery without `issue.updated_at` (ISO 8601 UTC)")
    labels = item.get("labels", [])
    if not isinstance(labels, list) or not all(
        isinstance(lab, dict) and isinstance(lab.get("name"), str) for lab in labels
    ):
        raise InvalidRequest(f"{event} delivery with `issue.labels` that are not label objects")
