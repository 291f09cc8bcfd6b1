"""The GitHub write queue's drainer: applies queued writes (`WRITE_KINDS`: labels, branches)
with retries, backoff and fencing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from github_broker.errors import (
    BrokerError,
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
#: Seconds between two looks at whether GitHub is back while writes wait out an outage: a
#: `GET /rate_limit` (free: it does not count against the quota), unless another call of the
#: process (a sync read) got an answer meanwhile. Queued writes follow within about this.
OUTAGE_PROBE_S = 2.0
#: Attempts after which a job GitHub keeps refusing (4xx) is dropped and logged.
MAX_REFUSED_ATTEMPTS = 8


@dataclass
class DrainReport:
    applied: int = 0
    retried: int = 0
    dropped: int = 0
    paused_until_s: float = 0.0


# --- the kinds of GitHub write ---------------------------------------------------------
# A job is `<kind>:<issue>`, queued by a Lua script in the same step as the change that
# wants it; docs/architecture.md "Adding a kind of GitHub write" lists every room a new
# kind touches, in order (intent, queue, this registry, gateway, simulator).


@dataclass(frozen=True)
class WriteKind:
    """How the drainer applies one kind of queued GitHub write."""

    #: The GitHub call, run in a worker thread: (gateway, repository, issue, payload, the
    #: issue's node id or ""). Idempotent: a write whose answer was lost is sent again.
    apply: Callable[[GitHubGateway, str, int, dict[str, Any], str], None]
    #: The change in a few words, for the timeline.
    describe: Callable[[dict[str, Any]], str]
    #: Read the issue's GraphQL node id from the mirror before the call (saves GitHub a read).
    needs_node_id: bool = False


def _apply_labels(
    gateway: GitHubGateway, full_name: str, number: int, data: dict[str, Any], node_id: str
) -> None:
    # Lua's cjson writes an empty list as {}; both mean "nothing".
    add = list(data.get("add") or [])
    remove = list(data.get("remove") or [])
    gateway.change_labels(full_name, number, add, remove, node_id=node_id or None)


def _describe_labels(data: dict[str, Any]) -> str:
    add = " ".join(f"+{label}" for label in data.get("add") or [])
    remove = " ".join(f"-{label}" for label in data.get("remove") or [])
    return f"labels {add} {remove}".strip()


def _apply_branch(
    gateway: GitHubGateway, full_name: str, number: int, data: dict[str, Any], node_id: str
) -> None:
    created = gateway.create_branch(full_name, data["branch"], data["base"])
    logger.info(
        "branch %s on %s %s",
        data["branch"],
        full_name,
        "created" if created else "already existed",
    )


def _describe_branch(data: dict[str, Any]) -> str:
    return f"branch {data.get('branch', '')}"


#: Every kind of write the queue holds, by the job's prefix: the drainer dispatches on it.
WRITE_KINDS: dict[str, WriteKind] = {
    # Payload: the issue's intent {add, remove, on, v} (outbox_take.lua reads it).
    "labels": WriteKind(_apply_labels, _describe_labels, needs_node_id=True),
    # Payload: outbox:data's {branch, base}, written by claim.lua.
    "branch": WriteKind(_apply_branch, _describe_branch),
}


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
        #: When the current outage began (time.time()), None when GitHub takes writes.
        self._outage_at: float | None = None
        self._probed_s = 0.0
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
                if time.time() < self.paused_until_s and not await self._github_back():
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

    def holds(self, repository: str) -> bool:
        """Whether this drainer took jobs of `repository` it has not settled yet."""
        return bool(self._in_hand.get(repository))

    async def _github_back(self) -> bool:
        """During an outage: whether GitHub answers again (any call of this process since the
        outage began, or a probe every OUTAGE_PROBE_S). If so the backoff ends at once, and
        the writes held by the outage (due already) go out in this drain."""
        if self._outage_at is None:
            return False
        back = self.gateway.last_answer_s > self._outage_at
        if not back and time.monotonic() - self._probed_s >= OUTAGE_PROBE_S:
            self._probed_s = time.monotonic()
            with contextlib.suppress(BrokerError):
                await asyncio.to_thread(self.gateway.ping)
            back = self.gateway.last_answer_s > self._outage_at
        if back:
            logger.info("GitHub answers again: queued writes resume")
            self._outages, self.paused_until_s, self._outage_at = 0, 0.0, None
        return back

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
        batch = _Batch(repo, rstore, jobs, due_ms, epoch, report)
        for index, (job, payload, _) in enumerate(jobs):
            # Not settled yet: this job and the rest (a Redis error below leaves them here).
            self._in_hand[repo.full_name] = jobs[index:]
            if not await self._may_send(batch, index, deadline):
                return 0
            try:
                await self._send(rstore, repo.full_name, job, payload)
            except (RateLimited, GitHubUnavailable) as e:
                await self._hold(batch, index, e)
                return 0
            except GitHubError as e:
                await self._refused(batch, index, e)
            else:
                await self._applied(batch, index)
        self._in_hand.pop(repo.full_name, None)
        return len(jobs)

    async def _may_send(self, batch: _Batch, index: int, deadline: float) -> bool:
        """Whether job `index` may go to GitHub now: within the drain's time budget, a write
        token (paced), still the leader. If not, the rest wait for the next drain."""
        name, rest = batch.repo.full_name, batch.jobs[index:]
        if time.monotonic() > deadline:
            # Out of time: the rest are due at once for the next drain, not failures.
            await self._put_back(batch.rstore, rest, 0, batch.epoch, hand=name)
            return False
        wait_s = self.gateway.writes.wait_s()
        if wait_s > 0:
            # Paced (GitHub's secondary limit): wait for a write token while the budget
            # allows, else the rest are due at once for the next drain.
            if time.monotonic() + wait_s > deadline:
                await self._put_back(batch.rstore, rest, 0, batch.epoch, hand=name)
                return False
            await asyncio.sleep(wait_s)
        if self.still_leader is not None and not await self.still_leader():
            # Deposed: the new leader retakes these jobs at once (outbox:taken).
            logger.warning("write queue of %s: not the leader any more", name)
            self._in_hand.pop(name, None)
            return False
        return True

    async def _send(self, rstore: RepoStore, full_name: str, job: str, payload: str) -> None:
        """One job to GitHub, in a worker thread; what its kind reads first from the mirror
        (an issue's node id) is read here, on the event loop."""
        node_id = ""
        kind = WRITE_KINDS.get(job.partition(":")[0])
        if kind is not None and kind.needs_node_id:
            issue = await rstore.get_issue(int(job.partition(":")[2]))
            node_id = issue.node_id if issue else ""
        await asyncio.to_thread(self._apply, full_name, job, payload, node_id)

    async def _hold(self, batch: _Batch, index: int, e: RateLimited | GitHubUnavailable) -> None:
        """GitHub can't take writes now: every job still in hand waits, none is lost or
        reordered, and no other job is tried until then."""
        if isinstance(e, RateLimited):
            self.paused_until_s = e.retry_at_s
            delay_ms = max(0, int((self.paused_until_s - time.time()) * 1000))
        else:
            self._outages += 1
            self._outage_at = time.time()
            self.paused_until_s = self._outage_at + backoff_ms(self._outages) / 1000
            # Due at once in Redis: this drainer's pause holds them, and ends the moment
            # GitHub answers again (_github_back); a new leader tries them at once.
            delay_ms = 0
        # Not the jobs' fault: none of them counts this toward being dropped.
        rest = batch.jobs[index:]
        await self._put_back(batch.rstore, rest, delay_ms, batch.epoch, hand=batch.repo.full_name)
        batch.report.paused_until_s = self.paused_until_s
        batch.report.retried += len(rest)
        logger.warning(
            "GitHub writes for %s paused up to %.1fs: %s",
            batch.repo.full_name,
            self.paused_until_s - time.time(),
            e,
        )

    async def _refused(self, batch: _Batch, index: int, e: GitHubError) -> None:
        """Gone (404, 410): dropped. Refused: retried with backoff, dropped after
        MAX_REFUSED_ATTEMPTS."""
        job, _, attempts = batch.jobs[index]
        repo, rstore = batch.repo, batch.rstore
        if isinstance(e, GitHubNotFound):
            logger.warning(
                "dropping write %s on %s: %s", job, repo.full_name, e, extra=_fields(repo, job)
            )
        elif attempts + 1 >= MAX_REFUSED_ATTEMPTS:
            logger.error(
                "GitHub refused %s on %s %d times, dropping: %s",
                job,
                repo.full_name,
                attempts + 1,
                e,
                extra=_fields(repo, job),
            )
        else:
            delay_ms = backoff_ms(attempts)
            await self._settle(batch, index, retry_in_ms=delay_ms)
            await rstore.record_write("refused", job, str(e))
            batch.report.retried += 1
            logger.warning(
                "GitHub refused %s on %s (attempt %d), retry in %.0fs: %s",
                job,
                repo.full_name,
                attempts + 1,
                delay_ms / 1000,
                e,
                extra=_fields(repo, job),
            )
            return
        await self._settle(batch, index)
        await rstore.record_write("dropped", job, str(e))
        batch.report.dropped += 1

    async def _applied(self, batch: _Batch, index: int) -> None:
        job, payload, _ = batch.jobs[index]
        if await self._settle(batch, index):
            await batch.rstore.record_write("applied", job, _describe(job, payload))
        batch.report.applied += 1
        if job in batch.due_ms:
            observe_write_lag(batch.due_ms[job])
        self._outages = 0

    async def _settle(self, batch: _Batch, index: int, retry_in_ms: int = -1) -> bool:
        """Settle job `index` in Redis (done, or due again in `retry_in_ms`); only the jobs
        after it are in hand then. True when the job left the queue."""
        job, payload, _ = batch.jobs[index]
        left_queue = await batch.rstore.outbox_done(
            job, payload, retry_in_ms=retry_in_ms, epoch=batch.epoch
        )
        self._in_hand[batch.repo.full_name] = batch.jobs[index + 1 :]
        return left_queue

    def _apply(self, full_name: str, job: str, payload: str, node_id: str = "") -> None:
        kind, _, number = job.partition(":")
        write = WRITE_KINDS.get(kind)
        if write is None:
            raise GitHubError(f"unknown write job {job!r}")
        write.apply(self.gateway, full_name, int(number), json.loads(payload), node_id)


@dataclass
class _Batch:
    """The jobs one drain took from one repository, settled one after another."""

    repo: Repository
    rstore: RepoStore
    #: (job, payload, refused attempts so far), in the order taken.
    jobs: list[tuple[str, str, int]]
    #: job -> since when it was due (ms), for the write lag.
    due_ms: dict[str, int]
    epoch: int
    report: DrainReport


def _describe(job: str, payload: str) -> str:
    """A job's change in a few words, for the timeline."""
    return WRITE_KINDS[job.partition(":")[0]].describe(json.loads(payload))


def _fields(repo: Repository, job: str) -> dict[str, object]:
    """Log fields of a write job (`labels:12`, `branch:12`)."""
    number = job.partition(":")[2]
    return log_fields(repo.full_name, int(number) if number.isdigit() else None)
