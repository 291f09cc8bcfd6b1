"""Waiting for a condition, never for a fixed time: the one helper the suite waits with.

`wait_until` polls a check until it returns something truthy and returns that; when the time
runs out it fails, saying what it waited for, for how long, and what the check saw last.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two looks (short: the tests measure latencies of a second or less).
EVERY_S = 0.05


def wait_until(check: Callable[[], T], timeout_s: float, what: str, every_s: float = EVERY_S) -> T:
    """`check()`'s first truthy value, looked for every `every_s` for `timeout_s` at most."""
    started = time.monotonic()
    while True:
        value = check()
        if value:
            return value
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise AssertionError(
                f"timed out after {waited:.1f}s waiting for {what} (last seen: {value!r})"
            )
        time.sleep(every_s)


async def await_until(
    check: Callable[[], Awaitable[T]], timeout_s: float, what: str, every_s: float = EVERY_S
) -> T:
    """The same for a check that is a coroutine function."""
    started = time.monotonic()
    while True:
        value = await check()
        if value:
            return value
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise AssertionError(
                f"timed out after {waited:.1f}s waiting for {what} (last seen: {value!r})"
            )
        await asyncio.sleep(every_s)
