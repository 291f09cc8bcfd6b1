"""The one task an MCP client holds: claiming, the lease watch, settling, lost leases, and what
the lease watch hears from maintainers (notes, pauses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

from github_broker.agent.client import BrokerClientError, HeartbeatAnswer, LeaseLost
from github_broker.models import AgentCredential, AgentPause, Note, Task, TaskPause, TaskState

if TYPE_CHECKING:  # httpx stays out of the CLI's start-up until `mcp` runs
    from github_broker.agent.aio import AsyncBrokerClient

logger = logging.getLogger(__name__)

#: Seconds between two lease checks while a task is held. A check is a heartbeat (an agent's
#: only lease call), so a lease the broker ended (revoked, expired, issue closed) is told to the
#: client within this plus one round trip, whatever the lease's heartbeat interval (200 s with
#: the default 600 s lease). Cost: one heartbeat request, one Redis script, per held task.
DEFAULT_CHECK_INTERVAL_S = 3.0

#: Called with a message when the broker takes the held task back, a maintainer sends a note,
#: or the task or the agent is paused or goes on, between two tool calls.
Notify = Callable[[str], Awaitable[None]]
#: Called when the held task changes: claimed, settled, or taken back.
OnChange = Callable[[], Awaitable[None]]


class NoTask(Exception):
    """A call that needs a held task came while none is held (or its lease was lost)."""


class TaskHeld(Exception):
    """A task request came while the agent still holds a task."""


def where(task: Task) -> str:
    return f"{task.repository}#{task.issue_id}"


def lost_notice(
    task: Task, reason: str | None, detail: str | None = None, state: str | None = None
) -> str:
    said = f" The broker said: {detail}." if detail and detail != reason else ""
    ended = f" The task is {state} for you." if state else ""
    return (
        f"The broker took {where(task)} back: your lease ended ({reason or 'unknown'}).{ended}"
        f"{said}"
    )


def note_notice(task: Task, note: Note) -> str:
    return f"Note from {note.by} (a maintainer) on {where(task)}: {note.text}"


def paused_notice(task: Task, paused: TaskPause | None) -> str:
    if paused is None:
        return f"A maintainer retried {where(task)}: it is no longer set aside; go on with it."
    return (
        f"{where(task)} is set aside for a person ({paused.code}: {paused.detail}). Stop working "
        "on it; this server keeps the lease until a maintainer retries it (you will be told) "
        "or revokes it."
    )


def agent_paused_notice(task: Task, pause: AgentPause | None) -> str:
    if pause is None:
        return "You were resumed: when this task is settled, request_task hands out work again."
    why = f": {pause.reason}" if pause.reason else ""
    return (
        f"You are paused ({pause.kind} by {pause.by}{why}). Finish {where(task)} and settle it, "
        "then ask for no more work: request_task is refused until a maintainer resumes you."
    )


class AgentSession:
    """Holds at most one task, checks (and so renews) its lease every few seconds until it is
    settled, and keeps the news of a lost lease until the agent's next call."""

    def __init__(
        self,
        client: AsyncBrokerClient,
        *,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        on_change: OnChange | None = None,
    ) -> None:
        self.client = client
        self.check_interval_s = check_interval_s
        self.on_change = on_change
        self.task: Task | None = None
        #: Why the broker took the last task back, until the agent has been told.
        self.lost: str | None = None
        #: What the last heartbeat on the held task said: its state, the notes delivered so far
        #: (all of this task's), a budget pause of the task, a pause of this agent.
        self.state: TaskState | None = None
        self.notes: list[Note] = []
        self.paused: TaskPause | None = None
        self.agent_paused: AgentPause | None = None
        #: Notices (notes, pauses) not yet put before a tool answer.
        self._untold: list[str] = []
        self._watch: asyncio.Task[None] | None = None
        self._notify: Notify | None = None

    @property
    def agent_id(self) -> str:
        return self.client.agent_id

    def take_lost(self) -> str | None:
        """The lost-lease notice, once."""
        notice, self.lost = self.lost, None
        return notice

    def take_news(self) -> list[str]:
        """Every notice the agent has not read in a tool answer yet (a lost lease first, then
        notes and pauses in the order heard), once."""
        untold, self._untold = self._untold, []
        lost = self.take_lost()
        return [lost, *untold] if lost else untold

    def steering(self) -> dict[str, object]:
        """What maintainers said about the held task and this agent, as task://current has it."""
        return {
            "state": self.state.value if self.state else None,
            "notes": [n.model_dump() for n in self.notes],
            "paused": self.paused.model_dump() if self.paused else None,
            "agent_paused": self.agent_paused.model_dump() if self.agent_paused else None,
        }

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
        """Ask for a task; `notify` is told if the broker later takes it back."""
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
        self.agent_paused = None  # the broker answered: not paused (AgentPaused otherwise)
        if task is not None:
            self.task, self._notify = task, notify
            self.state, self.notes, self.paused = TaskState.IN_PROGRESS, [], None
            self._start_watch(task)
            await self._changed()
        return task

    async def credential(self, task: Task) -> AgentCredential | None:
        """The task's scoped GitHub token when the broker hands them out; None when it does
        not, or could not now (logged: the task goes on without it)."""
        try:
            return await self.client.credential(task)
        except BrokerClientError as e:
            logger.warning("no GitHub token for %s: %s", where(task), e)
            return None

    async def heartbeat(self) -> HeartbeatAnswer:
        """One heartbeat now (the watch keeps going)."""
        task = self.held()
        try:
            return await self._beat(task)
        except NoTask:
            self.take_lost()  # this call's answer tells the agent
            raise

    async def finish(self, outcome: Literal["completed", "failed", "abandoned"]) -> Task:
        """Complete or release the held task; the lease ends either way."""
        task = self.held()
        await self._stop_watch()
        try:
            if outcome == "completed":
                await self.client.complete(task)
            else:
                await self.client.release(task, outcome)
        except LeaseLost as e:
            self.task = None
            self._forget_task()
            await self._changed()
            raise NoTask(
                f"the broker refused: the lease on {where(task)} had already ended ({e.reason})."
            ) from e
        except BrokerClientError:
            # Unreachable broker: keep the task so the agent can try again; checks resume.
            self._start_watch(task)
            raise
        self.task = None
        self._forget_task()
        await self._changed()
        return task

    async def close(self) -> None:
        """On shutdown: a task still held goes back to the pool."""
        task = self.task
        await self._stop_watch()
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

    async def _beat(self, task: Task) -> HeartbeatAnswer:
        """One heartbeat and what its answer means: the new lease expiry and what maintainers
        said (told to the client at once), or NoTask when the broker ended the lease. Every
        heartbeat answer (the watch's and the tool's) is read here and only here."""
        try:
            answer = await self.client.heartbeat(task)
        except LeaseLost as e:
            await self._lose(task, e.reason, e.detail, e.state)
            notice = self.lost or lost_notice(task, e.reason, e.detail, e.state)
            raise NoTask(f"{notice} Stop working on it.") from e
        if self.task is task:
            await self._heard(task, answer)
        return answer

    async def _heard(self, task: Task, answer: HeartbeatAnswer) -> None:
        """Keep what the answer says; tell the client what is new (each note once, a pause
        when it starts or ends) as a log message and an update of task://current."""
        news = [note_notice(task, n) for n in answer.notes]
        self.notes += answer.notes
        if answer.paused != self.paused:
            self.paused = answer.paused
            news.append(paused_notice(task, answer.paused))
        if answer.agent_paused != self.agent_paused:
            self.agent_paused = answer.agent_paused
            news.append(agent_paused_notice(task, answer.agent_paused))
        changed = bool(news) or answer.state != self.state
        self.state = answer.state
        for notice in news:
            logger.info("%s: %s", self.agent_id, notice)
            self._untold.append(notice)
            if self._notify is not None:
                await self._tell(self._notify(notice))
        if changed:
            await self._changed()

    def _forget_task(self) -> None:
        """What was said about a task that is gone (a pause of the agent outlives it)."""
        self.state, self.notes, self.paused = None, [], None

    def _start_watch(self, task: Task) -> None:
        self._watch = asyncio.create_task(self._watch_lease(task), name=f"watch-{where(task)}")

    async def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _watch_lease(self, task: Task) -> None:
        # Checking renews too, so the lease's own interval only bounds the pause after failed
        # checks: an unreachable broker is asked less and less often, never less than the
        # lease needs (it lasts three heartbeat intervals).
        every = min(self.check_interval_s, max(1.0, task.lease.heartbeat_interval_s))
        slowest = max(every, float(task.lease.heartbeat_interval_s))
        pause = every
        while self.task is task:
            await asyncio.sleep(pause)
            try:
                answer = await self._beat(task)
            except NoTask:
                return
            except BrokerClientError as e:
                pause = min(pause * 2, slowest)
                logger.warning(
                    "%s: lease check on %s failed (next in %.0fs): %s",
                    self.agent_id,
                    where(task),
                    pause,
                    e,
                )
            else:
                pause = every
                logger.debug(
                    "%s: lease on %s until %s", self.agent_id, where(task), answer.expires_at
                )

    async def _lose(
        self, task: Task, reason: str | None, detail: str | None = None, state: str | None = None
    ) -> None:
        if self.task is not task:
            return
        self.task = None
        self._forget_task()
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()  # the heartbeat tool found the loss first
        notice = self.lost = lost_notice(task, reason, detail, state)
        logger.info("%s: lease on %s lost (%s)", self.agent_id, where(task), reason)
        if self._notify is not None:
            await self._tell(self._notify(notice))
        await self._changed()

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self._tell(self.on_change())

    async def _tell(self, call: Awaitable[None]) -> None:
        try:
            await call
        except Exception as e:  # the client may be gone; its next call still tells it
            logger.info("%s: could not notify the MCP client: %s", self.agent_id, e)
