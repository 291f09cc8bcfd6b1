"""The subscription pump outlives a reconnect that times out: long-polls keep being woken."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from github_broker.store import Store


class _FlakyPubSub:
    """get_message: first what a reconnect to a stalled Redis raises, then one message."""

    def __init__(self, error: Exception) -> None:
        self.calls = 0
        self.error = error

    async def get_message(self, **_: Any) -> dict[str, Any] | None:
        self.calls += 1
        if self.calls == 1:
            raise self.error
        if self.calls == 2:
            return {"type": "message", "channel": b"gb:events", "data": b"ready"}
        await asyncio.sleep(0.05)
        return None


@pytest.mark.anyio
@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.TimeoutError("Timeout reading from 127.0.0.1:6379"),
        redis.exceptions.ConnectionError("Connection refused"),
    ],
)
async def test_pump_survives_a_reconnect_that_times_out(error: Exception) -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    pump = asyncio.create_task(Store._pump(None, _FlakyPubSub(error), queue))  # type: ignore[arg-type]
    try:
        assert await asyncio.wait_for(queue.get(), timeout=5) == "ready"  # the message, queued
        assert not pump.done()
    finally:
        pump.cancel()


@pytest.mark.anyio
async def test_a_background_task_that_swallows_a_cancellation_still_stops() -> None:
    """A loop that retries on a connection error, where the library turned the cancellation
    into one (redis-py has done so): one `cancel()` lets it go on, and an app's shutdown
    awaiting it hung until the test's 120 s timeout. `stop_task` cancels again until it ends."""
    from github_broker.background import stop_task

    swallowed = 0

    async def retrying_loop() -> None:
        nonlocal swallowed
        while True:
            try:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    if swallowed == 0:  # the first cancellation comes back as another error
                        swallowed += 1
                        raise redis.exceptions.ConnectionError("Connection closed") from None
                    raise
            except redis.exceptions.ConnectionError:
                await asyncio.sleep(0.05)

    plain = asyncio.create_task(retrying_loop())
    await asyncio.sleep(0)
    plain.cancel()
    done, _ = await asyncio.wait({plain}, timeout=0.3)
    assert not done  # one cancellation is not enough

    swallowed = 0
    task = asyncio.create_task(retrying_loop())
    await asyncio.sleep(0)
    started = time.monotonic()
    await stop_task(task)
    assert task.done() and swallowed == 1
    assert time.monotonic() - started < 2.0
    await stop_task(plain)
