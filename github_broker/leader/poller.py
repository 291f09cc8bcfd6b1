"""The polling daemon: one leader at a time runs sync, the write queue and lease reaping,
the review upkeep and the tracked PRs' checks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import partial
from typing import Any

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from github_broker.clock import now_ms
from github_broker.errors import BrokerError, Fenced, GitHubError, RateLimited
from github_broker.gateway import GitHubGateway
from github_broker.leader.audit_file import AuditFile
from github_broker.leader.checks import CheckKeeper
from github_broker.leader.deliveries import WebhookWorker
from github_broker.leader.outbox import OutboxDrainer
from github_broker.leader.progress import ProgressKeeper
from github_broker.leader.reviews import ReviewKeeper
from github_broker.leader.sync import Syncer
from github_broker.logs import log_fields
from github_broker.people.watched import WatchedFile
from github_broker.reports.health import failure_kind
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store
from github_broker.store.history import MINUTE_MS

logger = logging.getLogger(__name__)

#: Seconds between two sweeps for expired leases (claims also reap lazily).
REAP_INTERVAL_S = 5.0
#: Repositories whose sync pass runs at the same time.
SYNC_CONCURRENCY = 4
#: Seconds a repository rebuilt after a loss waits beyond one heartbeat interval before it
#: hands out work again (agents heartbeat on their own clocks).
#: Seconds between two appends of new audit entries to `audit.file`.
AUDIT_EXPORT_INTERVAL_S = 5.0
#: Seconds between two samples of the queues for the history (one per minute), and
#: between two folds of its finished minutes into hours and totals.
HISTORY_SAMPLE_INTERVAL_S = 60.0
#: Longest pause after repeated failed sync passes.
MAX_SYNC_BACKOFF_S = 900.0


def node_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Daemon:
    """Periodic upkeep. Every job is a plain coroutine, also callable from tests and the CLI."""

    def __init__(self, settings: Settings, store: Store, gateway: GitHubGateway) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.syncer = Syncer(settings, store, gateway)
        self.drainer = OutboxDrainer(store, gateway)
        self.reviews = ReviewKeeper(settings, store, gateway, self.syncer.reindex)
        self.progress = ProgressKeeper(settings, store, gateway)
        self.checks = CheckKeeper(settings, store, gateway, self._review_now)
        self.audit_file = (
            AuditFile(settings.audit.file, store) if settings.audit.file is not None else None
        )
        self.webhooks = WebhookWorker(
            settings, store, gateway, self.syncer, self.reviews, self.progress, self.checks
        )
        self._synced_at: dict[str, float] = {}
        self.id = node_id()
        self.is_leader = False
        #: This process's leader epoch while it leads (see leader.lua); 0 otherwise.
        self.epoch = 0
        self.drainer.still_leader = self.still_leader
        self.reviews.leading = lambda: self.is_leader
        self._failures: dict[str, int] = {}
        self._not_before: dict[str, float] = {}
        self._last_error: dict[str, BrokerError] = {}
        #: Repositories this process marked sync:failing (cleared after a good pass).
        self._marked_failing: set[str] = set()
        #: Agents with a token in `server.agent_tokens_file`: one removed there loses its lease.
        self._tokens = (
            WatchedFile(
                settings.server.agent_tokens_file,
                lambda: frozenset(settings.server.resolved_agent_tokens().values()),
                "agent tokens file",
            )
            if settings.server.agent_tokens_file is not None
            else None
        )
        #: The deployment's decisions as the last drain read them (store `decisions`).
        self._decisions: dict[str, dict[str, str]] | None = None
        self._quota_published_s = 0.0
        #: The redis-server whose data this process last checked, and the mark it wrote per
        #: repository then (see _forget_stale_data).
        self._server_id: str | None = None
        self._marks: dict[str, str] = {}
        # A loss-triggered rebuild and the scheduled pass must not run two syncs at once.
        self._sync_lock = asyncio.Lock()
        #: Repositories whose mirror this process has seen built: only theirs can be lost (a
        #: fresh start's first pass is a build, not a rebuild).
        self.scheduler: AsyncIOScheduler | None = None

    # --- jobs ---------------------------------------------------------------------------

    async def hold_leadership(self) -> bool:
        ttl_ms = int(self.settings.poll.leader_ttl_s * 1000)
        was = self.is_leader
        try:
            epoch = await self.store.leader(self.id, ttl_ms)
        except BrokerError as e:
            logger.warning("leader lease unavailable: %s", e)
            self._set_epoch(0)
            return False
        self._set_epoch(epoch)
        if not self.is_leader:
            await self._keep_decisions()
        if self.is_leader != was:
            logger.info(
                "%s leader (%s, epoch %d)", "became" if self.is_leader else "lost", self.id, epoch
            )
            with contextlib.suppress(BrokerError):
                kind = "leader_gained" if self.is_leader else "leader_lost"
                await self.store.record_event(kind, None, "", f"{self.id} epoch {epoch}")
        if self.is_leader and not was:
            # Raise every repository's fence now, before a deposed leader can write again.
            await self.reap_all()
        return self.is_leader

    def _set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.is_leader = epoch > 0
        if epoch > 0:
            # Losing the lead leaves the last epoch with the syncer and the drainer: a pass
            # still under way goes on fenced (refused once a newer leader raised the fence).
            # Epoch 0 means unfenced (a one-off CLI sync): a sync page or a take written with
            # it after the lead was lost would land whoever leads now.
            self.syncer.epoch = epoch
            self.drainer.epoch = epoch
            self.progress.epoch = epoch

    def _deposed(self, e: Fenced) -> None:
        logger.warning("%s is not the leader any more, its write was refused: %s", self.id, e)
        self._set_epoch(0)

    async def still_leader(self) -> bool:
        """Whether the leader lease is still ours (read right before each GitHub write)."""
        return self.is_leader and await self.store.leader_id() == self.id

    async def sync_all(self) -> None:
        if not self.is_leader:
            return
        async with self._sync_lock:
            await self._sync_all()

    async def rebuild_if_lost(self) -> None:
        """Redis lost its data (the mirror marker is gone): sync now, not at the next
        interval, since agents are told to retry until the mirror is rebuilt."""
        if not self.is_leader or self._sync_lock.locked():
            return
        async with self._sync_lock:
            await self._forget_stale_data()
        try:
            built = await self.store.mirrors_built(
                [r.full_name for r in self.settings.repositories]
            )
        except BrokerError:
            return
        lost = []
        for repo in self.settings.repositories:
            if time.time() < self._not_before.get(repo.full_name, 0.0):
                continue  # its sync is backing off: retried when the backoff ends, not now
            if repo.full_name not in built:
                lost.append(repo)
            else:
                self.syncer.seen_complete.add(repo.full_name)
        if not lost:
            with contextlib.suppress(BrokerError):
                # What to write back if Redis loses its data (_restore_decisions): read at
                # every drain, so a loss forgets at most one drain interval of decisions.
                self._decisions = await self.store.decisions()
            return
        async with self._sync_lock:
            # Only the lost ones: a repository whose sync keeps failing must not make the
            # others sync on every drain pass.
            for repo in lost:
                try:
                    if await self.store.repo(repo.full_name).mirror_rebuilt():
                        continue  # the scheduled pass built it while this one waited
                except BrokerError:
                    return
                if repo.full_name in self.syncer.seen_complete:
                    # _sync writes the decisions back first.
                    logger.warning("the mirror of %s is gone: rebuilding it now", repo.full_name)
                else:
                    # A first start on empty Redis (or this process's first look at it).
                    logger.info("building the mirror of %s", repo.full_name)
                await self._sync_repo(repo)

    async def _sync_all(self) -> None:
        await self._forget_stale_data()
        # Several repositories at once (GitHub's calls wait in worker threads), a bounded
        # number: hundreds of repositories pass in a fraction of the time one by one takes.
        room = asyncio.Semaphore(SYNC_CONCURRENCY)

        async def one(repo: Repository) -> None:
            async with room:
                await self._upkeep_repo(repo)

        await asyncio.gather(*(one(repo) for repo in self.settings.repositories))
        await self._publish_quota()

    async def _upkeep_repo(self, repo: Repository) -> None:
        """One repository's pass: its sync when due, comment commands, review upkeep; each
        fails on its own (a PR endpoint the token cannot read must not stop the sync)."""
        name = repo.full_name
        if await self._sync_due(repo):
            await self._sync_repo(repo)
            # `/broker` comments the webhooks did not bring (or all, without webhooks).
            commands = partial(self.webhooks.commands.scan, repo)
            await self._guarded(f"commands:{name}", f"comment commands of {name}", commands)
        # Checks first: the review upkeep right after offers the reviews they let through.
        await self._guarded(f"checks:{name}", f"checks of {name}", partial(self._checks, repo))
        await self._guarded(
            f"reviews:{name}", f"review upkeep of {name}", partial(self._reviews, repo)
        )

    async def _reviews(self, repo: Repository) -> None:
        self.reviews.arm(repo, await self.reviews.run(repo))

    async def _checks(self, repo: Repository) -> None:
        """The tracked PRs' CI: read on every pass unless webhooks are healthy."""
        healthy = False
        if self.webhooks.configured:
            with contextlib.suppress(BrokerError):
                healthy = await self.webhooks.healthy(repo)
        await self.checks.run(repo, webhooks_healthy=healthy)

    async def _review_now(self, repo: Repository, numbers: list[int]) -> None:
        """Issues whose PR turned green: their review upkeep now (the review is due or not)."""
        self.reviews.arm(repo, await self.reviews.run_issues(repo, numbers))

    async def _forget_stale_data(self) -> None:
        """Redis restarted with data (loaded from its persistence file) or failed over to a
        replica: that data may be older than GitHub (leases ended since look live, label
        writes applied since are queued again), so each repository's is dropped and the
        mirror rebuilt from GitHub, as after a total loss (`redis.rebuild_after_restart`).
        Kept when it holds the mark this process wrote at its last check (a graceful
        restart's save under a running leader). Run before a sync or a drain touches the
        data: one INFO call, and one mark written per repository."""
        if not self.settings.redis.rebuilds_after_restart:
            return
        try:
            run_id = await self.store.server_id()
            if run_id is None:
                return
            names = [repo.full_name for repo in self.settings.repositories]
            marks = {name: f"{self.id}:{time.time_ns()}" for name in names}
            # Data that another server holds, without this process's last mark, is dropped
            # by `check_server` itself; the others' records are written in one pipeline.
            # Still on the server this process last checked, every record names it (or is
            # gone with the data): none to read.
            moved: set[str] = set()
            if run_id != self._server_id:
                recorded = await self.store.recorded_servers(names)
                moved = {n for n in names if (recorded[n] or (run_id,))[0] != run_id}
            for name in moved:
                if await self.store.repo(name).check_server(
                    run_id, marks[name], self._marks.get(name)
                ):
                    logger.warning(
                        "Redis restarted with earlier data (a persistence file, a replica): "
                        "the mirror of %s may be older than GitHub; dropped, rebuilding it "
                        "from GitHub",
                        name,
                    )
                elif self._server_id not in (None, run_id):
                    logger.info("Redis restarted with the data of %s up to date: kept", name)
            await self.store.record_servers(run_id, {n: marks[n] for n in names if n not in moved})
            self._marks.update(marks)
            self._server_id = run_id
        except BrokerError as e:
            logger.warning("could not check which Redis server holds the data: %s", e)

    async def _server_changed(self) -> bool:
        """Whether Redis restarted (or failed over) since _forget_stale_data last checked."""
        if not self.settings.redis.rebuilds_after_restart or self._server_id is None:
            return False
        try:
            return await self.store.server_id() not in (None, self._server_id)
        except BrokerError:
            return False  # the drain meets the same error and says so

    async def _sync_repo(self, repo: Repository) -> None:
        """One guarded sync pass; records in Redis whether the repository's sync keeps
        failing (sync:failing), so that with several repositories claims in the others do
        not wait on its mirror (claim/service.py)."""
        name = repo.full_name
        await self._guarded(name, f"sync {name}", partial(self._sync, repo))
        failures = self._failures.get(name, 0)
        error = self._last_error.get(name)
        with contextlib.suppress(BrokerError):
            rstore = self.store.repo(name)
            if failures == 0 and name in self._marked_failing:
                await rstore.mark_sync_failing(None, 0)
                self._marked_failing.discard(name)
            elif error is not None and (failures >= 2 or isinstance(error, GitHubError)):
                # Kept past the backoff, so it does not lapse between two failed passes.
                ttl = self._not_before.get(name, time.time()) - time.time()
                await rstore.mark_sync_failing(
                    str(error), ttl + 2 * self.settings.poll.interval_s, failure_kind(error)
                )
                self._marked_failing.add(name)

    async def _sync(self, repo: Repository) -> None:
        if (
            repo.full_name in self.syncer.seen_complete
            and not await self.store.repo(repo.full_name).mirror_rebuilt()
        ):
            # Every pass that rebuilds a lost mirror (the drain's, the scheduled one, a
            # webhook's) writes the decisions back before its rebuild hands anything out.
            await self._restore_decisions()
        report = await self.syncer.sync(repo)
        if report.held_back_s:
            logger.warning(
                "%s rebuilt after Redis lost its data: no new hand-outs for %.0fs while agents "
                "prove their leases with their signed tokens",
                repo.full_name,
                report.held_back_s,
            )
        # When the mirror was last known current: the dashboard's and `status`'s "last sync".
        # Recorded here, not by the syncer, whose unchanged passes write nothing.
        await self.store.repo(repo.full_name).save_sync_state({"synced_at": str(time.time())})

    async def _sync_due(self, repo: Repository) -> bool:
        """While webhooks are healthy the sync is only the safety net: it runs every
        poll.interval_with_webhooks_s instead of every poll.interval_s (full passes keep
        their own interval)."""
        if not self.webhooks.configured:
            return True
        last = self._synced_at.get(repo.full_name)
        now = time.monotonic()
        if last is not None and now - last < self.settings.poll.interval_with_webhooks_s:
            with contextlib.suppress(BrokerError):
                if await self.webhooks.healthy(repo) and not await self.webhooks.full_due(repo):
                    return False
        self._synced_at[repo.full_name] = now
        return True

    async def _guarded(self, key: str, what: str, job: Callable[[], Awaitable[object]]) -> None:
        """Run `job` unless it is backing off; a failure logs and backs off, never raises."""
        if time.time() < self._not_before.get(key, 0.0):
            return
        try:
            await job()
            self._failures[key] = 0
            self._last_error.pop(key, None)
        except Fenced as e:
            self._deposed(e)
        except RateLimited as e:
            self._not_before[key] = e.retry_at_s
            logger.warning("%s paused until %s: %s", what, _clock(e.retry_at_s), e)
        except BrokerError as e:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
            self._last_error[key] = e
            delay = min(MAX_SYNC_BACKOFF_S, self.settings.poll.interval_s * 2 ** (failures - 1))
            self._not_before[key] = time.time() + delay
            logger.warning(
                "%s failed (%d in a row), next try in %.0fs: %s", what, failures, delay, e
            )

    async def drain_all(self) -> None:
        if not self.is_leader:
            return
        await self.rebuild_if_lost()
        if await self._server_changed():
            return  # a sync holds the data: it checks it first, and no write leaves before
        try:
            due = await self.store.writes_due([r.full_name for r in self.settings.repositories])
        except BrokerError as e:
            logger.warning("write queues not read: %s", e)
            return
        for repo in self.settings.repositories:
            if repo.full_name not in due and not self.drainer.holds(repo.full_name):
                continue  # nothing due, nothing taken: its drain would do nothing
            try:
                await self.drainer.drain(repo)
            except Fenced as e:
                self._deposed(e)
                return
            except BrokerError as e:
                logger.warning("write queue of %s not drained: %s", repo.full_name, e)
        await self._publish_quota()

    async def _publish_quota(self) -> None:
        """Share the last rate-limit headers seen, for /status and /metrics of every process."""
        quota = self.gateway.quota
        if quota.seen_s > self._quota_published_s:
            with contextlib.suppress(BrokerError):
                await self.store.save_quota(quota)
                self._quota_published_s = quota.seen_s

    async def _keep_decisions(self) -> None:
        """A process that does not lead keeps what a leader needs after a loss, at each
        leadership check: which mirrors it has seen built (a rebuild of those is a loss:
        hold-back and decisions written back) and its own copy of the decisions, read only
        while the data is whole (the first repository's mirror stands). So whichever process
        leads after a loss rebuilds as the old leader would have."""
        names = [r.full_name for r in self.settings.repositories]
        unseen = [n for n in names if n not in self.syncer.seen_complete]
        with contextlib.suppress(BrokerError):
            if unseen:  # one round trip, and none once every mirror was seen built
                self.syncer.seen_complete.update(await self.store.mirrors_built(unseen))
            if names and await self.store.mirrors_built(names[:1]):
                self._decisions = await self.store.decisions()

    async def _restore_decisions(self) -> None:
        """Redis lost its data: the deployment's decisions this leader last read (paused and
        stopped agents, a broker pause) are written back, where nothing newer stands, before
        anything is handed out again (the rebuild's hold-back covers the rest)."""
        if self._decisions is None:
            return
        with contextlib.suppress(BrokerError):
            restored = await self.store.restore_decisions(self._decisions)
            if restored:
                logger.warning(
                    "Redis lost its data: %d maintainers' and breaker decisions written back "
                    "(paused agents, a broker pause)",
                    restored,
                )

    async def _revoke_untokened(self) -> None:
        """An agent whose token was removed from the agent tokens file is refused from then
        on (api/auth.py); its live leases end now too (revoked by the broker, the reason
        told to whoever still holds its token), not at their TTL."""
        if self._tokens is None:
            return
        before = self._tokens.value
        removed = before - self._tokens.current()
        for agent in sorted(removed):
            for rstore in self.store.repos.values():
                with contextlib.suppress(BrokerError):
                    n = await rstore.current_task(agent)
                    if n is not None:
                        done = await rstore.control(
                            "revoke", "broker", str(n), f"{agent}'s token was removed", ""
                        )
                        logger.warning(
                            "%s#%d: %s (its token was removed)", rstore.repository, n, done.outcome
                        )

    async def reap_all(self) -> None:
        epoch = self.epoch  # kept for the whole sweep, as the syncer and drainer keep theirs
        if not self.is_leader:
            return
        await self._revoke_untokened()
        for rstore in self.store.repos.values():
            try:
                expired, trips, revived = await rstore.sweep(epoch=epoch)
                if trips:
                    await self._spread_trips(rstore.repository, trips)
                for number in revived:
                    await self._revive(rstore, number)
            except Fenced as e:
                self._deposed(e)
                return
            except BrokerError as e:
                logger.warning("lease sweep of %s failed: %s", rstore.repository, e)
                continue
            if expired:
                logger.info(
                    "%d expired lease(s) of %s back in the pool",
                    expired,
                    rstore.repository,
                    extra=log_fields(rstore.repository),
                )

    async def progress_all(self) -> None:
        """Held tasks: progress from GitHub when webhooks are not healthy (one request for
        every repository), stalls, budgets."""
        if not self.is_leader:
            return
        repos = self.settings.repositories
        polled = {repo.full_name for repo in repos}
        if self.webhooks.configured:
            for repo in repos:
                with contextlib.suppress(BrokerError):
                    if await self.webhooks.healthy(repo):
                        polled.discard(repo.full_name)
        await self._guarded(
            "progress",
            "progress of held tasks",
            partial(self.progress.check_all, repos, polled),
        )

    async def sample_history(self, at_ms: int | None = None) -> None:
        """Once a minute: every repository's queue by priority and its work waiting on a
        person, into its history (the dashboard's queue chart)."""
        if not self.is_leader:
            return
        at_ms = now_ms() if at_ms is None else at_ms
        try:
            if not await self.store.samples.claim_minute(at_ms // MINUTE_MS):
                return
            for rstore in self.store.repos.values():
                ready, waiting = await rstore.queue_sample()
                await rstore.record_sample(at_ms, ready, waiting)
        except BrokerError as e:
            logger.warning("history sample not taken: %s", e)

    async def fold_history(self) -> None:
        """Each minute: every repository's finished history minutes folded into their hours
        and the totals, once (store/history.py; a pass that fails is redone by the next)."""
        if not self.is_leader:
            return
        for rstore in self.store.repos.values():
            try:
                await rstore.fold_history()
            except BrokerError as e:
                logger.warning("history of %s not folded: %s", rstore.repository, e)

    async def export_audit(self) -> None:
        """Append new audit entries to `audit.file` (the leader only)."""
        if not self.is_leader or self.audit_file is None:
            return
        try:
            await self.audit_file.append_new()
        except (BrokerError, OSError) as e:
            logger.warning("audit file %s not written: %s", self.audit_file.path, e)

    async def _revive(self, rstore: RepoStore, number: int) -> None:
        """An issue given up on a convicted agent's failure is back: its tasks, dropped when
        it was given up, are indexed again as GitHub will show it (needs-human removed)."""
        issue = await rstore.get_issue(number)
        if issue is None:
            return
        labels = [lab for lab in issue.labels if lab != self.settings.labels.needs_human]
        await self.syncer.reindex(rstore, issue.model_copy(update={"labels": labels}))
        logger.info(
            "%s#%d revived: a failure charged to it came from an agent the circuit breaker "
            "convicted",
            rstore.repository,
            number,
            extra=log_fields(rstore.repository, number),
        )

    async def _spread_trips(self, repository: str, agents: list[str]) -> None:
        """The circuit breaker paused these agents in one repository: every repository."""
        for agent in await self.store.spread_trips(repository, agents):
            logger.warning(
                "circuit breaker: agent %s paused after repeated failures in %s; a maintainer "
                "resumes it with `github-broker resume %s`",
                agent,
                repository,
                agent,
                extra=log_fields(repository, None, agent),
            )

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Schedule the jobs on the running event loop."""
        poll = self.settings.poll
        scheduler = AsyncIOScheduler()
        now = datetime.now().astimezone()
        jobs = [
            (self.hold_leadership, poll.leader_ttl_s / 3),
            (self.sync_all, poll.interval_s),
            (self.drain_all, poll.outbox_interval_s),
            (self.reap_all, REAP_INTERVAL_S),
            (self.progress_all, self.settings.progress.check_interval_s),
            (self.export_audit, AUDIT_EXPORT_INTERVAL_S),
            (self.sample_history, HISTORY_SAMPLE_INTERVAL_S),
            (self.fold_history, HISTORY_SAMPLE_INTERVAL_S),
        ]
        for func, seconds in jobs:
            # A slow pass is never overlapped by the next one: the job skips a tick while its
            # previous pass runs (`_job`). APScheduler's own max_instances=1 would do the same
            # but log a warning on every such tick (every second for the write queue while a
            # sync of many repositories holds it up); 2 leaves the skipping to us.
            scheduler.add_job(
                self._job(func),
                "interval",
                seconds=seconds,
                max_instances=2,
                coalesce=True,
                next_run_time=now,
                misfire_grace_time=None,
            )
        scheduler.start()
        self.scheduler = scheduler
        self.webhooks.start(lambda: self.is_leader)

    def _job(self, func: Callable[[], Awaitable[object]]) -> Callable[[], Any]:
        """`func` as a job: a tick that comes while the previous pass still runs does nothing,
        and a pass cancelled because the process stops ends quietly instead of as an error
        traceback (the next leader's pass redoes its work)."""
        running = False

        async def job() -> None:
            nonlocal running
            if running:
                return
            running = True
            try:
                await func()
            except asyncio.CancelledError:
                if self.scheduler is not None:
                    raise
            finally:
                running = False

        return job

    async def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=False)
            self.scheduler = None
        # After the scheduler: awaiting first would let it start a job that exit then cancels.
        await self.webhooks.stop()
        self.reviews.stop()
        self.checks.stop()
        if self.is_leader:
            with contextlib.suppress(BrokerError):
                await self.store.leader(self.id, 0, release=True)
            self._set_epoch(0)

    async def run_forever(self) -> None:
        """`github-broker poll`: run until SIGINT or SIGTERM."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.hold_leadership()
        self.start()
        logger.info("poller %s running; leader=%s", self.id, self.is_leader)
        try:
            await stop.wait()
        finally:
            await self.stop()
            logger.info("poller %s stopped", self.id)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).astimezone().strftime("%H:%M:%S")
