"""Redis clients: connecting by URL, bounding every call, mapping redis-py's errors."""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
import re
import socket
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, ParamSpec, TypeVar, cast

import hiredis
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from github_broker.errors import CallUnanswered, Fenced, MirrorRebuilding, StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")

#: Memory URL scheme: an in-process fakeredis (sandbox, quick tests).
MEMORY_URL = "memory://"


async def awaited(result: Awaitable[T] | T) -> T:
    """Await a redis-py call; its asyncio stubs type results as "awaitable or value"."""
    if inspect.isawaitable(result):
        return cast(T, await result)
    return result


def translate_errors(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Turn redis-py connection failures into StoreUnavailable, and bound the whole call by
    the store's `call_timeout_s` (reconnects included: a hung Redis fails fast)."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        bound = getattr(args[0], "call_timeout_s", None) if args else None
        try:
            if bound is None:
                return await fn(*args, **kwargs)
            return await _within(bound, fn(*args, **kwargs))
        except TimeoutError as e:
            raise CallUnanswered(f"Redis did not answer within {bound:g}s") from e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            raise CallUnanswered(redis_problem(e)) from e
        except redis.exceptions.ResponseError as e:
            message = str(e)
            if message.startswith("FENCED"):
                raise Fenced(f"not the leader any more: {message}") from e
            if message.startswith("REBUILDING"):
                raise MirrorRebuilding(message.removeprefix("REBUILDING ")) from e
            if message.startswith("OUTLIVED"):
                raise StoreUnavailable(message.removeprefix("OUTLIVED ")) from e
            raise StoreUnavailable(redis_problem(e)) from e

    return wrapper


#: redis-py's connect failure: `Error 111 connecting to 10.0.0.5:6379. Connection refused.`
_CONNECT_ERROR = re.compile(r"^Error (?P<errno>-?\d+) connecting to ")
#: Addresses other messages may carry: Python's `('host', port)`, IPv4 and bracketed IPv6
#: with a port, host:port, a Unix socket's path.
_ADDRESS = re.compile(
    r"\('[^']*', \d+(?:, \d+, \d+)?\)|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"
    r"|\[[0-9A-Fa-f:.]+\](?::\d+)?|\b[\w.-]+:\d{2,5}\b|unix socket: \S+"
)
#: What a connection's errno means, said without the address.
_ERRNO = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ETIMEDOUT: "no answer in time",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ENOENT: "no such socket",
    errno.EACCES: "permission denied",
    # getaddrinfo's EAI_NONAME, EAI_AGAIN and EAI_FAIL as redis-py reports them.
    -2: "its host name does not resolve",
    -3: "its host name does not resolve",
    -4: "its host name does not resolve",
}


def redis_problem(e: BaseException) -> str:
    """What went wrong with Redis, in words a client may read: never the server's address
    (redis-py says `Error 111 connecting to 10.0.0.5:6379`; a Cluster's MOVED reply names a
    node). The exception itself stays the StoreUnavailable's cause, for the log."""
    if isinstance(e, redis.exceptions.ResponseError):
        # Error replies say what failed (a script's error, OOM, READONLY); only a Cluster's
        # redirections name a node.
        if str(e).split(" ", 1)[0] in ("MOVED", "ASK"):
            return "Redis error: a Redis Cluster redirected the call (use a redis+cluster:// URL)"
        return f"Redis error: {e}"
    if isinstance(e, redis.exceptions.AuthenticationError):
        return "Redis unavailable: it refused the broker's credentials"
    if isinstance(e, redis.exceptions.TimeoutError | TimeoutError):
        return "Redis unavailable: no answer in time"
    text = str(e)
    found = _CONNECT_ERROR.match(text)
    code = int(found["errno"]) if found else e.errno if isinstance(e, OSError) else None
    if code in _ERRNO:
        return f"Redis unavailable: {_ERRNO[code]}"
    if isinstance(e, socket.gaierror):
        return "Redis unavailable: its host name does not resolve"
    return f"Redis unavailable: {_ADDRESS.sub('(address)', text) or type(e).__name__}"


class _Expiry:
    """The timer of one bounded call: cancels the calling task when the bound is reached."""

    __slots__ = ("fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.fired = False

    def __call__(self) -> None:
        self.fired = True
        self.task.cancel()


async def _within(bound: float, call: Awaitable[T]) -> T:
    """`await call`, or TimeoutError after `bound` seconds: `asyncio.timeout`'s rules (the
    task cancelled at the bound, the cancel taken back and turned into TimeoutError; a
    cancel from elsewhere stays a cancel) without its context manager and state machine,
    about 1.7 µs less per call here; every store call pays it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    if task is None:  # a coroutine driven by hand, outside any task: nothing to cancel
        return await call
    expiry = _Expiry(task)
    cancelling = task.cancelling()
    handle = loop.call_at(loop.time() + bound, expiry)
    try:
        return await call
    except asyncio.CancelledError as e:
        if expiry.fired:
            expiry.fired = False
            if task.uncancel() <= cancelling:
                raise TimeoutError from e
        raise
    finally:
        handle.cancel()
        if expiry.fired:  # fired, but the call ended otherwise: take the cancel back
            task.uncancel()


#: Redis Cluster: `redis+cluster://host:port[,host:port...]` (any reachable nodes).
CLUSTER_SCHEME = "redis+cluster://"


#: Default bounds of one Redis call (seconds); `Settings.redis` sets them per deployment.
DEFAULT_SOCKET_TIMEOUT_S = 2.0


DEFAULT_CONNECT_TIMEOUT_S = 1.0


def call_timeouts(socket_s: float, connect_s: float) -> dict[str, Any]:
    return {"socket_timeout": socket_s, "socket_connect_timeout": connect_s}


def connect(
    url: str,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    bounded_by_caller: bool = False,
) -> Any:
    """A client for `url`: redis://, rediss://, unix://, redis+sentinel://, redis+cluster://,
    or memory:// (an in-process fakeredis). Every call is bounded by the timeouts.
    `bounded_by_caller`: the caller bounds every call itself (`translate_errors`), so a plain
    Redis client gets no per-socket-operation timeout: with one, redis-py runs each socket
    write in a task of its own under `asyncio.wait_for`, about 40 µs of CPU per call."""
    timeouts = call_timeouts(socket_timeout_s, connect_timeout_s)
    if url.startswith(MEMORY_URL):
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=memory_server())
    if url.startswith("redis+sentinel://"):
        return _sentinel(url, socket_timeout_s)
    if url.startswith(CLUSTER_SCHEME):
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = [
            ClusterNode(h, int(p or 6379))
            for h, _, p in (
                n.partition(":") for n in url.removeprefix(CLUSTER_SCHEME).split("/")[0].split(",")
            )
        ]
        return RedisCluster(startup_nodes=nodes, **timeouts)
    if bounded_by_caller:
        timeouts["socket_timeout"] = None
    client = aioredis.Redis.from_url(url, retry=_retry(), **timeouts)
    pool = client.connection_pool
    pool.connection_class = _packing_in_c(pool.connection_class)
    return client


class _CPack:
    """Packs commands with hiredis (C) instead of redis-py's asyncio connections' Python
    `pack_command`: about 3 µs instead of 18 µs for a claim's 23 arguments. redis-py's sync
    client packs with hiredis the same way when it is installed (`HiredisRespSerializer`)."""

    def pack_command(self, *args: Any) -> list[bytes]:
        # As redis-py: a command name holding a space ("CONFIG GET") goes as separate words.
        if isinstance(args[0], str):
            args = tuple(args[0].encode().split()) + args[1:]
        elif b" " in args[0]:
            args = tuple(args[0].split()) + args[1:]
        try:
            return [hiredis.pack_command(args)]
        except TypeError as e:  # None, bool, a dict...: redis-py's Encoder says DataError
            raise redis.exceptions.DataError(str(e)) from e


def _packing_in_c(cls: type[Any]) -> type[Any]:
    """`cls` packing commands with hiredis (a dependency: redis[hiredis])."""
    return type(cls.__name__, (_CPack, cls), {})


def _retry() -> Retry:
    # One immediate retry on a broken pooled connection (Redis restarted); none on a timeout,
    # or a hung Redis would hold each call for several socket timeouts (redis-py's default).
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def pubsub_client_for(url: str, client: Any, timeouts: dict[str, Any]) -> Any:
    """Who to SUBSCRIBE through: a plain Redis client with the socket timeouts (the main
    client may have none, see `connect`), the client itself for Sentinel and memory://, or
    for a cluster one node (a classic PUBLISH reaches every node of a cluster)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return aioredis.Redis.from_url(url, retry=_retry(), **timeouts)
    if not url.startswith(CLUSTER_SCHEME):
        return client
    host, _, port = url.removeprefix(CLUSTER_SCHEME).split("/")[0].split(",")[0].partition(":")
    return aioredis.Redis(host=host, port=int(port or 6379), retry=_retry(), **timeouts)


_MEMORY: Any = None


def memory_server() -> Any:
    """The process's fake Redis server (memory://): one, shared by every client, like one
    real Redis."""
    global _MEMORY
    if _MEMORY is None:
        import fakeredis

        _MEMORY = fakeredis.FakeServer()
    return _MEMORY


def flush_memory() -> None:
    """Empty the in-process fake server (tests)."""
    import fakeredis

    fakeredis.FakeRedis(server=memory_server()).flushall()


def _sentinel(url: str, socket_timeout_s: float) -> aioredis.Redis:
    # redis+sentinel://host1:26379,host2:26379/service_name[/db]
    from redis.asyncio.sentinel import Sentinel

    rest = url.removeprefix("redis+sentinel://")
    hosts, _, path = rest.partition("/")
    service, _, db = path.partition("/")
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.partition(":")
        nodes.append((name, int(port or 26379)))
    sentinel = Sentinel(nodes, socket_timeout=socket_timeout_s)  # type: ignore[no-untyped-call]
    master: aioredis.Redis = sentinel.master_for(service or "mymaster", db=int(db or 0))
    return master


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def json_object(raw: Any) -> dict[str, Any] | None:
    """A stored JSON object, or None for a missing key (or anything that is not one)."""
    if raw is None:
        return None
    try:
        found = json.loads(as_text(raw))
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
