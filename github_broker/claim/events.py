"""Wakes long-polling requests in this process when any process makes a task claimable."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from github_broker.background import stop_task
from github_broker.claim.repo_index import RELOAD_S, RepoIndex
from github_broker.errors import BrokerError
from github_broker.store import RESUBSCRIBED, Store

logger = logging.getLogger(__name__)


class ReadyWaker:
    """One Redis subscription per process, fanned out to every waiting request; it also keeps
    the process's copy of the index of repositories with work (repo_index.py) and its memory of
    lease ends (store/ended.py)."""

    def __init__(self, recheck_s: float, index: RepoIndex | None = None) -> None:
        # A missed message (Redis reconnecting) costs a waiter at most recheck_s.
        self.recheck_s = recheck_s
        self.index = index or RepoIndex()
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._reloads: asyncio.Task[None] | None = None
        #: Set when Redis confirms the subscription (again): messages sent while it was down
        #: are lost, so the index is read again (`_reload_index`).
        self._reload_now = asyncio.Event()
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

    @property
    def listening(self) -> bool:
        """Whether this process keeps the index up to date (`start`ed): otherwise a claim
        across repositories reads every repository's line itself (embedded use, tests)."""
        return self._task is not None

    def start(self, store: Store) -> None:
        self._task = asyncio.create_task(self._listen(store))
        if len(store.repos) > 1:
            self._reloads = asyncio.create_task(self._reload_index(store))

    async def stop(self) -> None:
        for task in (self._task, self._reloads):
            if task is not None:
                await stop_task(task)
        self._task = self._reloads = None

    async def _listen(self, store: Store) -> None:
        while True:
            try:
                async with store.ready_events() as queue:
                    while True:
                        message = await queue.get()
                        if message == RESUBSCRIBED:
                            store.ended.subscribed()
                            self._reload_now.set()
                        elif store.ended.heard(message):
                            continue  # a lease end: no task became claimable by it alone
                        else:
                            self.index.apply(message)
                        self.notify()
            except BrokerError as e:
                logger.warning("ready events unavailable, retrying: %s", e)
                await asyncio.sleep(1.0)

    async def _reload_index(self, store: Store) -> None:
        """Every repository's index line again once subscribed and after every reconnect
        (pub/sub loses the messages sent while the subscription was down), and every
        RELOAD_S as a safety net: its cost grows with the repositories configured, so it is
        rare."""
        while True:
            self._reload_now.clear()
            try:
                await self.index.reload(store)
            except BrokerError as e:
                logger.debug("index of repositories with work not reloaded: %s", e)
                self._reload_now.set()
                await asyncio.sleep(1.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reload_now.wait(), RELOAD_S)
