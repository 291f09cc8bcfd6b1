"""uvicorn's HTTP protocol with TCP_NODELAY on every connection, whatever made the socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from uvicorn.protocols.http.h11_impl import H11Protocol


class NoDelayH11Protocol(H11Protocol):
    """With `--workers N` uvicorn binds the socket itself without `IPPROTO_TCP`, so asyncio
    skips TCP_NODELAY and every small kept-alive response waits ~40 ms for the client's
    delayed ACK (Nagle). Setting it per connection removes that wait."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)  # type: ignore[arg-type]
