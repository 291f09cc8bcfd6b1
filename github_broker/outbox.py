"""The GitHub write queue's drainer: applies queued label and branch writes, with retries."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

from github_broker.errors import GitHubError, GitHubNotFound, GitHubUnavailable, RateLimited
from github_broker.gateway import GitHubGateway
from github_broker.settings import Repository
from github_broker.store import Store

logger = logging.getLogger(__name__)

#: Jobs one drain takes at most; the rest wait for the next drain.
DRAIN_BATCH = 50
#: A taken job is hidden from other drainers this long (ms); longer than any GitHub call.
HIDE_MS = 60_000
#: Backoff of a failing job: BASE * 2^attempts seconds, capped, with jitter.
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

    async def drain(self, repo: Repository) -> DrainReport:
        report = DrainReport()
        if time.time() < self.paused_until_s:
            report.paused_until_s = self.paused_until_s
            return report
        rstore = self.store.repo(repo.full_name)
        jobs = await rstore.outbox_take(DRAIN_BATCH, HIDE_MS)
        for index, (job, payload, attempts) in enumerate(jobs):
            try:
                await asyncio.to_thread(self._apply, repo.full_name, job, payload)
            except RateLimited as e:
                # Every job still in hand waits for the quota; none is lost or reordered.
                self.paused_until_s = e.retry_at_s
                report.paused_until_s = e.retry_at_s
                delay = max(0, int((e.retry_at_s - time.time()) * 1000))
                for later, later_payload, _ in jobs[index:]:
                    await rstore.outbox_done(later, later_payload, retry_in_ms=delay)
                logger.warning("GitHub rate limit; writes paused for %.0fs: %s", delay / 1000, e)
                report.retried += len(jobs) - index
                break
            except GitHubNotFound as e:
                logger.warning("dropping write %s on %s: %s", job, repo.full_name, e)
                await rstore.outbox_done(job, payload)
                report.dropped += 1
            except GitHubUnavailable as e:
                await rstore.outbox_done(job, payload, retry_in_ms=backoff_ms(attempts))
                logger.info("GitHub unavailable for %s on %s, retrying: %s", job, repo.full_name, e)
                report.retried += 1
            except GitHubError as e:
                if attempts + 1 >= MAX_REFUSED_ATTEMPTS:
                    logger.error(
                        "GitHub refused %s on %s %d times, dropping: %s",
                        job,
                        repo.full_name,
                        attempts + 1,
                        e,
                    )
                    await rstore.outbox_done(job, payload)
                    report.dropped += 1
                else:
                    await rstore.outbox_done(job, payload, retry_in_ms=backoff_ms(attempts))
                    report.retried += 1
            else:
                await rstore.outbox_done(job, payload)
                report.applied += 1
        return report

    def _apply(self, full_name: str, job: str, payload: str) -> None:
        kind, _, number = job.partition(":")
        data = json.loads(payload)
        if kind == "labels":
            # Lua's cjson writes an empty list as {}; both mean "nothing".
            add = list(data.get("add") or [])
            remove = list(data.get("remove") or [])
            self.gateway.add_labels(full_name, int(number), add)
            for label in remove:
                self.gateway.remove_label(full_name, int(number), label)
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
