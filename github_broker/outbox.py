"""The GitHub write queue's drainer: applies queued label and branch writes, with retries."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from github_broker.errors import (
    Fenced,
    GitHubError,
    GitHubNotFound,
    GitHubUnavailable,
    RateLimited,
)
from github_broker.gateway import GitHubGateway
from github_broker.logs import log_fields
from github_broker.metrics import observe_write_lag
from github_broker.settings import Repository
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: Jobs taken from Redis at a time.
DRAIN_BATCH = 50
#: Seconds one drain may run before yielding to the next scheduled one.
DRAIN_BUDGET_S = 10.0
#: A taken job is hidden from other drainers this long (ms); longer than any GitHub call.
HIDE_MS = 60_000
#: Backoff of a failing job (and of the whole queue while GitHub is down):
#: BASE * 2^attempts seconds, capped, with jitter.
BACKOFF_BASE_S = 1.0
BACKOFF_MAX_S = 300.0
#: Attempts after which a job GitHub keeps refusing (4xx) is dropped and logged.
MAX_REFUSED_ATTEMPTS = 8


@dataclass
class DrainReport:
    applied: int = 0
    retried: int = 0
    dropped: int = 0
    paused_until_s: float = 0.0


def backoff_ms(attempts: int) -> int:
    delay = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempts)
    return int(delay * 1000 * random.uniform(0.8, 1.2))


class OutboxDrainer:
    """Applies each repository's queued writes; any number may run, they never collide."""

    def __init__(self, store: Store, gateway: GitHubGateway) -> None:
        self.store = store
        self.gateway = gateway
        self.paused_until_s = 0.0
        self._outages = 0  # consecutive drains cut short by an unavailable GitHub
        #: The leader epoch every take and settle carries (0: unfenced); set by the daemon.
        self.epoch = 0
        #: Asked right before each GitHub call: a leader that stalled and was replaced must
        #: not send a write the new leader may already have superseded.
        self.still_leader: Callable[[], Awaitable[bool]] | None = None
        #: repository -> jobs this drainer took and has not settled yet. A Redis error in
        #: the middle of a batch (a stall, a dropped connection) leaves them hidden for
        #: HIDE_MS; the next drain makes them due at once instead (drains never overlap, so
        #: none of them is in flight then).
        self._in_hand: dict[str, list[tuple[str, str, int]]] = {}

    async def drain(self, repo: Repository) -> DrainReport:
        """Apply due writes, batch after batch, until none is due or the time budget is spent."""
        report = DrainReport()
        started = time.monotonic()
        # The epoch this drain started under, for every take and settle of it. A take
        # without an epoch is neither fenced nor noted for the next leader: the daemon's
        # drainer (still_leader set) never drains without one (a drain that did, after the
        # lead was lost, hid its jobs from the new leader for HIDE_MS).
        epoch = self.epoch
        if epoch <= 0 and self.still_leader is not None:
            return report
        try:
            await self._release_in_hand(repo, epoch)
            while time.monotonic() - started < DRAIN_BUDGET_S:
                if time.time() < self.paused_until_s:
                    report.paused_until_s = self.paused_until_s
                    break
                taken = await self._drain_batch(repo, report, started + DRAIN_BUDGET_S, epoch)
                if taken < DRAIN_BATCH:
                    break
        except Fenced:
            # Deposed: the new leader retakes what this one held (outbox:taken).
            self._in_hand.pop(repo.full_name, None)
            raise
        return report

    async def _release_in_hand(self, repo: Repository, epoch: int) -> None:
        """Jobs a drain cut short by a Redis error left taken: due at once, nothing lost."""
        left = self._in_hand.get(repo.full_name)
        if left:
            rstore = self.store.repo(repo.full_name)
            await self._put_back(rstore, left, 0, epoch, hand=repo.full_name)
        self._in_hand.pop(repo.full_name, None)

    async def _put_back(
        self,
        rstore: RepoStore,
        jobs: list[tuple[str, str, int]],
        delay_ms: int,
        epoch: int,
        hand: str | None = None,
    ) -> None:
        """Make `jobs` due again in `delay_ms`; with `hand` (a repository), each job leaves
        that repository's jobs in hand once Redis took it back."""
        for index, (job, payload, _) in enumerate(jobs):
            await rstore.outbox_done(
                job, payload, retry_in_ms=delay_ms, attempted=False, epoch=epoch
            )
            if hand is not None:
                self._in_hand[hand] = jobs[index + 1 :]

    async def _drain_batch(
        self, repo: Repository, report: DrainReport, deadline: float, epoch: int
    ) -> int:
        rstore = self.store.repo(repo.full_name)
        due_ms = await rstore.outbox_due(DRAIN_BATCH)  # also spares an idle queue the script
        jobs = await rstore.outbox_take(DRAIN_BATCH, HIDE_MS, epoch=epoch) if due_ms else []
        name = repo.full_name
        for index, (job, payload, attempts) in enumerate(jobs):
            # Not settled yet: this job and the rest (a Redis error below leaves them here).
            self._in_hand[name] = jobs[index:]
            if time.monotonic() > deadline:
                # Out of time: the rest are due at once for the next drain, not failures.
                await self._put_back(rstore, jobs[index:], 0, epoch, hand=name)
                return 0
            wait_s = self.gateway.writes.wait_s()
            if wait_s > 0:
                # Paced (GitHub's secondary limit): wait for a write token while the budget
                # allows, else the rest are due at once for the next drain.
                if time.monotonic() + wait_s > deadline:
                    await self._put_back(rstore, jobs[index:], 0, epoch, hand=name)
                    return 0
                await asyncio.sleep(wait_s)
            if self.still_leader is not None and not await self.still_leader():
                # Deposed: the new leader retakes these jobs at once (outbox:taken).
                logger.warning("write queue of %s: not the leader any more", repo.full_name)
                self._in_hand.pop(name, None)
                return 0
            try:
                node_id = ""
                if job.startswith("labels:"):
                    issue = await rstore.get_issue(int(job.partition(":")[2]))
                    node_id = issue.node_id if issue else ""
                await asyncio.to_thread(self._apply, repo.full_name, job, payload, node_id)
            except (RateLimited, GitHubUnavailable) as e:
                # GitHub can't take writes now: every job still in hand waits, none is lost
                # or reordered, and no other job is tried until then.
                if isinstance(e, RateLimited):
                    self.paused_until_s = e.retry_at_s
                else:
                    self._outages += 1
                    self.paused_until_s = time.time() + backoff_ms(self._outages) / 1000
                delay_ms = max(0, int((self.paused_until_s - time.time()) * 1000))
                # Not the jobs' fault: none of them counts this toward being dropped.
                await self._put_back(rstore, jobs[index:], delay_ms, epoch, hand=name)
                report.paused_until_s = self.paused_until_s
                report.retried += len(jobs) - index
                logger.warning(
                    "GitHub writes for %s paused %.1fs: %s", repo.full_name, delay_ms / 1000, e
                )
                return 0
            except GitHubNotFound as e:
                logger.warning(
                    "dropping write %s on %s: %s", job, repo.full_name, e, extra=_fields(repo, job)
                )
                await rstore.outbox_done(job, payload, epoch=epoch)
                self._in_hand[name] = jobs[index + 1 :]
                await rstore.record_write("dropped", job, str(e))
                report.dropped += 1
            except GitHubError as e:
                if attempts + 1 >= MAX_REFUSED_ATTEMPTS:
                    logger.error(
                        "GitHub refused %s on %s %d times, dropping: %s",
                        job,
                        repo.full_name,
                        attempts + 1,
                        e,
                        extra=_fields(repo, job),
                    )
                    await rstore.outbox_done(job, payload, epoch=epoch)
                    self._in_hand[name] = jobs[index + 1 :]
                    await rstore.record_write("dropped", job, str(e))
                    report.dropped += 1
                else:
                    delay_ms = backoff_ms(attempts)
                    await rstore.outbox_done(job, payload, retry_in_ms=delay_ms, epoch=epoch)
                    self._in_hand[name] = jobs[index + 1 :]
                    await rstore.record_write("refused", job, str(e))
                    report.retried += 1
                    logger.warning(
                        "GitHub refused %s on %s (attempt %d), retry in %.0fs: %s",
                        job,
                        repo.full_name,
                        attempts + 1,
                        delay_ms / 1000,
                        e,
                        extra=_fields(repo, job),
                    )
            else:
                left_queue = await rstore.outbox_done(job, payload, epoch=epoch)
                self._in_hand[name] = jobs[index + 1 :]
                if left_queue:
                    await rstore.record_write("applied", job, _describe(job, payload))
                report.applied += 1
                if job in due_ms:
                    observe_write_lag(due_ms[job])
                self._outages = 0
        self._in_hand.pop(name, None)
        return len(jobs)

    def _apply(self, full_name: str, job: str, payload: str, node_id: str = "") -> None:
        kind, _, number = job.partition(":")
        data = json.loads(payload)
        if kind == "labels":
            # Lua's cjson writes an empty list as {}; both mean "nothing".
            add = list(data.get("add") or [])
            remove = list(data.get("remove") or [])
            self.gateway.change_labels(full_name, int(number), add, remove, node_id=node_id or None)
        elif kind == "branch":
            created = self.gateway.create_branch(full_name, data["branch"], data["base"])
            logger.info(
                "branch %s on %s %s",
                data["branch"],
                full_name,
                "created" if created else "already existed",
            )
        else:
            raise GitHubError(f"unknown write job {job!r}")


def _describe(job: str, payload: str) -> str:
    """A job's change in a few words, for the timeline."""
    data = json.loads(payload)
    if job.startswith("labels:"):
        add = " ".join(f"+{label}" for label in data.get("add") or [])
        remove = " ".join(f"-{label}" for label in data.get("remove") or [])
        return f"labels {add} {remove}".strip()
    return f"branch {data.get('branch', '')}"


def _fields(repo: Repository, job: str) -> dict[str, object]:
    """Log fields of a write job (`labels:12`, `branch:12`)."""
    number = job.partition(":")[2]
    return log_fields(repo.full_name, int(number) if number.isdigit() else None)
