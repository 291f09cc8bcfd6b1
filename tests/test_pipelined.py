"""The store's pipelined Redis client (store/resp.py) on real redis-servers: replies matched
under concurrency, NOSCRIPT, restarts, stalls, error mapping, the URL's AUTH, db and socket."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from github_broker.errors import Fenced, MirrorRebuilding, StoreUnavailable
from github_broker.settings import Settings
from github_broker.store import MEMORY_URL, Store, connect
from github_broker.store.connection import translate_errors
from github_broker.store.resp import Pipelined, PipelinedScript, close_pipelined, pipelined_for
from tests.conftest import _redis_exe, free_port

ECHO = "return {ARGV[1], tonumber(ARGV[2]) * 2}"
ERROR = "return redis.error_reply(ARGV[1])"
#: Busy for ARGV[1] ms inside Redis (Redis answers nothing else meanwhile).
BUSY = (
    "local t = redis.call('TIME') local start = t[1] * 1000 + t[2] / 1000 "
    "while true do t = redis.call('TIME') "
    "if t[1] * 1000 + t[2] / 1000 - start >= tonumber(ARGV[1]) then return 'done' end end"
)


class Server:
    """A redis-server of this test's own, on a fixed port, that may be killed and restarted."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="gb-resp-")
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen(
            [
                _redis_exe(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, password=self._password()) as c:
                    c.ping()
                return self
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def _password(self) -> str | None:
        if "--requirepass" not in self.extra:
            return None
        return self.extra[self.extra.index("--requirepass") + 1]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server().start()
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.signal(signal.SIGCONT)
        s.kill()


class Bounded:
    """What the store's calls are: `translate_errors` with a call bound."""

    def __init__(self, client: Pipelined, call_timeout_s: float = 5.0) -> None:
        self.client = client
        self.call_timeout_s = call_timeout_s
        self.echo = PipelinedScript(client, ECHO)
        self.error = PipelinedScript(client, ERROR)
        self.busy = PipelinedScript(client, BUSY)

    @translate_errors
    async def call(self, script: str, *args: Any) -> Any:
        return await getattr(self, script)(keys=[], args=list(args))


def pipelined(url: str, **kw: Any) -> Pipelined:
    client = aioredis.Redis.from_url(url, socket_connect_timeout=0.5)
    found = pipelined_for(client, **kw)
    assert found is not None
    found._owner = client  # type: ignore[attr-defined]  # keep the redis-py client alive
    return found


async def each_gets_its_own(store: Bounded, n: int = 500) -> None:
    replies = await asyncio.gather(*(store.call("echo", f"r{i}", i) for i in range(n)))
    assert replies == [[f"r{i}".encode(), 2 * i] for i in range(n)]


@pytest.mark.anyio
async def test_concurrent_calls_each_get_their_own_reply_over_one_connection(
    redis_url: str,
) -> None:
    client = pipelined(redis_url)
    store = Bounded(client)
    try:
        await each_gets_its_own(store, 2000)
        link = client._link
        # Errors in between stay with their own call.
        calls = [
            store.call("error", f"E{i}") if i % 3 == 0 else store.call("echo", f"r{i}", i)
            for i in range(300)
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        for i, got in enumerate(results):
            if i % 3 == 0:
                assert isinstance(got, StoreUnavailable) and f"E{i}" in str(got)
            else:
                assert got == [f"r{i}".encode(), 2 * i]
        assert client._link is link  # one connection for all of it
        with redis.Redis.from_url(redis_url) as c:
            assert sum(1 for x in c.client_list() if x["cmd"] in ("evalsha", "script|load")) <= 1
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_calls_held_behind_a_slow_script_go_out_when_it_answers(redis_url: str) -> None:
    """A 300 ms script in flight: calls made meanwhile are held (Redis has said nothing for
    over HOLD_S), then written when its reply comes, each getting its own reply, more than
    MAX_IN_FLIGHT of them included."""
    from github_broker.store.resp import HOLD_S, MAX_IN_FLIGHT

    client = pipelined(redis_url)
    store = Bounded(client)
    try:
        await store.call("echo", "warm", 1)
        busy = asyncio.ensure_future(store.call("busy", 300))
        await asyncio.sleep(HOLD_S * 2)
        started = time.monotonic()
        held = asyncio.ensure_future(each_gets_its_own(store, MAX_IN_FLIGHT * 3))
        await asyncio.sleep(0.05)
        link = client._link
        assert link is not None and len(link.outgoing) == MAX_IN_FLIGHT * 3  # none written
        assert await busy == b"done"
        await held
        assert time.monotonic() - started < 2.0
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_error_replies_map_as_redis_pys_did(redis_url: str) -> None:
    client = pipelined(redis_url)
    store = Bounded(client)
    try:
        with pytest.raises(Fenced, match="epoch 3"):
            await store.call("error", "FENCED epoch 3")
        with pytest.raises(MirrorRebuilding, match=r"^the mirror is gone$"):
            await store.call("error", "REBUILDING the mirror is gone")
        with pytest.raises(StoreUnavailable, match=r"Redis error: .*nope"):
            await store.call("error", "nope")
        wrong = PipelinedScript(client, "return redis.call('INCR', KEYS[1])")
        await client.execute("SET", "text", "abc")
        with pytest.raises(StoreUnavailable, match="not an integer"):
            await translate_errors(lambda: wrong(keys=["text"]))()
        await each_gets_its_own(store, 50)
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_noscript_after_script_flush_loads_and_runs_again(redis_url: str) -> None:
    client = pipelined(redis_url)
    store = Bounded(client)
    try:
        assert await store.call("echo", "a", 1) == [b"a", 2]
        with redis.Redis.from_url(redis_url) as c:
            c.script_flush()
            assert c.script_exists(store.echo.sha) == [False]
        # Many calls at once all meet NOSCRIPT; each loads the script and gets its reply.
        await each_gets_its_own(store, 200)
        with redis.Redis.from_url(redis_url) as c:
            assert c.script_exists(store.echo.sha) == [True]
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_redis_killed_fails_calls_then_reconnects_after_restart(server: Server) -> None:
    client = pipelined(server.url)
    store = Bounded(client)
    try:
        await each_gets_its_own(store, 100)
        # In flight when Redis dies: every call fails, none hangs.
        calls = asyncio.gather(*(store.call("busy", 300) for _ in range(3)), return_exceptions=True)
        await asyncio.sleep(0.1)
        server.kill()
        results = await calls
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Redis unavailable"):
            await store.call("echo", "down", 1)
        assert time.monotonic() - started < 0.5
        server.start()  # same port, no scripts: reconnect, NOSCRIPT, load
        await each_gets_its_own(store, 100)
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_redis_restarted_while_idle_costs_no_failed_call(server: Server) -> None:
    client = pipelined(server.url)
    store = Bounded(client)
    try:
        assert await store.call("echo", "x", 1) == [b"x", 2]
        server.kill()
        await asyncio.sleep(0.05)  # the loop sees the EOF, as a serving process would at once
        server.start()
        assert await store.call("echo", "y", 2) == [b"y", 4]
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_call_in_flight_when_the_connection_breaks_runs_at_most_once() -> None:
    """A server that reads a command and closes the connection without an answer: the call
    fails and is not sent again on a new connection (the script may have run)."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if data == b"*1\r\n$4\r\nPING\r\n":  # the connect's handshake
                writer.write(b"+PONG\r\n")
                continue
            received.append(data)
            break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = Pipelined(port=server.sockets[0].getsockname()[1])
    try:
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.execute("INCR", "k")
        await asyncio.sleep(0.1)
        assert received == [b"*2\r\n$4\r\nINCR\r\n$1\r\nk\r\n"]
    finally:
        await client.aclose()
        server.close()


@pytest.mark.anyio
async def test_calls_made_while_redis_is_stalled_are_not_run_when_it_wakes(
    server: Server,
) -> None:
    """50 callers keep calling a SIGSTOP'd Redis for 2 s, each call given up after 0.2 s:
    only the calls written before Redis was seen not answering (one per caller at most, never
    more than MAX_IN_FLIGHT) run when it wakes, not the hundreds that failed meanwhile, and
    no reconnect writes to a server that does not answer."""
    client = pipelined(server.url, stall_s=0.2)
    store = Bounded(client, call_timeout_s=0.2)
    incr = PipelinedScript(client, "return redis.call('INCR', 'late')")
    admin = redis.Redis(port=server.port)
    try:
        await incr()  # connected, the script loaded
        admin.set("late", 0)
        server.signal(signal.SIGSTOP)
        failed = 0
        until = time.monotonic() + 2.0

        async def caller() -> None:
            nonlocal failed
            while time.monotonic() < until:
                try:
                    await translate_errors(lambda _: incr())(store)
                except StoreUnavailable:
                    failed += 1
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(caller() for _ in range(50)))
        server.signal(signal.SIGCONT)
        await asyncio.sleep(0.5)
        ran = int(admin.get("late") or 0)
        assert failed >= 300
        assert ran <= 50, f"{ran} of {failed} failed calls ran after Redis woke"
        assert await store.call("echo", "z", 3) == [b"z", 6]
    finally:
        admin.close()
        await client.aclose()


@pytest.mark.anyio
async def test_stalled_redis_calls_end_at_their_bound_and_later_ones_are_right(
    server: Server,
) -> None:
    client = pipelined(server.url, stall_s=0.3)
    store = Bounded(client, call_timeout_s=0.3)
    try:
        await each_gets_its_own(store, 50)
        server.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            results = await asyncio.gather(
                *(store.call("echo", f"s{i}", i) for i in range(20)), return_exceptions=True
            )
            assert all(isinstance(r, StoreUnavailable) for r in results), results
            assert "did not answer within 0.3s" in str(results[0])
            assert time.monotonic() - started < 1.0
            # Still stalled: a new connection's calls are bounded too.
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                await store.call("echo", "again", 1)
            assert time.monotonic() - started < 1.0
        finally:
            server.signal(signal.SIGCONT)
        # The woken server first works off what the stall left (the calls written before it
        # stopped, a new connection's handshake): on a slow machine that can outlast one
        # 0.3 s bound. Once it answers, every later call must get its own reply.
        deadline = time.monotonic() + 10
        while True:
            try:
                await store.call("echo", "awake", 1)
                break
            except StoreUnavailable:
                if time.monotonic() > deadline:
                    raise
        # What is checked now is each reply's place, not speed: 300 calls under 0.3 s bounds
        # failed once on a machine loaded by the rest of the suite.
        store.call_timeout_s = 5.0
        await each_gets_its_own(store, 300)
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_a_call_that_gave_up_has_its_reply_dropped_not_given_to_the_next(
    redis_url: str,
) -> None:
    client = pipelined(redis_url, stall_s=30)
    store = Bounded(client, call_timeout_s=5)
    try:
        await store.call("echo", "warm", 1)
        link = client._link
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await store.busy(args=[400])
        # Its reply ("done") is still to come on this connection; the next calls skip it.
        await each_gets_its_own(store, 100)
        assert client._link is link
        assert not link.waiting
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_calls_in_flight_when_the_client_closes_fail_and_do_not_reconnect(
    redis_url: str,
) -> None:
    client = pipelined(redis_url)
    store = Bounded(client)
    await store.call("echo", "warm", 1)
    busy = asyncio.ensure_future(store.call("busy", 200))
    await asyncio.sleep(0.05)
    await client.aclose()
    with pytest.raises(StoreUnavailable, match="closed by the client"):
        await busy
    assert client._link is None and not client._links


@pytest.mark.anyio
async def test_a_connect_under_way_when_the_client_closes_leaves_no_connection(
    server: Server,
) -> None:
    client = pipelined(server.url)
    call = asyncio.ensure_future(client.execute("PING"))
    await asyncio.sleep(0)  # the connect has started
    await client.aclose()
    with pytest.raises(redis.exceptions.ConnectionError, match="closed by the client"):
        await call
    assert client._link is None and not client._links
    with redis.Redis(port=server.port) as admin:
        assert admin.info("clients")["connected_clients"] == 1  # the admin connection alone


@pytest.mark.anyio
async def test_a_new_connection_waits_out_a_busy_redis_within_the_call_bound(
    server: Server,
) -> None:
    """Redis busy with a 1.3 s script answers a new connection's handshake late; within the
    call bound (2 s here) that is a slow answer, not a failed connect (the connect timeout,
    0.5 s, bounds the TCP connect alone)."""
    busy_client = pipelined(server.url)
    client = pipelined(server.url, stall_s=2.0)
    store = Bounded(client, call_timeout_s=2.0)
    try:
        busy = asyncio.ensure_future(Bounded(busy_client).call("busy", 1300))
        await asyncio.sleep(0.2)
        assert await store.call("echo", "late", 1) == [b"late", 2]
        assert await busy == b"done"
    finally:
        await client.aclose()
        await busy_client.aclose()


@pytest.mark.anyio
async def test_a_call_given_up_before_it_was_written_never_runs(redis_url: str) -> None:
    client = pipelined(redis_url)
    try:
        await client.execute("PING")
        call = asyncio.ensure_future(client.execute("INCR", "counter"))
        await asyncio.sleep(0)  # queued for this iteration's write
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await client.execute("GET", "counter") is None
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_unreachable_redis_fails_fast() -> None:
    client = pipelined(f"redis://127.0.0.1:{free_port()}/0")
    store = Bounded(client)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match="Redis unavailable"):
        await store.call("echo", "x", 1)
    assert time.monotonic() - started < 0.5
    await client.aclose()


@pytest.fixture
def secured() -> Iterator[Server]:
    sock = os.path.join(tempfile.mkdtemp(prefix="gb-sock-"), "redis.sock")
    s = Server(
        "--requirepass",
        "s3cret",
        "--user",
        "alice",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "--unixsocket",
        sock,
    ).start()
    s.sock = sock  # type: ignore[attr-defined]
    yield s
    s.kill()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "make_url",
    [
        lambda s: f"redis://:s3cret@127.0.0.1:{s.port}/3",
        lambda s: f"redis://alice:pw@127.0.0.1:{s.port}/3",
        lambda s: f"unix://alice:pw@{s.sock}?db=3",
    ],
    ids=["password", "user", "unix-socket"],
)
async def test_auth_db_and_unix_socket_from_the_url(
    secured: Server, make_url: Callable[[Server], str]
) -> None:
    client = pipelined(make_url(secured))
    try:
        script = PipelinedScript(client, "return redis.call('SET', KEYS[1], ARGV[1])")
        assert await script(keys=["where"], args=["db3"]) == b"OK"
        with redis.Redis(port=secured.port, password="s3cret", db=3) as c:
            assert c.get("where") == b"db3"
        with redis.Redis(port=secured.port, password="s3cret", db=0) as c:
            assert c.get("where") is None
    finally:
        await client.aclose()


@pytest.mark.anyio
async def test_wrong_password_is_store_unavailable(secured: Server) -> None:
    client = pipelined(f"redis://:wrong@127.0.0.1:{secured.port}/0")
    with pytest.raises(StoreUnavailable):
        await Bounded(client).call("echo", "x", 1)
    await client.aclose()


@pytest.mark.anyio
async def test_which_clients_pipeline_their_scripts(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    assert pipelined_for(connect(MEMORY_URL)) is None
    assert pipelined_for(aioredis.Redis.from_url("rediss://127.0.0.1:1/0")) is None
    assert pipelined_for(connect("redis+sentinel://127.0.0.1:1/mymaster")) is None
    assert pipelined_for(connect("redis+cluster://127.0.0.1:1")) is None
    unix = pipelined_for(aioredis.Redis.from_url("unix:///tmp/x.sock?db=2"))
    assert unix is not None and unix.path == "/tmp/x.sock" and unix.db == 2
    store = Store.from_settings(make_settings(redis={"url": redis_url}))
    memory = Store.from_settings(make_settings(redis={"url": MEMORY_URL}))
    try:
        repo = store.repo("acme/widgets")
        assert all(isinstance(s, PipelinedScript) for s in repo.scripts.repo.values())
        assert isinstance(store.scripts.leader, PipelinedScript)
        assert all(
            isinstance(s, AsyncScript) for s in memory.repo("acme/widgets").scripts.repo.values()
        )
        assert await repo.reap() == 0
    finally:
        await store.close()
        await memory.close()
    await close_pipelined(store.client)  # closing twice is harmless
