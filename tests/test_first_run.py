"""What a new user meets first: the sandbox refusing an exported GITHUB_BROKER_* variable
without a traceback, `status` and `explain` finding a running sandbox, no "mirror is gone"
warning on a fresh start, and no scheduler warning every second while a slow pass runs."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from github_broker.settings import Settings
from tests.conftest import free_port
from tests.test_sandbox import Output
from tests.world import ONE_ISSUE, running_world, simulated


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "github_broker", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without GITHUB_BROKER_* variables (a new user's shell), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_BROKER_")}
    return {**env, **extra}


def test_sandbox_with_an_exported_variable_says_why_and_exits_without_a_traceback(
    own_runtime_dir: Path,
) -> None:
    # As the README's "Running it for real" has one export.
    env = clean_env(GITHUB_BROKER_REPOSITORIES="acme/widgets")
    done = subprocess.run(
        cli("sandbox", "--port", str(free_port()), "--agents", "0"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "unset them to run the sandbox" in done.stderr
    assert "GITHUB_BROKER_REPOSITORIES" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not list(own_runtime_dir.iterdir())  # no state file left behind


@pytest.fixture
def running_sandbox(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A sandbox (no demo agents) and the environment another terminal would have."""
    env = clean_env()
    port = free_port()
    proc = subprocess.Popen(
        cli("sandbox", "--port", str(port), "--agents", "0"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(proc)
    try:
        output.index(r"--- event log", 60)
        yield f"http://127.0.0.1:{port}", env
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            output.join()
            assert proc.stdout is not None
            proc.stdout.close()
    assert "Traceback" not in output.text, output.text
    # A fresh start builds the mirror; nothing was lost (it said so in 3 of 6 starts).
    assert "is gone" not in output.text, output.text
    assert not (tmp_path / "github-broker-sandbox.json").exists()  # it goes with the sandbox


def test_status_and_explain_find_the_running_sandbox(
    running_sandbox: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = running_sandbox
    # From a directory of its own (no ./config), nothing configured: the sandbox is shown.
    status = subprocess.run(
        cli("status"), env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert status.returncode == 0, status.stderr
    assert f"showing the sandbox running at {url}" in status.stderr
    assert "demo/sandbox" in status.stdout and "bucket P0" in status.stdout
    explain = subprocess.run(
        cli("explain", "--sandbox", "--role", "BACKENDCODER"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert explain.returncode == 0, explain.stderr
    assert explain.stdout.startswith("demo/sandbox: ") and "Next: #" in explain.stdout
    as_json = subprocess.run(
        cli("status", "--json"), env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert as_json.returncode == 0 and '"demo/sandbox"' in as_json.stdout


def test_status_without_a_sandbox_or_repositories_says_what_to_do(tmp_path: Path) -> None:
    env = clean_env()
    plain = subprocess.run(
        cli("status"), env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert plain.returncode == 2 and "no repositories configured" in plain.stderr
    asked = subprocess.run(
        cli("status", "--sandbox"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert asked.returncode == 2 and "no sandbox is running" in asked.stderr


@pytest.mark.anyio
async def test_a_fresh_start_builds_the_mirror_and_a_lost_one_is_rebuilt_with_a_warning(
    redis_url: str, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="github_broker.leader.poller")
    with simulated(ONE_ISSUE) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.daemon.hold_leadership()
            await w.daemon.drain_all()  # the write-queue tick came first, on empty Redis
            assert "building the mirror of acme/widgets" in caplog.text
            assert "is gone" not in caplog.text
            assert await w.ask("agent-1") is not None
            await w.store.client.flushall()  # Redis lost everything
            await w.daemon.hold_leadership()
            await w.daemon.drain_all()
            assert "the mirror of acme/widgets is gone: rebuilding it now" in caplog.text


@pytest.mark.anyio
async def test_a_slow_pass_skips_ticks_quietly_and_is_never_overlapped(
    redis_url: str,
    make_settings: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with simulated(ONE_ISSUE) as sim:
        async with running_world(
            sim, redis_url, make_settings, poll={"outbox_interval_s": 0.1}
        ) as w:
            running, overlaps, passes = 0, 0, 0

            async def slow_drain() -> None:
                nonlocal running, overlaps, passes
                running += 1
                overlaps += running > 1
                passes += 1
                await asyncio.sleep(0.6)  # a sync of many repositories holds the drain up
                running -= 1

            monkeypatch.setattr(w.daemon, "drain_all", slow_drain)
            caplog.set_level(logging.INFO)
            await w.daemon.hold_leadership()
            w.daemon.start()
            await asyncio.sleep(2.0)
            await w.daemon.stop()
    assert overlaps == 0 and 2 <= passes <= 4
    assert "maximum number of running instances" not in caplog.text


def quickstart_http_example() -> str:
    """The shell block of docs/quickstart.md's "Any language: plain HTTP"."""
    text = (Path(__file__).parent.parent / "docs" / "quickstart.md").read_text()
    section = text.split("## Any language: plain HTTP", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


@pytest.mark.skipif(
    not (shutil.which("curl") and shutil.which("jq")), reason="the example uses curl and jq"
)
def test_the_quickstart_curl_example_claims_heartbeats_and_completes(
    running_sandbox: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    url, env = running_sandbox
    script = quickstart_http_example()
    assert "B=http://127.0.0.1:8080\n" in script
    script = script.replace("B=http://127.0.0.1:8080\n", f"B={url}\n")
    workdir = tmp_path / "agent"
    workdir.mkdir()
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert '"repository": "demo/sandbox"' in done.stdout
    assert '{"expires_at":' in done.stdout and '{"status":"completed"}' in done.stdout
