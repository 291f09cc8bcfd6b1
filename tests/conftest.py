"""Test fixtures: a real redis-server per session on a free port, settings factories."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from github_broker.settings import Settings, load_settings

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """A redis-server of our own, never the machine's shared one on 6379."""
    exe = shutil.which("redis-server")
    if exe is None:
        message = (
            "redis-server is not installed (make install-redis, or apt-get install redis-server)"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="gb-redis-")
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
            os.path.join(workdir, "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
    client.close()
    yield url
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


@pytest.fixture(params=["redis-server", "fakeredis"])
def lua_redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both engines the Lua scripts must behave the same on: a real server (Lua 5.1) and the
    sandbox's in-process fakeredis (lupa)."""
    if request.param == "fakeredis":
        from github_broker.store import MEMORY_URL, flush_memory

        flush_memory()
        yield MEMORY_URL
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
        return load_settings(tmp_path / "no-config", github=github, **overrides)

    return factory
