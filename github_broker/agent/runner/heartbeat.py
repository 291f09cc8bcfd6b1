"""The heartbeat thread of a running task: renews its lease, tells the broker what the command
is doing, and keeps what the broker answers (a revoke, a pause, maintainers' notes) for the
loop to act on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from github_broker.agent.client import (
    BrokerClient,
    BrokerClientError,
    HeartbeatAnswer,
    LeaseLost,
    Usage,
)
from github_broker.agent.runner.notes import NotesFile
from github_broker.models import AgentPause, Task, TaskPause

logger = logging.getLogger(__name__)

#: Share of the lease's heartbeat interval between two beats (start to start). The rest of
#: the interval is left for the round trip and for the command's group to end, so a revoke
#: is acted on, the group gone, within one interval of the broker's decision.
BEAT_SHARE = 0.8


class Heartbeat:
    """Renews a task's lease from a background thread until stopped or the lease is lost.

    Each beat carries `note()` (what the command is doing) and `usage()`; what the answer
    says is kept here (`lost_reason`, `paused`, `agent_paused`) and `changed` is set, so the
    loop acts at once; maintainers' notes are logged and appended to `notes_file`."""

    def __init__(
        self,
        client: BrokerClient,
        task: Task,
        *,
        note: Callable[[], str | None] = lambda: None,
        usage: Callable[[], Usage | None] = lambda: None,
        notes_file: NotesFile | None = None,
    ) -> None:
        self.client = client
        self.task = task
        self.interval_s = max(1, task.lease.heartbeat_interval_s)
        self.every_s = self.interval_s * BEAT_SHARE
        self._note, self._usage, self.notes_file = note, usage, notes_file
        #: The broker's 409 reason once the lease is gone (revoked, expired, ...), and its words.
        self.lost_reason: str | None = None
        self.lost_detail: str = ""
        #: The task waits for a person (a budget reached) while this is set.
        self.paused: TaskPause | None = None
        #: This agent is paused: the task may finish, no new one will come.
        self.agent_paused: AgentPause | None = None
        #: Set whenever one of the above changes.
        self.changed = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{task.issue_id}", daemon=True
        )

    @property
    def where(self) -> str:
        return f"{self.client.agent_id} {self.task.repository}#{self.task.issue_id}"

    @property
    def grace_when_lost_s(self) -> float:
        """What is left of the interval after a beat: the most a command whose lease is gone
        gets between SIGTERM and SIGKILL."""
        return self.interval_s - self.every_s

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.client.timeout_s)

    def _run(self) -> None:
        next_beat = time.monotonic() + self.every_s
        while not self._done.wait(max(0.0, next_beat - time.monotonic())):
            next_beat = time.monotonic() + self.every_s
            try:
                answer = self.client.heartbeat(self.task, note=self._note(), usage=self._usage())
            except LeaseLost as e:
                if not self._done.is_set():
                    self.lost_detail = e.detail or ""
                    self.lost_reason = e.reason
                    self.changed.set()
                return
            except BrokerClientError as e:
                # The lease lasts three intervals: one missed beat does not cost it.
                logger.warning(
                    "%s: heartbeat failed, next in %.0fs: %s", self.where, self.every_s, e
                )
            else:
                self._heard(answer)

    def _heard(self, answer: HeartbeatAnswer) -> None:
        logger.debug("%s: lease until %s (%s)", self.where, answer.expires_at, answer.state)
        for note in answer.notes:
            logger.info("%s: note from %s: %s", self.where, note.by, note.text)
        if answer.notes and self.notes_file is not None:
            self.notes_file.append(answer.notes)
        if answer.agent_paused is not None and self.agent_paused is None:
            pause = answer.agent_paused
            logger.warning(
                "%s: this agent is paused (%s by %s%s); finishing this task, then no new work",
                self.where,
                pause.kind,
                pause.by,
                f": {pause.reason}" if pause.reason else "",
            )
        self.agent_paused = answer.agent_paused
        if answer.paused != self.paused:
            self.paused = answer.paused
            self.changed.set()
