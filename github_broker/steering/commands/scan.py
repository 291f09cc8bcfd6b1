"""The poller's look at new issue comments, so commands work without webhooks (and a lost
delivery's command still runs): `GET /repos/{o}/{r}/issues/comments?since=…`, least recently
updated first, conditional on the ETag kept with the cursor in Redis (`comments`).

The cursor is the newest `updated_at` read. `since` includes it, so while nothing new is
posted the same answer comes back and costs a free 304; comments of that last second are
read again and are skipped as already taken up. Without a cursor (a first start, Redis lost
its data) the look starts now: older comments are never replayed. A cursor older than twice
`commands.max_age_s` (a long outage) jumps to `max_age_s` ago: nothing older is acted on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from github_broker.errors import BrokerError
from github_broker.gateway import GitHubGateway
from github_broker.settings import Repository, Settings
from github_broker.steering.commands.comment import Comment
from github_broker.store import Store
from github_broker.store.comments import CommentLedger

logger = logging.getLogger(__name__)

#: Pages (of `github.per_page` comments) read in one look; the rest waits for the next.
MAX_PAGES = 3

Handle = Callable[[Repository, Comment], Awaitable[str]]


class CommentScanner:
    """Reads the comments posted since the last look and hands each to `handle`."""

    def __init__(
        self, settings: Settings, store: Store, gateway: GitHubGateway, handle: Handle
    ) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.handle = handle

    async def scan(self, repo: Repository) -> int:
        """One look; returns how many comments it read. A comment that could not be acted on
        for now (GitHub or Redis failing) stops the look there: the next one reads it again."""
        name = repo.full_name
        ledger = CommentLedger(self.store.repo(name))
        kept = await ledger.cursor()
        since, etag = _start(kept, time.time(), self.settings.commands.max_age_s)
        newest, first_etag, seen = since, etag, 0
        for page in range(1, MAX_PAGES + 1):
            result = await asyncio.to_thread(
                self.gateway.comments_page,
                name,
                since,
                page=page,
                etag=etag if page == 1 else None,
            )
            if result.status == 304:
                break
            if page == 1:
                first_etag = result.etag
            for comment in filter(None, map(Comment.from_github, result.items)):
                await self._one(repo, ledger, since, comment)
                seen += 1
                newest = max(newest, comment.updated_at)
            if len(result.items) < self.settings.github.per_page:
                break
        # The ETag answers for this `since` only: a moved cursor asks afresh once.
        saved = first_etag if newest == since else None
        if (newest, saved) != kept:
            await ledger.save_cursor(newest, saved)
        return seen

    async def _one(
        self, repo: Repository, ledger: CommentLedger, since: str, comment: Comment
    ) -> None:
        """One comment handed to `handle`; when it fails, the cursor stays before it."""
        try:
            outcome = await self.handle(repo, comment)
        except BrokerError:
            # Read again from here next time (a cursor at its second re-reads it).
            await ledger.save_cursor(max(since, comment.updated_at), None)
            raise
        if outcome != "no command":
            logger.info("%s#%d comment %d: %s", repo.full_name, comment.number, comment.id, outcome)


def _start(
    kept: tuple[str | None, str | None], now: float, max_age_s: float
) -> tuple[str, str | None]:
    """Where a look starts and the ETag it may send: the kept cursor, unless there is none
    or it is too old (then `max_age_s` back, or now for a cursor that is not a time)."""
    at = _epoch(kept[0]) if kept[0] is not None else None
    if kept[0] is None or at is None or at < now - 2 * max_age_s:
        return _iso(now if at is None else now - max_age_s), None
    return kept[0], kept[1]


def _epoch(iso: str) -> float | None:
    """Seconds since the epoch; None for a cursor that is not a time (start afresh)."""
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
