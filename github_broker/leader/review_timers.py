"""Review timers: an issue's review upkeep runs when a review becomes due or new feedback
settles, not at the poller's next pass; timers fire only in the leader."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from github_broker.errors import BrokerError
from github_broker.settings import Repository

logger = logging.getLogger(__name__)

#: Seconds after a due time its timer fires (the due time itself is still "not yet").
TIMER_SLACK_S = 0.05

#: The upkeep of one issue; returns the issues' next due times (issue -> ms).
Upkeep = Callable[[Repository, int], Awaitable[dict[int, int]]]


class ReviewTimers:
    """One timer per (repository, issue), re-armed when its due time moves."""

    def __init__(self, upkeep: Upkeep, leading: Callable[[], bool]) -> None:
        self.upkeep = upkeep
        #: Whether this process leads: a follower's timers do nothing.
        self.leading = leading
        #: (repository, issue) -> (due ms, the timer that runs its upkeep then).
        self._timers: dict[tuple[str, int], tuple[int, asyncio.TimerHandle]] = {}
        self._firing: set[asyncio.Task[None]] = set()

    def arm(self, repo: Repository, next_due: dict[int, int]) -> None:
        """Run the upkeep of each issue of `next_due` when it becomes due."""
        loop = asyncio.get_running_loop()
        for n, due_ms in next_due.items():
            key = (repo.full_name, n)
            armed = self._timers.get(key)
            if armed is not None and armed[0] == due_ms:
                continue
            if armed is not None:
                armed[1].cancel()
            delay_s = max(0.0, due_ms / 1000 - time.time()) + TIMER_SLACK_S
            self._timers[key] = (due_ms, loop.call_later(delay_s, self._fire, repo, n))

    def _fire(self, repo: Repository, n: int) -> None:
        self._timers.pop((repo.full_name, n), None)
        task = asyncio.get_running_loop().create_task(self._due(repo, n))
        self._firing.add(task)
        task.add_done_callback(self._firing.discard)

    async def _due(self, repo: Repository, n: int) -> None:
        if not self.leading():
            return
        try:
            next_due = await self.upkeep(repo, n)
        except BrokerError as e:
            # The next pass (or delivery) does it; the mirror is not at risk.
            logger.warning("review upkeep of %s#%d when due failed: %s", repo.full_name, n, e)
            return
        self.arm(repo, next_due)

    def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._firing:
            task.cancel()
