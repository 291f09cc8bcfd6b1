"""Stopping the process's background asyncio tasks (subscriptions, webhook loops) for sure."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds between cancellations of a task that has not ended yet.
RECANCEL_S = 0.5


async def stop_task(task: asyncio.Task[Any], *, within_s: float = 10.0) -> None:
    """Cancel `task` and wait until it has ended, cancelling it again every RECANCEL_S.

    One cancellation is not always enough: a library that turns the CancelledError into an
    error of its own (a connection error, say) lets a retrying loop go on, and then a plain
    `cancel(); await task` waits forever, as an app's shutdown once did. Each further
    cancellation lands at the loop's next await. After `within_s` the task is left to the
    event loop's end, with a warning, rather than holding up the shutdown."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not task.done():
        task.cancel()
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            logger.warning("background task %s did not stop; left behind", task.get_name())
            return
        await asyncio.wait({task}, timeout=min(RECANCEL_S, left))
    if not task.cancelled() and task.exception() is not None:
        logger.debug("background task %s ended with %r", task.get_name(), task.exception())
