"""`github-broker sandbox` end to end, its offline settings, and `labels init`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from github_broker.agent.client import BrokerClient
from github_broker.errors import ConfigError
from github_broker.models import Claimed
from github_broker.rules import Rules
from github_broker.sandbox import BrokerWatcher, cmd_labels_init, sandbox_settings
from github_broker.simulator import Simulator
from github_broker.store import Store, flush_memory
from github_broker.sync import index_item
from tests.conftest import free_port
from tests.factories import issue


def sandbox_cli(*args: str) -> list[str]:
    """`github-broker sandbox ...` once cli.py registers it, else the sandbox module's entry."""
    from github_broker.cli import build_parser

    parser = build_parser()
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if any("sandbox" in a.choices for a in subcommands):
        return [sys.executable, "-m", "github_broker", "sandbox", *args]
    return [sys.executable, "-m", "github_broker.sandbox", "sandbox", *args]


class Output:
    """Lines of a process's output, collected by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        self._stream = proc.stdout
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line.rstrip("\n"))

    def index(self, pattern: str, timeout_s: float, after: int = 0) -> tuple[int, re.Match[str]]:
        """Position and match of the first line at or after `after` matching `pattern`."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, line in enumerate(self.lines[after:], start=after):
                match = re.search(pattern, line)
                if match:
                    return i, match
            assert time.monotonic() < deadline, f"no line matching {pattern!r} in:\n{self.text}"
            time.sleep(0.1)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def join(self) -> None:
        self._thread.join(timeout=5)


@pytest.fixture
def sandbox() -> Iterator[tuple[subprocess.Popen[str], Output, str]]:
    port = free_port()
    proc = subprocess.Popen(
        sandbox_cli("--port", str(port), "--agents", "1", "--work-seconds", "1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = Output(proc)
    yield proc, output, f"http://127.0.0.1:{port}"
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    output.join()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.mark.slow
def test_sandbox_runs_a_task_cycle_serves_an_sdk_client_and_stops_on_sigint(
    sandbox: tuple[subprocess.Popen[str], Output, str],
) -> None:
    proc, output, url = sandbox
    ready, _ = output.index(r"--- event log", 30)
    assert url in output.text and f"dashboard         {url}/ui" in output.text
    # Two P0 issues and one demo agent: the SDK client gets the one the demo agent does not.
    with BrokerClient(url, "sdk-agent") as client:
        task = client.request_task(wait_seconds=20)
        assert task is not None and task.repository == "demo/sandbox"

        claimed, match = output.index(
            r"demo-agent-1 claimed demo/sandbox#(\d+) \(development", 60, ready
        )
        n = match.group(1)
        assert n != str(task.issue_id)
        completed, _ = output.index(rf"demo-agent-1 completed demo/sandbox#{n}\b", 60, claimed)
        output.index(rf"github: PR #\d+ opened: \S+ -> main, 'Closes #{n}'", 60, claimed)
        output.index(rf"github: #{n} labels .*\+needs-review", 60, completed)
        output.index(
            rf"broker: sdk-agent claimed demo/sandbox#{task.issue_id} \(development\)", 30, ready
        )
        client.release(task)
        output.index(rf"broker: sdk-agent abandoned demo/sandbox#{task.issue_id}\b", 30, ready)

    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=40) in (0, 130)
    output.join()
    assert "sandbox stopped" in output.text
    assert "Traceback" not in output.text


def test_sandbox_refuses_environment_that_would_reach_real_github(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_BROKER_GITHUB__BASE_URL", "https://api.github.com")
    with pytest.raises(ConfigError, match="GITHUB_BROKER_GITHUB__BASE_URL"):
        sandbox_settings("http://127.0.0.1:9", "memory://", 8080)


def test_sandbox_settings_are_offline_with_short_intervals() -> None:
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    assert settings.github.base_url == "http://127.0.0.1:9"
    assert [r.full_name for r in settings.repositories] == ["demo/sandbox"]
    assert settings.poll.interval_s <= 2 and settings.leases.lease_ttl_s == 120


def test_labels_init_creates_the_label_set_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = {"repositories": [{"owner": "acme", "name": "widgets", "labels": ["P0"]}]}
    with Simulator(seed) as sim:
        monkeypatch.setenv("GITHUB_BROKER_GITHUB__BASE_URL", sim.base_url)
        monkeypatch.setenv("GITHUB_BROKER_GITHUB__TOKEN", "test-token")
        monkeypatch.setenv("GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES", "0")
        args = argparse.Namespace(config=tmp_path / "no-config", repo="acme/widgets")

        assert cmd_labels_init(args) == 0
        first = capsys.readouterr().out
        assert cmd_labels_init(args) == 0
        second = capsys.readouterr().out

        names = {label["name"] for label in sim.state.list_labels("acme", "widgets")}
    expected = {
        "P0",
        "P1",
        "P2",
        "P3",
        "BACKENDCODER",
        "TESTER",
        "in-progress",
        "needs-review",
        "review-done",
        "needs-human",
        "story",
        "epic",
    }
    assert expected <= names
    assert "exists   acme/widgets  P0" in first and "created  acme/widgets  P1" in first
    assert "created" not in second.replace(" 0 created", "")


def test_broker_watcher_logs_other_agents_and_summarises_an_empty_backlog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    flush_memory()

    async def seed_and_work() -> None:
        store = Store.from_settings(settings)
        rstore = store.repo("demo/sandbox")
        rules = Rules(settings)
        items = [
            issue(1, "P0", "BACKENDCODER"),
            issue(2, "P0", "BACKENDCODER", text="no deliverables here"),
            issue(3, "P1", "BACKENDCODER"),
        ]
        await rstore.upsert_issues([index_item(rules, i, "main") for i in items])
        await rstore.save_sync_state({}, rebuilt=True)  # the mirror is complete
        for agent in ("my-agent", "demo-agent-1"):
            got = await rstore.claim(
                agent, previous="completed", mode="best_effort", base_branch="main", roles=None
            )
            assert isinstance(got, Claimed)
            assert (await rstore.finish(got.issue.number, agent, got.token, "completed"))[0]
        await store.close()

    caplog.set_level(logging.INFO, logger="github_broker.sandbox")
    watcher = BrokerWatcher(settings, ["demo-agent-1"], interval_s=0.05)
    asyncio.run(seed_and_work())
    watcher.start()
    try:
        deadline = time.monotonic() + 20
        while "ran out" not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
    finally:
        watcher.stop()
        flush_memory()
    text = caplog.text
    assert "broker: my-agent claimed demo/sandbox#1 (development)" in text
    assert "broker: my-agent completed demo/sandbox#1" in text
    assert "demo-agent-1 claimed" not in text  # its runner logs it already
    assert "done (2): #1 by my-agent, #3 by demo-agent-1" in text
    assert "#2 Task 2: body has no deliverables section" in text
    assert "waiting (2):" in text and "#1: no claimable task for it now" in text
    assert "#3: no claimable task for it now" in text
