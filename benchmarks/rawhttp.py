"""A minimal HTTP/1.1 keep-alive client on asyncio streams, cheap enough not to be the load.

httpx spends about 0.7 ms of CPU per request (and far more when 50 requests share one
pool), more than the broker spends answering; a generator built on it measures itself.
This client speaks only what the benchmarks send: JSON POSTs with a Content-Length.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket


class HTTPStatusError(Exception):
    """The server answered something this client cannot parse."""


class Connection:
    """One persistent connection; reconnects when the server closes it."""

    def __init__(self, host: str, port: int, *, quickack: bool = False) -> None:
        self.host = host
        self.port = port
        self.quickack = quickack
        self._sock: socket.socket | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # Head and body leave in one write, but Nagle would still delay a lone packet.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._reader, self._writer = reader, writer
        return reader, writer

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST `body` (JSON) to `path`; returns (status, response body)."""
        if self._writer is None or self._reader is None:
            reader, writer = await self._connect()
        else:
            reader, writer = self._reader, self._writer
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        if self.quickack and self._sock is not None:
            # Linux drops out of quick-ACK mode on its own, so it is asked for per request.
            # ACKing the response head at once un-stalls a server that left Nagle on.
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            await self.close()
            raise HTTPStatusError(f"connection closed: {e}") from e
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, chunked, close = 0, False, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        data = await self._chunked(reader) if chunked else await reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(chunk[:-2])

    async def close(self) -> None:
        writer, self._writer, self._reader, self._sock = self._writer, None, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
