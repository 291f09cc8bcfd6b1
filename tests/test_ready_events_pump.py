"""The subscription pump outlives a reconnect that times out: long-polls keep being woken."""

from __future__ import annotations

import asyncio
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
            return {"type": "message", "channel": b"events", "data": b"1"}
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
        assert await asyncio.wait_for(queue.get(), timeout=5) == "events"
        assert not pump.done()
    finally:
        pump.cancel()
