"""The one task an MCP client holds: claiming, automatic heartbeats, settling, lost leases."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Literal

from github_broker.agent.aio import AsyncBrokerClient
from github_broker.agent.client import BrokerClientError, LeaseLost
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: Called with a message when the broker takes a held task back between two tool calls.
Notify = Callable[[str], Awaitable[None]]


class NoTask(Exception):
    """A call that needs a held task came while none is held (or its lease was lost)."""


class TaskHeld(Exception):
    """A task request came while the agent still holds a task."""


def where(task: Task) -> str:
    return f"{task.repository}#{task.issue_id}"


class AgentSession:
    """Holds at most one task, renews its lease in the background until it is settled, and
    keeps the news of a lost lease until the agent's next call."""

    def __init__(self, client: AsyncBrokerClient) -> None:
        self.client = client
        self.task: Task | None = None
        #: Why the broker took the last task back, until the agent has been told.
        self.lost: str | None = None
        self._beat: asyncio.Task[None] | None = None
        self._notify: Notify | None = None

    @property
    def agent_id(self) -> str:
        return self.client.agent_id

    def take_lost(self) -> str | None:
        """The lost-lease notice, once."""
        notice, self.lost = self.lost, None
        return notice

    def held(self) -> Task:
        """The held task, or NoTask saying why there is none."""
        if self.task is not None:
            return self.task
        notice = self.take_lost()
        if notice:
            raise NoTask(f"{notice} Stop working on it; call request_task for new work.")
        raise NoTask("you hold no task: call request_task first.")

    async def claim(
        self,
        roles: list[str] | None,
        repositories: list[str] | None,
        wait_seconds: float,
        request_id: str | None,
        notify: Notify | None,
    ) -> Task | None:
        if self.task is not None:
            raise TaskHeld(
                f"you still hold {where(self.task)}: call complete or release before asking "
                "for another task."
            )
        # Anything the broker thinks we hold is a task whose answer never reached us (or an
        # earlier server's): abandoned puts it back in the pool.
        task = await self.client.request_task(
            roles, repositories, wait_seconds, previous="abandoned", request_id=request_id
        )
        if task is not None:
            self.task, self._notify = task, notify
            self._beat = asyncio.create_task(self._heartbeats(task), name=f"beat-{where(task)}")
        return task

    async def heartbeat(self) -> str:
        """One heartbeat now (the background loop keeps going)."""
        task = self.held()
        try:
            return await self.client.heartbeat(task)
        except LeaseLost as e:
            await self._lose(task, e.reason)
            raise NoTask(f"{self.take_lost()} Stop working on it.") from e

    async def finish(self, outcome: Literal["completed", "failed", "abandoned"]) -> Task:
        """Complete or release the held task; the lease ends either way."""
        task = self.held()
        await self._stop_beat()
        try:
            if outcome == "completed":
                await self.client.complete(task)
            else:
                await self.client.release(task, outcome)
        except LeaseLost as e:
            self.task = None
            raise NoTask(
                f"the broker refused: the lease on {where(task)} had already ended ({e.reason})."
            ) from e
        except BrokerClientError:
            # Unreachable broker: keep the task so the agent can try again; beats resume.
            self._beat = asyncio.create_task(self._heartbeats(task))
            raise
        self.task = None
        return task

    async def close(self) -> None:
        """On shutdown: a task still held goes back to the pool."""
        task = self.task
        await self._stop_beat()
        if task is None:
            return
        self.task = None
        try:
            await self.client.release(task, "abandoned")
            logger.info("%s: released %s as abandoned on shutdown", self.agent_id, where(task))
        except BrokerClientError as e:
            logger.warning(
                "%s: could not release %s on shutdown: %s", self.agent_id, where(task), e
            )

    async def _stop_beat(self) -> None:
        beat, self._beat = self._beat, None
        if beat is not None and beat is not asyncio.current_task():
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _heartbeats(self, task: Task) -> None:
        interval_s = max(1, task.lease.heartbeat_interval_s)
        while self.task is task:
            await asyncio.sleep(interval_s)
            try:
                expires = await self.client.heartbeat(task)
            except LeaseLost as e:
                await self._lose(task, e.reason)
                return
            except BrokerClientError as e:
                # The lease lasts three intervals: one missed beat does not cost it.
                logger.warning("%s: heartbeat on %s failed: %s", self.agent_id, where(task), e)
            else:
                logger.debug("%s: lease on %s until %s", self.agent_id, where(task), expires)

    async def _lose(self, task: Task, reason: str | None) -> None:
        if self.task is not task:
            return
        self.task, self._beat = None, None
        self.lost = f"The broker took {where(task)} back: your lease ended ({reason or 'unknown'})."
        logger.warning("%s: lease on %s lost (%s)", self.agent_id, where(task), reason)
        if self._notify is not None:
            try:
                await self._notify(self.lost)
            except Exception as e:  # the client may be gone; the next call still tells it
                logger.info("%s: could not notify the MCP client: %s", self.agent_id, e)
