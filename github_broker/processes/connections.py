"""How many connections an API worker holds, and for how long one may idle before its request.

A client that opens connections and sends half a request header would otherwise keep each
one for ever: uvicorn's keep-alive timer starts only after a response, and once the process
runs out of file descriptors asyncio stops accepting for a second at a time, so `/health`
and every agent time out. Three limits keep the port answering:

- the soft file limit is raised to the hard limit at start (`raise_file_limit`);
- a connection must send its request headers within `server.header_timeout_s`, when new and
  after each response (`ConnectionGuard`);
- a worker holds at most `server.max_connections` (clamped to what the file limit allows);
  a new connection beyond that closes the oldest one that has no request in progress, so a
  flood of idle connections makes room for a real client instead of shutting it out.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from typing import Any

logger = logging.getLogger(__name__)

#: File descriptors kept for everything but client connections (Redis pools, the pipelined
#: Redis connection, log and metrics files, the listening socket).
FD_RESERVE = 64
#: Largest accept batch (and listen backlog): uvicorn's default.
MAX_ACCEPT_BATCH = 2048
#: The soft limit set when the hard limit is unlimited (Linux never allows that for files).
UNLIMITED_FILES = 1 << 20
#: Seconds between two log lines about connections closed for room or for timing out.
REPORT_INTERVAL_S = 60.0


def raise_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as e:
            logger.warning("could not raise the file limit from %d to %d: %s", soft, target, e)
            return soft, soft
        return soft, target
    return soft, soft


def connection_limits(max_connections: int, files: int) -> tuple[int, int]:
    """(connections held at most, accept batch) under a soft file limit of `files`.

    asyncio accepts up to a batch of connections in one go before any of them reaches the
    guard, and a closed one frees its descriptor only on the next loop iteration: half the
    usable descriptors for held connections and an eighth per batch leave room for the
    few batches in flight, so accept() never meets EMFILE."""
    usable = max(files - FD_RESERVE, 32)
    held = max(8, min(max_connections, usable // 2))
    batch = max(8, min(MAX_ACCEPT_BATCH, usable // 8))
    return held, batch


class ConnectionGuard:
    """One worker's connections: at most `max_connections`, each idle one (no request in
    progress) closed after `header_timeout_s`, the oldest idle one closed to make room."""

    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self._live: set[Any] = set()
        #: Idle connections, oldest first, with their header timer.
        self._idle: OrderedDict[Any, asyncio.TimerHandle] = OrderedDict()
        self._closed_for_room = 0
        self._timed_out = 0
        self._refused = 0
        self._reported = float("-inf")

    @property
    def held(self) -> int:
        return len(self._live)

    def opened(self, conn: Any) -> None:
        """A new connection: make room if needed, then wait for its request headers."""
        if len(self._live) >= self.max_connections:
            if not self._idle:
                # Every held connection has a request in progress: this one cannot be served.
                self._refused += 1
                self._report()
                conn.transport.close()
                return
            oldest, timer = self._idle.popitem(last=False)
            timer.cancel()
            self._live.discard(oldest)
            self._closed_for_room += 1
            self._report()
            oldest.transport.close()
        self._live.add(conn)
        self.waiting(conn)

    def waiting(self, conn: Any) -> None:
        """`conn` waits for a request (new, or after a response): start its header timer."""
        if conn not in self._live:
            return
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()
        loop = asyncio.get_running_loop()
        self._idle[conn] = loop.call_later(self.header_timeout_s, self._expire, conn)

    def busy(self, conn: Any) -> None:
        """`conn` sent a whole request header: no timer while the request runs."""
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def closed(self, conn: Any) -> None:
        self._live.discard(conn)
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, conn: Any) -> None:
        if self._idle.pop(conn, None) is None:
            return
        self._live.discard(conn)
        self._timed_out += 1
        self._report()
        conn.transport.close()

    def _report(self) -> None:
        now = time.monotonic()
        if now - self._reported < REPORT_INTERVAL_S:
            return
        self._reported = now
        logger.warning(
            "connections closed since the last report: %d to make room (at most %d held), "
            "%d idle for %gs without a request, %d refused while every held one was busy",
            self._closed_for_room,
            self.max_connections,
            self._timed_out,
            self.header_timeout_s,
            self._refused,
        )
        self._closed_for_room = self._timed_out = self._refused = 0
