"""Test fixtures: a real redis-server per session on a free port, settings factories."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.cluster

from github_broker.settings import Settings, load_settings
from tests import hermetic
from tests.hermetic import own_runtime_dir

__all__ = ["own_runtime_dir"]

if TYPE_CHECKING:
    from tests.processes import LiveStack

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def pytest_configure(config: pytest.Config) -> None:
    hermetic.configure()
    config.addinivalue_line(
        "markers", "issues(p0, p1): how many P0 and P1 issues a test_concurrency simulator holds"
    )
    config.addinivalue_line(
        "markers", "live_stack(issues=1, env={}): the simulator and broker of the `stack` fixture"
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    hermetic.finish(session)


#: Seconds a port handed out by `free_port` stays claimed for this process: its server has
#: bound it long before (a broker answers within START_TIMEOUT_S).
PORT_CLAIM_S = 120.0
_claims: list[tuple[float, socket.socket]] = []


@atexit.register
def _release_claims() -> None:
    for _, claim in _claims:
        claim.close()


def free_port() -> int:
    """A free loopback port, claimed for this process for PORT_CLAIM_S (an abstract unix
    socket named after it, gone with the process): parallel test workers, and other test runs
    on the machine, pick their ports between their pick and their server's bind as well, and
    must never pick the same one."""
    now = time.monotonic()
    while _claims and now - _claims[0][0] > PORT_CLAIM_S:
        _claims.pop(0)[1].close()
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0github-broker-test-port-{port}")
        except OSError:  # another test process handed it out a moment ago
            claim.close()
            continue
        _claims.append((now, claim))
        return port
    raise RuntimeError("no free port that no other test process claimed")


def sync_client(url: str) -> Any:
    """A blocking client for test assertions, for a redis:// or redis+cluster:// URL."""
    if url.startswith("redis+cluster://"):
        nodes = [
            redis.cluster.ClusterNode(h, int(p))
            for h, _, p in (
                a.partition(":") for a in url.removeprefix("redis+cluster://").split(",")
            )
        ]
        return redis.RedisCluster(startup_nodes=nodes)
    return redis.Redis.from_url(url)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A redis-server of our own, never the machine's shared one on 6379."""
    workdir = tempfile.mkdtemp(prefix="gb-redis-")
    proc, port = _start_redis(_redis_exe(), workdir)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session's server, flushed before each test."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server


@pytest.fixture
def stack(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[LiveStack]:
    """The live stack every agent-side test file shares (test_aio_client, test_client,
    test_presets, test_runner): a simulator and a broker process on this test's Redis, first
    sync done (`tests.processes.LiveStack`). `@pytest.mark.live_stack(issues=N, env={...})`
    sets how many P1 issues acme/widgets holds and the broker's extra environment."""
    from tests.processes import live_stack  # tests.processes imports this module

    marker = request.node.get_closest_marker("live_stack")
    with live_stack(redis_url, tmp_path, **(marker.kwargs if marker else {})) as live:
        yield live


#: Masters of the test cluster; Redis needs at least three.
CLUSTER_NODES = 3


#: Starts of a redis-server on a fresh port when the port was taken before it could bind.
START_ATTEMPTS = 3


def _start_redis(exe: str, workdir: str, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    for _ in range(START_ATTEMPTS - 1):
        started = _try_redis(exe, workdir, *extra)
        if started is not None:
            return started
    started = _try_redis(exe, workdir, *extra)
    if started is None:
        pytest.fail("redis-server did not start")
    return started


def _try_redis(exe: str, workdir: str, *extra: str) -> tuple[subprocess.Popen[bytes], int] | None:
    """A redis-server on a free port, or None if it exited at start (the port was taken
    between its pick and the bind: a client's outgoing connection may take any free port)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--logfile",
            os.path.join(workdir, f"redis-{port}.log"),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                # Ours, not a server that held the port before: its pid is the one we started.
                if client.info("server")["process_id"] == proc.pid:
                    return proc, port
            except redis.ConnectionError:
                pass
            if proc.poll() is not None:
                proc.wait()
                return None
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    finally:
        client.close()


def _redis_exe() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        message = (
            "redis-server is not installed (make install-redis, or apt-get install redis-server)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return exe


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """A three-master Redis Cluster of our own, as a redis+cluster:// URL."""
    exe = _redis_exe()
    cli = shutil.which("redis-cli")
    if cli is None:
        pytest.fail("redis-cli is missing (it comes with redis-server's redis-tools)")
    workdir = tempfile.mkdtemp(prefix="gb-cluster-")
    nodes = [
        _start_redis(
            exe,
            workdir,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            f"nodes-{i}.conf",
            "--cluster-node-timeout",
            "2000",
            # The bus port defaults to port + 10000, impossible for ports above 55535.
            "--cluster-port",
            str(free_port()),
        )
        for i in range(CLUSTER_NODES)
    ]
    addresses = [f"127.0.0.1:{port}" for _, port in nodes]
    subprocess.run(
        [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    probe = redis.Redis(port=nodes[0][1])
    deadline = time.monotonic() + 20
    while probe.cluster("info")["cluster_state"] != "ok":
        assert time.monotonic() < deadline, "the test cluster never became ok"
        time.sleep(0.1)
    probe.close()
    yield "redis+cluster://" + ",".join(addresses)
    for proc, _ in nodes:
        proc.terminate()
        proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["redis-server", "fakeredis", "redis-cluster"])
def lua_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every engine the Lua scripts must behave the same on: a real server (Lua 5.1), a real
    Redis Cluster (every key of a repository in one slot) and the sandbox's in-process
    fakeredis (lupa)."""
    if request.param == "fakeredis":
        from github_broker.store import MEMORY_URL, flush_memory

        flush_memory()
        yield MEMORY_URL
    elif request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster")
        for address in url.removeprefix("redis+cluster://").split(","):
            node = redis.Redis(port=int(address.rsplit(":", 1)[1]))
            node.flushall()
            node.close()
        yield url
    else:
        yield request.getfixturevalue("redis_url")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    """Settings from the embedded defaults plus overrides (nested dicts per section)."""

    def factory(**overrides: Any) -> Settings:
        overrides.setdefault("repositories", ["acme/widgets"])
        github = {
            "base_url": "http://127.0.0.1:9",
            "token": "test-token",
            "seconds_between_writes": 0,
            "timeout_s": 5,
        }
        github.update(overrides.pop("github", {}))
        # FastAPI's TestClient names the host `testserver`: allowed beside loopback's.
        server = {"allowed_hosts": ["testserver"], **overrides.pop("server", {})}
        return load_settings(tmp_path / "no-config", github=github, server=server, **overrides)

    return factory
