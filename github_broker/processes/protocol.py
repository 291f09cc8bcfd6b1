"""uvicorn's HTTP protocol with TCP_NODELAY on every connection, whatever made the socket, and
the worker's connection limits (`connections.ConnectionGuard`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import ClassVar

from uvicorn.protocols.http.h11_impl import H11Protocol

from github_broker.processes.connections import ConnectionGuard


class NoDelayH11Protocol(H11Protocol):
    """With `--workers N` uvicorn binds the socket itself without `IPPROTO_TCP`, so asyncio
    skips TCP_NODELAY and every small kept-alive response waits ~40 ms for the client's
    delayed ACK (Nagle). Setting it per connection removes that wait.

    With a `guard` (see `guarded`), each connection is counted and timed: the guard hears when
    it opens, when a request's headers are complete, when a response is done and the
    connection waits for the next request, and when it closes."""

    guard: ClassVar[ConnectionGuard | None] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)  # type: ignore[arg-type]
        if self.guard is not None:
            self.guard.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.guard is not None:
            self.guard.closed(self)
        super().connection_lost(exc)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.guard is not None and self.cycle is not cycle:
            self.guard.busy(self)  # a new request's headers arrived

    def on_response_complete(self) -> None:
        # Before uvicorn's own: it handles a pipelined request at once (busy again).
        if self.guard is not None and not self.transport.is_closing():
            self.guard.waiting(self)
        super().on_response_complete()


def guarded(guard: ConnectionGuard) -> type[NoDelayH11Protocol]:
    """The protocol class of one worker, reporting to its `guard`."""
    return type("GuardedH11Protocol", (NoDelayH11Protocol,), {"guard": guard})
