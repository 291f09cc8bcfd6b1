"""Wakes long-polling requests in this process when any process makes a task claimable."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from github_broker.background import stop_task
from github_broker.errors import BrokerError
from github_broker.store import Store

logger = logging.getLogger(__name__)


class ReadyWaker:
    """One Redis subscription per process, fanned out to every waiting request."""

    def __init__(self, recheck_s: float) -> None:
        # A missed message (Redis reconnecting) costs a waiter at most recheck_s.
        self.recheck_s = recheck_s
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Set once the process is shutting down: waiting requests answer "no task" at once.
        self.closing = False

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def close(self) -> None:
        """Shutdown: wake every waiting request now and let none wait again."""
        self.closing = True
        self.notify()

    async def wait(self, timeout_s: float) -> None:
        """Return when a task may have become claimable, or after `timeout_s`."""
        if self.closing:
            return
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=min(timeout_s, self.recheck_s))

    def start(self, store: Store) -> None:
        self._task = asyncio.create_task(self._listen(store))

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    async def _listen(self, store: Store) -> None:
        while True:
            try:
                async with store.ready_events() as queue:
                    while True:
                        await queue.get()
                        self.notify()
            except BrokerError as e:
                logger.warning("ready events unavailable, retrying: %s", e)
                await asyncio.sleep(1.0)
