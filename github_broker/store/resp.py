"""A light Redis client for the store's Lua scripts: one pipelined connection per event loop.

redis-py checks a connection out of its pool for every call, writes the command, waits for
its reply and puts the connection back; on the hot path that machinery cost about 0.17 ms of
CPU per call, a third of the app's time. `Pipelined` instead keeps one connection per event
loop and writes each call without waiting for earlier replies: the calls started in one loop
iteration go out in one write, and replies, parsed by `hiredis.Reader`, are handed out in the
order the commands were written (Redis answers one connection in order).

Errors are redis-py's own, so `translate_errors` maps them as before: replies through
redis-py's `parse_error` (ResponseError and its subclasses: NoScriptError, BusyLoadingError,
...), a lost connection as `redis.exceptions.ConnectionError` (every call still waiting for
its reply fails with it and is sent once more on a new connection, as redis-py's retry of a
ConnectionError does; not when this side dropped the connection, below), a
connect that takes longer than the URL's connect timeout as `redis.exceptions.TimeoutError`.

A call the caller gives up on (`asyncio.timeout`) keeps its place: its reply is read and
dropped, so later replies stay matched; one never written yet is not written at all. When a
call gives up while Redis has sent nothing for `stall_s` although replies are owed (a
stalled or unreachable Redis, a half-open socket), the connection is dropped instead, and
the next call connects anew (bounded by the connect timeout).

Only plain redis-py clients (`redis://`, `unix://`, no TLS, no Sentinel) get one; the rest
(fakeredis `memory://`, Redis Cluster, `rediss://`, Sentinel) keep redis-py's scripts: see
`pipelined_for`, the one place that decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import time
import weakref
from collections import deque
from typing import Any

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis._parsers.base import BaseParser
from redis.asyncio.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)

#: hiredis' "no complete reply yet" (a Lua reply is never this object).
_MORE = object()
#: Seconds a connect (TCP plus AUTH and SELECT) may take when the URL sets no timeout.
DEFAULT_CONNECT_TIMEOUT_S = 1.0


class _Dropped(redis.exceptions.ConnectionError):
    """The connection was closed by this side (stalled, or the client closed): the calls in
    flight may have run, so they are not sent again (a broken socket's are, once)."""


class _Link(asyncio.Protocol):
    """One connection to Redis: commands written in batches, replies matched in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
            notEnoughData=_MORE,
        )
        #: Calls written, waiting for their replies, in the order written.
        self.waiting: deque[asyncio.Future[Any]] = deque()
        #: Calls of this loop iteration, written together by `_flush`.
        self.outgoing: list[tuple[bytes, asyncio.Future[Any]]] = []
        #: Why the connection is gone (None while it is up).
        self.lost: Exception | None = None
        #: When Redis last answered, or when replies started to be owed (monotonic).
        self.progress = time.monotonic()
        #: Done once the transport is closed.
        self.closed: asyncio.Future[None] = loop.create_future()

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)

    def data_received(self, data: bytes) -> None:
        reader, waiting = self.reader, self.waiting
        reader.feed(data)
        self.progress = time.monotonic()
        while True:
            try:
                reply = reader.gets()
            except redis.exceptions.InvalidResponse as e:
                self._break(e)
                return
            if reply is _MORE:
                return
            if not waiting:  # a reply nobody asked for: the stream is not ours to read
                self._break(redis.exceptions.InvalidResponse("unexpected reply from Redis"))
                return
            future = waiting.popleft()
            if future.done():  # its caller gave up: read and dropped
                continue
            if isinstance(reply, redis.exceptions.RedisError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._fail(
            redis.exceptions.ConnectionError(
                f"Error while reading from Redis: {exc}" if exc else "Connection closed by server."
            )
        )

    # --- calls ------------------------------------------------------------------------------

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        """The future reply of one packed command (written with this iteration's others)."""
        future = self.loop.create_future()
        if not self.outgoing:
            self.loop.call_soon(self._flush)
        self.outgoing.append((packed, future))
        return future

    def _flush(self) -> None:
        outgoing, self.outgoing = self.outgoing, []
        if self.lost is not None:
            self.outgoing = outgoing
            self._fail(self.lost)
            return
        if not self.waiting:
            self.progress = time.monotonic()
        chunks = []
        for packed, future in outgoing:
            if not future.done():  # given up before it was written: never written
                chunks.append(packed)
                self.waiting.append(future)
        if chunks and self.transport is not None:
            self.transport.write(b"".join(chunks))

    def stalled(self, stall_s: float) -> bool:
        """Replies are owed and Redis has sent nothing for `stall_s` seconds."""
        return bool(self.waiting) and time.monotonic() - self.progress >= stall_s

    def _break(self, error: Exception) -> None:
        self._fail(error)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, error: Exception) -> None:
        if self.lost is None:
            self.lost = error
        lost = self.lost
        for future in [*self.waiting, *(f for _, f in self.outgoing)]:
            if not future.done():  # an instance each: every caller raises its own
                future.set_exception(type(lost)(*lost.args))
        self.waiting.clear()
        self.outgoing.clear()

    def close(self, why: str = "Connection closed by the client.") -> None:
        self._fail(_Dropped(why))
        if self.transport is not None:
            self.transport.close()


class Pipelined:
    """EVALSHA (and any command) over one pipelined connection per event loop."""

    def __init__(
        self,
        *,
        host: str = "localhost",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        connect_timeout_s: float | None = None,
        stall_s: float = 2.0,
    ) -> None:
        self.host, self.port, self.path = host, port, path
        self.db, self.username, self.password = int(db or 0), username, password
        self.connect_timeout_s = connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S
        self.stall_s = stall_s
        self._links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Link] = (
            weakref.WeakKeyDictionary()
        )
        self._connecting: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[_Link]
        ] = weakref.WeakKeyDictionary()
        # The last loop's link, looked up without the weak dictionary (serve has one loop).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._link: _Link | None = None

    async def execute(self, *args: Any) -> Any:
        """One command's reply; a connection found broken is replaced once (as redis-py's
        retry of one ConnectionError), a stalled one dropped when the caller gives up."""
        packed = _pack(*args)
        try:
            return await self._send(packed)
        except _Dropped:
            raise
        except redis.exceptions.ConnectionError:
            return await self._send(packed)

    async def _send(self, packed: bytes) -> Any:
        loop = asyncio.get_running_loop()
        link = self._link if self._loop is loop else self._links.get(loop)
        if link is None or link.lost is not None:
            link = await self._connected(loop)
        future = link.send(packed)
        try:
            return await future
        except asyncio.CancelledError:
            if link.stalled(self.stall_s):
                link.close(f"Redis sent nothing for {self.stall_s:g}s; connection dropped")
            raise

    async def _connected(self, loop: asyncio.AbstractEventLoop) -> _Link:
        # One connect per loop at a time, in a task of its own: a caller that gives up does
        # not cancel it for the others (it is bounded by the connect timeout anyway).
        task = self._connecting.get(loop)
        if task is None:
            task = loop.create_task(self._connect(loop))
            task.add_done_callback(_retrieved)
            self._connecting[loop] = task
        return await asyncio.shield(task)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Link:
        link = _Link(loop)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if self.path:
                    await loop.create_unix_connection(lambda: link, self.path)
                else:
                    await loop.create_connection(lambda: link, self.host, self.port)
                hello: list[asyncio.Future[Any]] = []
                if self.username or self.password:  # as redis-py's credential provider
                    password = self.password or ""
                    auth = (self.username, password) if self.username else (password,)
                    hello.append(link.send(_pack("AUTH", *auth)))
                if self.db:
                    hello.append(link.send(_pack("SELECT", self.db)))
                for answer in hello:
                    await answer
        except TimeoutError as e:
            link.close()
            raise redis.exceptions.TimeoutError("Timeout connecting to server") from e
        except BaseException:
            link.close()
            raise
        finally:
            self._connecting.pop(loop, None)
        self._links[loop] = link
        self._loop, self._link = loop, link
        return link

    async def aclose(self) -> None:
        """Close the connections; the running loop's is waited for until it is closed."""
        links = list(self._links.values())
        self._links.clear()
        self._loop = self._link = None
        running = asyncio.get_running_loop()
        for link in links:
            if link.loop.is_closed():
                continue
            link.close()
            if link.loop is running and link.transport is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await link.closed


def _pack(*args: Any) -> bytes:
    try:
        return hiredis.pack_command(args)
    except TypeError as e:  # as redis-py's encoder: None, bool, a dict...
        raise redis.exceptions.DataError(str(e)) from e


def _retrieved(task: asyncio.Task[Any]) -> None:
    # A failed connect's error reaches its callers; this only keeps asyncio from calling it
    # "never retrieved" when they all gave up.
    if not task.cancelled():
        task.exception()


class PipelinedScript:
    """A registered Lua script run by EVALSHA over `Pipelined`; on NOSCRIPT (Redis restarted,
    SCRIPT FLUSH) it is loaded and run again, as redis-py's `AsyncScript` does."""

    def __init__(self, client: Pipelined, script: str) -> None:
        self.client = client
        self.script = script
        self.sha = hashlib.sha1(script.encode("utf-8")).hexdigest()

    async def __call__(self, keys: Any = (), args: Any = ()) -> Any:
        client = self.client
        try:
            return await client.execute("EVALSHA", self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.sha = await client.execute("SCRIPT", "LOAD", self.script)
            if isinstance(self.sha, bytes):
                self.sha = self.sha.decode()
            return await client.execute("EVALSHA", self.sha, len(keys), *keys, *args)


#: redis-py client -> its `Pipelined` (every store over one client shares its connections).
_PIPELINED: weakref.WeakKeyDictionary[Any, Pipelined] = weakref.WeakKeyDictionary()


def pipelined_for(client: Any, *, stall_s: float = 2.0) -> Pipelined | None:
    """The pipelined client for `client`'s server when it is a plain redis-py client on TCP or
    a unix socket (its pool's parameters: the URL as redis-py read it); None for anything
    else (fakeredis, Redis Cluster, TLS, Sentinel), which keeps redis-py's scripts."""
    found = _PIPELINED.get(client)
    if found is not None:
        return found
    if type(client) is not aioredis.Redis:  # fakeredis subclasses it; RedisCluster does not
        return None
    pool = client.connection_pool
    cls = pool.connection_class
    if (
        type(pool) is not ConnectionPool  # Sentinel's pool, a blocking pool
        or issubclass(cls, SSLConnection)
        or not issubclass(cls, Connection | UnixDomainSocketConnection)
    ):
        return None
    kw = pool.connection_kwargs
    if kw.get("ssl") or kw.get("credential_provider") is not None:
        return None
    made = Pipelined(
        host=kw.get("host", "localhost"),
        port=int(kw.get("port", 6379)),
        path=kw.get("path") if issubclass(cls, UnixDomainSocketConnection) else None,
        db=int(kw.get("db", 0) or 0),
        username=kw.get("username"),
        password=kw.get("password"),
        connect_timeout_s=kw.get("socket_connect_timeout"),
        stall_s=stall_s,
    )
    _PIPELINED[client] = made
    return made


async def close_pipelined(client: Any) -> None:
    """Close `client`'s pipelined connections, if it has any."""
    found = _PIPELINED.pop(client, None)
    if found is not None:
        await found.aclose()
