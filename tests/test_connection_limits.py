"""Idle connections cannot take the API down: a real `serve` under a 1,024 file limit keeps
answering while a client holds 2,000 connections that sent half a request header; such a
connection is closed after server.header_timeout_s; serve raises its soft file limit."""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from github_broker.processes.connections import ConnectionGuard, connection_limits
from github_broker.simulator import Simulator
from tests.processes import BrokerProcess, broker_env
from tests.world import ONE_ISSUE, simulated

#: Half a request: the request line and one header, never the blank line that ends them.
HALF_HEADER = b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
#: Idle connections the hostile client opens.
IDLE = 2000


def file_limit(soft: int, hard: int) -> Callable[[], None]:
    """A preexec_fn: the child (serve and everything it starts) runs under these limits."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


@pytest.fixture
def own_files() -> None:
    """This test process needs a descriptor per idle connection, and some."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 200:
        if hard != resource.RLIM_INFINITY and hard < IDLE + 200:
            pytest.skip(f"the test needs {IDLE + 200} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (IDLE + 200, hard))


def open_half_headers(port: int, count: int, timeout_s: float = 30.0) -> list[socket.socket]:
    """`count` connections, each sent HALF_HEADER once connected; returns them all (some may
    have been closed by the server since)."""
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(count):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE)
        socks.append(s)
    pending = len(socks)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            sel.unregister(s)
            pending -= 1
            with contextlib.suppress(OSError):  # refused or closed: the server made room
                s.send(HALF_HEADER)
    sel.close()
    return socks


def timed(call: Callable[[], requests.Response]) -> tuple[float, int]:
    started = time.perf_counter()
    response = call()
    return time.perf_counter() - started, response.status_code


def test_2000_idle_half_open_connections_under_a_1024_file_limit_leave_the_api_answering(
    sim: Simulator, redis_url: str, tmp_path: Path, own_files: None
) -> None:
    env = broker_env(redis_url, sim.base_url, "acme/widgets")
    broker = BrokerProcess(env, tmp_path, "broker", preexec_fn=file_limit(1024, 1024)).start()
    socks: list[socket.socket] = []
    try:
        socks = open_half_headers(broker.port, IDLE)
        time.sleep(0.5)  # let the worker settle what it accepted
        url = broker.url
        samples = [timed(lambda: requests.get(f"{url}/health", timeout=5)) for _ in range(20)]
        samples += [
            timed(
                lambda i=i: requests.post(
                    f"{url}/request-task", json={"agent_id": f"agent-{i}"}, timeout=5
                )
            )
            for i in range(10)
        ]
        # Before the limits every one of these timed out. On a machine shared with other work
        # a sample can wait for a CPU now and then: nine in ten within 100 ms (measured alone:
        # median 5 ms, slowest 37 ms), none stalled.
        times = sorted(round(s * 1000) for s, _ in samples)
        assert times[int(len(times) * 0.9)] < 100, f"answers (ms): {times}"
        assert times[-1] < 1000, f"answers (ms): {times}"
        assert {code for _, code in samples} <= {200, 204}
        assert broker.proc is not None and broker.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        broker.stop()
    log = broker.log_path.read_text()
    assert "out of system resource" not in log, log[-2000:]
    assert "to make room" in log


def test_a_half_sent_header_is_closed_after_the_header_timeout(
    sim: Simulator, redis_url: str, tmp_path: Path
) -> None:
    env = broker_env(
        redis_url, sim.base_url, "acme/widgets", GITHUB_BROKER_SERVER__HEADER_TIMEOUT_S="1"
    )
    broker = BrokerProcess(env, tmp_path, "broker", preexec_fn=file_limit(512, 1024)).start()
    try:
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(HALF_HEADER)
            started = time.monotonic()
            assert s.recv(100) == b""  # closed by the broker, not answered
            assert 0.8 < time.monotonic() - started < 5
        # A kept-alive connection that starts a second request and stalls: the same.
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as s:
            s.sendall(HALF_HEADER + b"\r\n")
            assert s.recv(1000).startswith(b"HTTP/1.1 200")
            s.sendall(HALF_HEADER)
            started = time.monotonic()
            while s.recv(1000):
                pass
            assert time.monotonic() - started < 5
        # serve raised its soft file limit to the hard one, for every process under it.
        limits = [
            line
            for pid in broker.pids()
            for line in Path(f"/proc/{pid}/limits").read_text().splitlines()
            if line.startswith("Max open files")
        ]
        assert limits and all(line.split()[3:5] == ["1024", "1024"] for line in limits), limits
    finally:
        broker.stop()


def test_connection_limits_leave_room_for_accept_batches() -> None:
    assert connection_limits(4096, 1024) == (480, 120)
    assert connection_limits(4096, 1_048_576) == (4096, 2048)
    assert connection_limits(100, 20_000) == (100, 2048)


class Conn:
    """A stand-in for a protocol: the guard only closes its transport."""

    def __init__(self) -> None:
        self.transport = self
        self.is_closed = False

    def close(self) -> None:
        self.is_closed = True


@pytest.mark.anyio
async def test_guard_closes_the_oldest_idle_connection_to_make_room() -> None:
    guard = ConnectionGuard(3, 60)
    a, b, c, d, e = (Conn() for _ in range(5))
    for conn in (a, b, c):
        guard.opened(conn)
    guard.busy(a)  # a request in progress: never closed for room
    guard.opened(d)
    assert (a.is_closed, b.is_closed, c.is_closed, d.is_closed) == (False, True, False, False)
    guard.closed(b)
    guard.busy(c)
    guard.busy(d)
    guard.opened(e)  # every held connection is busy: the new one cannot be served
    assert e.is_closed and guard.held == 3
