"""The runner's loop: take a task, run the agent command on it, report how it ended, and wait
while the broker is unreachable or this agent is paused."""

from __future__ import annotations

import logging
import threading
import time

from github_broker.agent.client import (
    AgentPaused,
    BrokerClient,
    BrokerClientError,
    BrokerUnavailable,
    LeaseLost,
    Previous,
    RetryBudget,
    new_request_id,
)
from github_broker.agent.runner.config import RunnerConfig, RunnerError
from github_broker.agent.runner.task_run import Ending, TaskRun
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: First and longest pause (seconds) between task requests while the broker is unreachable.
UNREACHABLE_PAUSE_S, MAX_UNREACHABLE_PAUSE_S = 2.0, 60.0
#: First and longest pause (seconds) after failed tasks in a row, so a broken command does not
#: burn through the whole queue.
FAILURE_PAUSE_S, MAX_FAILURE_PAUSE_S = 2.0, 120.0
#: Longest pause (seconds) between task requests while this agent is paused (the first is
#: RunnerConfig.paused_retry_s, doubling): how late a resume is noticed at worst.
MAX_PAUSED_RETRY_S = 60.0

#: What the broker is told for each ending; None: nothing, the lease is gone already.
REPORT: dict[Ending, Previous | None] = {
    Ending.COMPLETED: "completed",
    Ending.FAILED: "failed",
    Ending.TIMED_OUT: "failed",
    Ending.STOPPED: "abandoned",
    Ending.LEASE_LOST: None,
}


class Runner:
    """Takes tasks one at a time until `stop` is set (or after one task with `once`)."""

    def __init__(
        self, client: BrokerClient, config: RunnerConfig, stop: threading.Event | None = None
    ) -> None:
        self.client = client
        self.config = config
        self.stop = stop or threading.Event()
        #: An outcome the broker has not heard yet; the next task request settles it.
        self._unsettled: Previous | None = None
        self._failures = 0
        #: The broker's words while this agent is paused (None: not paused).
        self.paused: str | None = None
        self._paused_pause_s = config.paused_retry_s

    @property
    def agent(self) -> str:
        return self.client.agent_id

    def run(self) -> int:
        """0 when stopped, or (with `once`) when the task completed or none came; else 1."""
        while not self.stop.is_set():
            task = self.next_task()
            if task is None:
                if self.config.once and not self.stop.is_set():
                    if self.paused is None:
                        logger.info("%s: no task within %.0fs", self.agent, self.config.wait_s)
                    return 0
                continue
            ending = self.work(task)
            if self.config.once:
                return 0 if ending is Ending.COMPLETED else 1
            self._pause_after(ending)
        return 0

    def next_task(self) -> Task | None:
        """One long-poll for a task. While the broker is unreachable, pause and ask again (the
        same request id: a repeat that got through returns its hand-out) until `give_up_s`
        seconds have passed since its first failure (the client's own retries count); while
        this agent is paused, ask again less and less often until a maintainer resumes it
        (with `once`: return None)."""
        pause = UNREACHABLE_PAUSE_S
        request_id = new_request_id()
        budget = RetryBudget(self.config.give_up_s)
        while not self.stop.is_set():
            try:
                with self.client.retrying_within(budget):
                    task = self._ask(request_id)
            except BrokerUnavailable as e:
                budget.failed()
                self._check_give_up(e, budget)
                wait = min(pause, budget.left_s())
                logger.warning(
                    "%s: broker unreachable, asking again in %.0fs: %s", self.agent, wait, e
                )
                self.stop.wait(wait)
                pause = min(pause * 2, MAX_UNREACHABLE_PAUSE_S)
                continue
            except AgentPaused as e:
                self._unsettled = None  # the broker settles a held task before it refuses
                if not self._wait_while_paused(e):
                    return None
                request_id = new_request_id()
                continue
            self._unsettled = None
            self._resumed()
            return task
        return None

    def work(self, task: Task) -> Ending:
        """Run the command on one task, heartbeating meanwhile, then report how it ended."""
        self._log_claim(task)
        started = time.monotonic()
        run = TaskRun(self.client, self.config, task, self.stop)
        if self.stop.is_set():  # the task arrived while we were asked to stop
            ending, code = Ending.STOPPED, None
        else:
            try:
                ending, code = run.run()
            except RunnerError:
                self._settle(task, "abandoned")
                raise
        self._log_ending(task, ending, code, time.monotonic() - started, run)
        outcome = REPORT[ending]
        if outcome is not None:
            self._settle(task, outcome)
        return ending

    # --- asking -------------------------------------------------------------------------

    def _ask(self, request_id: str) -> Task | None:
        # Anything the broker thinks we still hold is a task whose answer never reached us (or
        # a crashed earlier run): abandoned puts it back in the pool.
        return self.client.request_task(
            list(self.config.roles) or None,
            list(self.config.repositories) or None,
            wait_seconds=self.config.wait_s,
            previous=self._unsettled or "abandoned",
            request_id=request_id,
        )

    def _check_give_up(self, e: BrokerUnavailable, budget: RetryBudget) -> None:
        if budget.left_s() <= 0:
            waited_s = budget.limit_s - budget.left_s()
            raise BrokerUnavailable(
                f"broker {self.client.base_url} unreachable for {waited_s:.0f}s; giving "
                f"up (limit {self.config.give_up_s:g}s, --give-up-after): {e}",
                status=e.status,
                reason=e.reason,
            ) from e

    def _wait_while_paused(self, e: AgentPaused) -> bool:
        """Wait before asking again (longer each time); False with `once`. Said once per
        pause, with the broker's words (who paused it, why, how it is resumed)."""
        first = self.paused is None
        self.paused = e.detail or str(e)
        if first:
            then = "exiting (--once)" if self.config.once else "asking again until resumed"
            logger.warning("%s is paused; %s. The broker said: %s", self.agent, then, self.paused)
            self._paused_pause_s = self.config.paused_retry_s
        if self.config.once:
            return False
        self.stop.wait(self._paused_pause_s)
        self._paused_pause_s = min(self._paused_pause_s * 2, MAX_PAUSED_RETRY_S)
        return True

    def _resumed(self) -> None:
        if self.paused is not None:
            self.paused = None
            logger.info("%s was resumed: taking work again", self.agent)

    # --- reporting ----------------------------------------------------------------------

    def _settle(self, task: Task, outcome: Previous) -> None:
        where = (self.agent, task.repository, task.issue_id)
        try:
            if outcome == "completed":
                self.client.complete(task)
            else:
                self.client.release(task, "failed" if outcome == "failed" else "abandoned")
        except LeaseLost as e:
            logger.warning(
                "%s could not report %s#%d as %s: the lease ended (%s)", *where, outcome, e.reason
            )
        except BrokerUnavailable as e:
            self._unsettled = outcome
            logger.warning(
                "%s could not report %s#%d as %s (%s); the next task request will",
                *where,
                outcome,
                e,
            )
        except BrokerClientError as e:
            logger.error("%s could not report %s#%d as %s: %s", *where, outcome, e)

    def _log_claim(self, task: Task) -> None:
        logger.info(
            "%s claimed %s#%d (%s, role %s, branch %s): %s",
            self.agent,
            task.repository,
            task.issue_id,
            task.task_type.value,
            task.required_role,
            task.branch_name,
            task.title,
        )
        if task.continues is not None:
            c = task.continues
            logger.info(
                "%s continues the work of %s on %s (reassigned by %s%s)",
                self.agent,
                c.from_agent or "another agent",
                task.branch_name,
                c.by,
                f": {c.reason}" if c.reason else "",
            )

    def _log_ending(
        self, task: Task, ending: Ending, code: int | None, elapsed_s: float, run: TaskRun
    ) -> None:
        where = (self.agent, task.repository, task.issue_id)
        if ending is Ending.COMPLETED:
            logger.info("%s completed %s#%d (exit 0 after %.1fs)", *where, elapsed_s)
        elif ending is Ending.FAILED:
            logger.info(
                "%s failed %s#%d (exit %s after %.1fs); releasing it as failed",
                *where,
                code,
                elapsed_s,
            )
        elif ending is Ending.TIMED_OUT:
            logger.warning(
                "%s timed out on %s#%d after %.1fs; command stopped, releasing it as failed",
                *where,
                elapsed_s,
            )
        elif ending is Ending.LEASE_LOST:
            said = f"; the broker said: {run.lost_detail}" if run.lost_detail else ""
            logger.warning("%s lost %s#%d (%s); command stopped%s", *where, run.lost, said)
        else:
            logger.info("%s stopping: releasing %s#%d as abandoned", *where)

    def _pause_after(self, ending: Ending) -> None:
        if ending is Ending.COMPLETED:
            self._failures = 0
            return
        if ending not in (Ending.FAILED, Ending.TIMED_OUT):
            return
        self._failures += 1
        pause = min(MAX_FAILURE_PAUSE_S, FAILURE_PAUSE_S * 2 ** (self._failures - 1))
        logger.info(
            "%s: %d failed task(s) in a row, pausing %.0fs", self.agent, self._failures, pause
        )
        self.stop.wait(pause)
