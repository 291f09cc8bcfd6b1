"""The heartbeat thread of a running task: renews its lease until stopped or the lease is lost."""

from __future__ import annotations

import logging
import threading

from github_broker.agent.client import BrokerClient, BrokerClientError, LeaseLost
from github_broker.models import Task

logger = logging.getLogger(__name__)


class Heartbeat:
    """Renews a task's lease from a background thread until stopped or the lease is lost."""

    def __init__(self, client: BrokerClient, task: Task) -> None:
        self.client = client
        self.task = task
        self.interval_s = max(1, task.lease.heartbeat_interval_s)
        #: The broker's 409 reason once the lease is gone (revoked, expired, ...).
        self.lost_reason: str | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{task.issue_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.client.timeout_s)

    def _run(self) -> None:
        agent, task = self.client.agent_id, self.task
        while not self._done.wait(self.interval_s):
            try:
                expires = self.client.heartbeat(task)
            except LeaseLost as e:
                if not self._done.is_set():
                    self.lost_reason = e.reason
                return
            except BrokerClientError as e:
                # The lease lasts three intervals: one missed beat does not cost it.
                logger.warning(
                    "%s heartbeat on %s#%d failed, next in %ds: %s",
                    agent,
                    task.repository,
                    task.issue_id,
                    self.interval_s,
                    e,
                )
            else:
                logger.debug(
                    "%s heartbeat on %s#%d: lease until %s",
                    agent,
                    task.repository,
                    task.issue_id,
                    expires,
                )
