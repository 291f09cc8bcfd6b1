"""A light Redis client for the store's Lua scripts: one pipelined connection per event loop.

redis-py checks a connection out of its pool for every call, writes the command, waits for
its reply and puts the connection back; on the hot path that machinery cost about 0.17 ms of
CPU per call, a third of the app's time. `Pipelined` instead keeps one connection per event
loop and writes each call without waiting for earlier replies: the calls started in one loop
iteration go out in one write, and replies, parsed by `hiredis.Reader`, are handed out in the
order the commands were written (Redis answers one connection in order).

Errors are redis-py's own, so `translate_errors` maps them as before: replies through
redis-py's `parse_error` (ResponseError and its subclasses: NoScriptError, BusyLoadingError,
...), a lost connection as `redis.exceptions.ConnectionError`, a connect that Redis does not
answer within the URL's connect timeout as `redis.exceptions.TimeoutError`.

A call runs at most once. One still waiting for its reply when the connection breaks fails
and is not sent again (redis-py's retry would: the script may have run, and a claim or a
completion run twice answers its agent with a conflict); the agent's retry is what its
request id and the SDK's maybe-delivered rule are for. The next call connects anew.

A call the caller gives up on (`asyncio.timeout`) keeps its place: its reply is read and
dropped, so later replies stay matched; one never written yet is not written at all. While
Redis is not answering, few calls are written at all (see `_Link._flush`), and a connection
counts as up only once Redis has answered on it. When a call gives up while Redis has sent
nothing for `stall_s` although replies are owed (a stalled or unreachable Redis, a half-open
socket), the connection is dropped, discarding what was not sent.

Only plain redis-py clients (`redis://`, `unix://`, no TLS, no Sentinel) get one; the rest
(fakeredis `memory://`, Redis Cluster, `rediss://`, Sentinel) keep redis-py's scripts: see
`pipelined_for`, the one place that decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import struct
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
#: Most calls written and not answered yet, per connection (more wait their turn).
MAX_IN_FLIGHT = 64
#: Seconds without a reply while replies are owed after which no more calls are written.
HOLD_S = 0.05


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
        #: Calls not written yet, in order: this loop iteration's (written together by
        #: `_flush`), and those held back while Redis is not answering (see `_flush`).
        self.outgoing: deque[tuple[bytes, asyncio.Future[Any]]] = deque()
        self._flush_due = False
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
                if self.outgoing and not self._flush_due:  # held calls: Redis answers again
                    self._flush()
                return
            if not waiting:  # a reply nobody asked for: the stream is not ours to read
                self._break(redis.exceptions.InvalidResponse("unexpected reply from Redis"))
                return
            future = waiting.popleft()
            if not future.done():  # else its caller gave up: read and dropped
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
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)
        self.outgoing.append((packed, future))
        return future

    def _flush(self) -> None:
        """Write the calls not written yet, unless Redis is not answering: at most
        MAX_IN_FLIGHT unanswered calls, and none while replies are owed and Redis has sent
        nothing for HOLD_S. Held calls go out when replies come again; a call given up on
        before it was written never is. Every call written to a stalled Redis runs when it
        wakes, long after its caller was told it failed: this bounds how many do (a client
        without pipelining has one call per connection in flight)."""
        self._flush_due = False
        if self.lost is not None:
            self._fail(self.lost)
            return
        now = time.monotonic()
        if not self.waiting:
            self.progress = now
        elif now - self.progress >= HOLD_S:
            return
        outgoing, waiting, chunks = self.outgoing, self.waiting, []
        while outgoing and len(waiting) < MAX_IN_FLIGHT:
            packed, future = outgoing.popleft()
            if not future.done():  # given up before it was written: never written
                chunks.append(packed)
                waiting.append(future)
        if chunks and self.transport is not None:
            self.transport.write(b"".join(chunks))

    def stalled(self, stall_s: float) -> bool:
        """Replies are owed and Redis has sent nothing for `stall_s` seconds."""
        return bool(self.waiting) and time.monotonic() - self.progress >= stall_s

    def _break(self, error: Exception) -> None:
        self._fail(error)
        self._abort()

    def _abort(self) -> None:
        """Close at once, discarding what is not sent yet: asyncio's own buffer and, by a
        reset (SO_LINGER 0), the kernel's. Calls given up on must not run later: a stalled
        Redis would otherwise run the whole backlog when it wakes, after newer calls that
        other connections made meanwhile (a failed write overwriting an acknowledged one)."""
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
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
        self._fail(redis.exceptions.ConnectionError(why))
        self._abort()


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
        #: Set by `aclose`: a connect still under way then closes what it made.
        self._closed = False

    async def execute(self, *args: Any) -> Any:
        """One command's reply (sent at most once); a stalled connection is dropped when the
        caller gives up."""
        return await self._send(_pack(*args))

    async def execute_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Several commands written together (one round trip), their replies in order; an
        error reply is returned in its command's place (as redis-py's pipeline with
        `raise_on_error=False`), a lost connection raised."""
        packed = [_pack(*c) for c in commands]
        link = await self._link_for(asyncio.get_running_loop())
        futures = [link.send(p) for p in packed]
        out: list[Any] = []
        try:
            for future in futures:
                try:
                    out.append(await future)
                except redis.exceptions.ResponseError as e:
                    out.append(e)
        except BaseException:
            for future in futures:
                future.cancel()  # read and dropped when they come: later replies stay matched
            if link.stalled(self.stall_s):
                link.close(f"Redis sent nothing for {self.stall_s:g}s; connection dropped")
            raise
        return out

    def send_nowait(self, *args: Any) -> asyncio.Future[Any] | None:
        """Write one command with this loop iteration's others, without waiting for its
        reply: the future gets it. None when the running loop has no connection up (the
        caller then awaits `execute`, which connects)."""
        loop = asyncio.get_running_loop()
        link = self._link if self._loop is loop else self._links.get(loop)
        if link is None or link.lost is not None:
            return None
        return link.send(_pack(*args))

    async def _link_for(self, loop: asyncio.AbstractEventLoop) -> _Link:
        link = self._link if self._loop is loop else self._links.get(loop)
        if link is None or link.lost is not None:
            link = await self._connected(loop)
        return link

    async def _send(self, packed: bytes) -> Any:
        loop = asyncio.get_running_loop()
        link = self._link if self._loop is loop else self._links.get(loop)
        if link is None or link.lost is not None:  # as `_link_for`, inlined: the hot path
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
        # not cancel it for the others (it is bounded by the connect timeout plus one call
        # bound, see _connect).
        task = self._connecting.get(loop)
        if task is None:
            task = loop.create_task(self._connect(loop))
            task.add_done_callback(_retrieved)
            self._connecting[loop] = task
        return await asyncio.shield(task)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Link:
        link = _Link(loop)
        try:
            # The TCP connect within the connect timeout, Redis's answers within one call
            # bound as well (stall_s): a Redis busy with a long script is not a dead one.
            async with asyncio.timeout(self.connect_timeout_s + self.stall_s) as bound:
                bound.reschedule(loop.time() + self.connect_timeout_s)
                if self.path:
                    await loop.create_unix_connection(lambda: link, self.path)
                else:
                    await loop.create_connection(lambda: link, self.host, self.port)
                bound.reschedule(loop.time() + max(self.connect_timeout_s, self.stall_s))
                # The link is up once Redis has answered, not when the kernel accepted the
                # connection (it does so for a stalled Redis too): calls are never written
                # to a server that is not answering.
                hello: list[asyncio.Future[Any]] = []
                if self.username or self.password:  # as redis-py's credential provider
                    password = self.password or ""
                    auth = (self.username, password) if self.username else (password,)
                    hello.append(link.send(_pack("AUTH", *auth)))
                if self.db:
                    hello.append(link.send(_pack("SELECT", self.db)))
                hello.append(link.send(_pack("PING")))
                answers = await asyncio.gather(*hello, return_exceptions=True)
                failed = next((a for a in answers if isinstance(a, BaseException)), None)
                if failed is not None:
                    raise failed
            if self._closed:
                raise redis.exceptions.ConnectionError("Connection closed by the client.")
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
        """Close the connections; the running loop's is waited for until it is closed. A
        connect under way closes its connection when it ends."""
        self._closed = True
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
        packed: bytes = hiredis.pack_command(args)
        return packed
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
