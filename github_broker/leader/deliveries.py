"""The leader's webhook worker: applies queued deliveries, one targeted update per event."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from github_broker.background import stop_task
from github_broker.errors import BrokerError
from github_broker.gateway import GitHubGateway, counting_calls
from github_broker.leader.budget import GitHubBudget
from github_broker.leader.checks import EVENTS as CHECK_EVENTS
from github_broker.leader.checks import CheckKeeper
from github_broker.leader.graph import GRAPH_EVENTS
from github_broker.leader.progress import ProgressKeeper
from github_broker.leader.reviews import ReviewKeeper
from github_broker.leader.sync import Syncer
from github_broker.models import Issue
from github_broker.settings import Repository, Settings
from github_broker.steering.commands import CommentCommands
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

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


class WebhookWorker:
    """Applies queued deliveries in the leader: one targeted update per event, no listings."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        syncer: Syncer,
        reviews: ReviewKeeper,
        progress: ProgressKeeper,
        checks: CheckKeeper | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        #: `/broker` comment commands, on this worker's gateway (the poller reads through it too).
        self.commands = CommentCommands(
            settings, store, gateway, syncer.reindex if syncer is not None else None
        )
        self.syncer = syncer
        self.reviews = reviews
        self.progress = progress
        #: The tracked PRs' CI and mergeability (check runs, statuses, pushes, PR events).
        self.checks = checks
        hooks = settings.webhooks
        #: Shared by every repository's loop: the budget is the worker's, not a repository's.
        self.budget = GitHubBudget(hooks.github_calls_per_hour, hooks.github_burst)
        self._over_budget = False
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
                if not await self._over_budget_wait():
                    await self._take_one(repo, rstore)
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

    async def _take_one(self, repo: Repository, rstore: RepoStore) -> None:
        """Wait a moment for one delivery and apply it, its GitHub calls spent from the
        budget; a delivery of a shape we cannot read is dropped."""
        started = time.monotonic()
        envelope = await rstore.take_webhook(TAKE_TIMEOUT_S)
        if envelope is None:
            if time.monotonic() - started < TAKE_TIMEOUT_S / 2:
                # fakeredis (memory://) answers a blocking pop at once: pace it.
                await asyncio.sleep(NON_BLOCKING_POLL_S)
            return
        try:
            with counting_calls() as calls:
                try:
                    await self.apply(repo, rstore, envelope)
                finally:
                    self.budget.spend(calls[0])
        except (KeyError, TypeError, ValueError) as e:
            # Signed by GitHub but not the shape we read: retrying cannot help.
            logger.error("webhook delivery for %s dropped: %r", repo.full_name, e)
        await rstore.webhook_done(envelope)

    async def _over_budget_wait(self) -> bool:
        """While the GitHub budget is spent: wait a little (deliveries stay queued) and say
        so once; True when the caller should check again before taking a delivery."""
        wait = self.budget.wait_s()
        if wait <= 0:
            if self._over_budget:
                logger.info("webhook worker's GitHub budget available again: deliveries resume")
            self._over_budget = False
            return False
        if not self._over_budget:
            hooks = self.settings.webhooks
            logger.warning(
                "webhook worker's GitHub budget is spent (%d calls an hour, burst %d): "
                "deliveries wait in the queue, polling covers their changes meanwhile",
                hooks.github_calls_per_hour,
                hooks.github_burst,
            )
        self._over_budget = True
        await asyncio.sleep(min(wait, IDLE_S))
        return True

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
        """Apply one queued delivery through its event's handler (HANDLERS); what it did."""
        head, _, body = envelope.partition("\n")
        meta = json.loads(head)
        payload = json.loads(body)
        d = Delivery(repo, rstore, meta["event"], str(payload.get("action") or ""), payload)
        said = ""
        if d.event in CHECK_EVENTS and self.checks is not None:
            # First: a new head resets the PR's checks before its review upkeep reads them.
            said = await self.checks.from_delivery(repo, d.event, payload)
        handler = HANDLERS.get(d.event)
        outcome = await handler(self, d) if handler is not None else "ignored"
        if said:
            outcome = f"{outcome}; {said}" if outcome else said
        logger.info(
            "webhook %s %s.%s on %s: %s",
            meta["delivery"],
            d.event,
            d.action,
            repo.full_name,
            outcome,
        )
        return outcome

    # --- the handlers, one per event (HANDLERS) ---------------------------------------------

    async def _on_issues(self, d: Delivery) -> str:
        outcome = await self._issue(d.repo, d.rstore, d.action, d.payload["issue"])
        if self._review_labelled(d.action, d.payload) and outcome == "upserted":
            outcome += "; " + await self._review_due(d.repo)
        await self._blocker_moved(d.rstore, d.action, d.payload["issue"])
        return outcome

    async def _on_issue_comment(self, d: Delivery) -> str:
        if "pull_request" in d.payload["issue"]:
            outcome = await self._review_upkeep(d.repo, d.payload)  # feedback on a PR
        else:
            # A comment's own action (deleted, ...) says nothing about the issue's life.
            outcome = await self._issue(d.repo, d.rstore, "commented", d.payload["issue"])
        if d.action == "created":
            outcome += "; " + await self.commands.from_delivery(d.repo, d.payload)
        return outcome

    async def _on_pull(self, d: Delivery) -> str:
        """A PR opened, updated or reviewed: its review upkeep now, and its task's progress."""
        outcome = await self._review_upkeep(d.repo, d.payload)
        return outcome + "; " + await self.progress.from_delivery(d.repo, d.event, d.payload)

    async def _on_push(self, d: Delivery) -> str:
        return await self.progress.from_delivery(d.repo, d.event, d.payload)

    async def _on_graph(self, d: Delivery) -> str:
        return await self.syncer.graph.from_delivery(d.repo.full_name, d.event, d.payload)

    async def _on_checks_alone(self, d: Delivery) -> str:
        return ""  # check runs, suites, statuses, workflow runs: the checks' pre-step alone

    async def _blocker_moved(self, rstore: RepoStore, action: str, data: dict[str, Any]) -> None:
        """The issue may block others (here or in another served repository): they learn its
        state now, not at the next poll (leader/graph.py)."""
        if action in GONE_ACTIONS:
            await self.syncer.graph.note_gone(rstore, [int(data["number"])])
        else:
            await self.syncer.graph.note_states(rstore, [data])

    async def _issue(
        self, repo: Repository, rstore: RepoStore, action: str, data: dict[str, Any]
    ) -> str:
        """Mirror one issue from the payload, unless the mirror already has a newer state."""
        n = int(data["number"])
        if action in GONE_ACTIONS:
            # The version first: a sync page landing between the two calls is refused by it.
            return await self._remove(rstore, n, GONE)
        cached = await rstore.get_issue(n)
        known = max(await rstore.issue_version(n) or "", cached.updated_at if cached else "")
        updated = str(data["updated_at"])
        if updated < known:
            return "stale"
        incoming = Issue.from_github(data)
        if incoming.parent is None:  # deliveries name no parent: the mirror's stands
            incoming = incoming.model_copy(update={"parent": cached.parent if cached else ""})
        if updated == known:
            if cached is not None and cached == incoming:
                return "unchanged"
            # Two changes within one second (GitHub's resolution) arrive in either order:
            # only GitHub can say which came last, so read that one issue.
            fresh = await asyncio.to_thread(self.gateway.issue, repo.full_name, n)
            if fresh is None:
                return await self._remove(rstore, n, GONE)
            data, updated = fresh, str(fresh["updated_at"])
            incoming = Issue.from_github(data)
        if data.get("state") != "open":
            # The version before the removal: sync_upsert.lua refuses a page older than it,
            # so a sync that read the issue open just before it closed cannot bring it back.
            return await self._remove(rstore, n, updated)
        base = await self.syncer.base_branch(repo, rstore, await rstore.sync_state())
        # Fenced like the sync, and a vanished lease label is checked the same way.
        await self.syncer.apply_issues(rstore, [incoming], base)
        await rstore.set_issue_version(n, updated, VERSION_TTL_S)
        return "upserted"

    async def _remove(self, rstore: RepoStore, n: int, version: str) -> str:
        """Issue `n` out of the mirror, its version (or GONE) set first."""
        await rstore.set_issue_version(n, version, VERSION_TTL_S)
        await rstore.remove_issues([n], epoch=self.syncer.epoch)
        return "removed"

    def _review_labelled(self, action: str, payload: dict[str, Any]) -> bool:
        label = payload.get("label") or {}
        return action == "labeled" and label.get("name") == self.settings.labels.needs_review

    async def _review_due(self, repo: Repository) -> str:
        """`needs-review` was just added: the review upkeep finds the issue's PR and arms its
        timer, so the review is offered when due (review.delay_s), not at the next poll.
        One listing of the open PRs (a conditional request); the PR's checks are read first
        when they may hold its review (leader/checks.py), as a check's delivery would."""
        report = await self.reviews.run(repo)
        if self.checks is not None:
            await self.checks.run(repo, webhooks_healthy=True)
        self.reviews.arm(repo, report)
        return f"review timer armed for {len(report.next_due)} issue(s)"

    async def _review_upkeep(self, repo: Repository, payload: dict[str, Any]) -> str:
        """Feedback on a PR: run the review upkeep for that one PR now, not at the next poll."""
        pull = payload.get("pull_request")
        if pull is None:  # issue_comment on a PR: the payload has the issue side only
            number = int(payload["issue"]["number"])
            pull = await asyncio.to_thread(self.gateway.pull, repo.full_name, number)
        if pull is None or pull.get("state") != "open":
            return "ignored (pull request not open)"
        report = await self.reviews.run(repo, pulls=[pull])
        self.reviews.arm(repo, report)
        return f"review upkeep: {report.reviews_offered} review(s), {report.fixes_offered} fix(es)"


@dataclass(frozen=True)
class Delivery:
    """One queued delivery, as its handler gets it."""

    repo: Repository
    rstore: RepoStore
    event: str
    action: str
    payload: dict[str, Any]


#: The handler of each event the receiver queues (webhooks/payloads.py `EVENTS`); the checks'
#: events also go through leader/checks.py first (`apply`).
HANDLERS: dict[str, Callable[[WebhookWorker, Delivery], Awaitable[str]]] = {
    "issues": WebhookWorker._on_issues,
    "issue_comment": WebhookWorker._on_issue_comment,
    "pull_request": WebhookWorker._on_pull,
    "pull_request_review": WebhookWorker._on_pull,
    "pull_request_review_comment": WebhookWorker._on_pull,
    "push": WebhookWorker._on_push,
    "check_run": WebhookWorker._on_checks_alone,
    "check_suite": WebhookWorker._on_checks_alone,
    "status": WebhookWorker._on_checks_alone,
    "workflow_run": WebhookWorker._on_checks_alone,
    **dict.fromkeys(GRAPH_EVENTS, WebhookWorker._on_graph),
}
