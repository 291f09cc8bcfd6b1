"""The dashboard in headless Chromium against a live stack: simulator, serve, redis-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from github_broker.agent.client import BrokerClient
from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator
from tests.factories import body
from tests.processes import BrokerProcess, broker_env

SCREENSHOT = Path(__file__).parent.parent / "docs" / "dashboard.png"
KEYS = RepoKeys("gb", "acme", "widgets")
ISSUES = [
    {
        "number": 11,
        "title": "Payments fail on retry",
        "body": body(),
        "labels": ["P0", "BACKENDCODER"],
    },
    {
        "number": 12,
        "title": "Login page crashes on Safari",
        "body": body("fix/issue-12"),
        "labels": ["P0", "FRONTENDCODER"],
    },
    {
        "number": 13,
        "title": "Export invoices as CSV",
        "body": body("feature/issue-13"),
        "labels": ["P1", "BACKENDCODER"],
    },
    {
        "number": 14,
        "title": "Dark mode",
        "body": body("feature/issue-14"),
        "labels": ["P2", "FRONTENDCODER"],
    },
    {
        "number": 15,
        "title": "Audit logging",
        "body": "No branch named here.",
        "labels": ["P1", "BACKENDCODER"],
    },
    {
        "number": 16,
        "title": "Rate-limit the public API",
        "body": body("feature/issue-16"),
        "labels": ["P1", "BACKENDCODER"],
    },
]


def chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: `make install-chromium` installs it")
        pytest.skip("chromium not installed (make install-chromium)")
    return exe


def browse(exe: str, tmp: Path, url: str, *action: str) -> str:
    profile = tmp / "chromium-profile"
    cmd = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *action,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def wait_until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, Simulator]]:
    with Simulator(
        {"repositories": [{"owner": "acme", "name": "widgets", "issues": ISSUES}]}
    ) as sim:
        env = broker_env(redis_url, sim.base_url, "acme/widgets")
        proc = BrokerProcess(env, tmp_path, "broker").start()
        client = redis.Redis.from_url(redis_url)
        try:
            wait_until(lambda: client.zcard(KEYS.ready) == 5, 30, "the first sync")
        finally:
            client.close()
        try:
            yield proc, sim
        finally:
            proc.stop()


@pytest.mark.slow
def test_dashboard_in_a_real_browser(
    stack: tuple[BrokerProcess, Simulator], tmp_path: Path
) -> None:
    exe = chromium()
    broker, sim = stack
    coder = BrokerClient(broker.url, "coder-ann")
    designer = BrokerClient(broker.url, "designer-bo")
    try:
        first = coder.request_task()
        assert first is not None and first.issue_id == 11
        coder.complete(first)  # the issue now waits for review
        held = designer.request_task(roles=["FRONTENDCODER"])
        assert held is not None and held.issue_id == 12
        # The completion's label writes land, and a sync then sees issue 11 under review
        # (a claim's label wish can be cancelled before it is sent, so "the agent's label
        # is gone" alone proves nothing).
        wait_until(
            lambda: {"needs-review"} <= set(sim.state.issue_labels("acme", "widgets", 11))
            and "coder-ann" not in sim.state.issue_labels("acme", "widgets", 11),
            20,
            "the completion's label writes",
        )
        client = redis.Redis.from_url(broker.env["GITHUB_BROKER_REDIS__URL"])
        try:
            wait_until(lambda: client.sismember(KEYS.reviewing, "11"), 20, "a sync of the review")
        finally:
            client.close()
    finally:
        coder.close()
        designer.close()

    dom = browse(exe, tmp_path, f"{broker.url}/ui", "--dump-dom")
    leases = dom.split('class="leases"')[1].split("</table>")[0]
    assert "Login page crashes on Safari" in leases and "designer-bo" in leases
    assert "/acme/widgets/issues/12" in leases
    blockers = dom.split('class="blockers"')[1].split("</table>")[0]
    assert "development held by designer-bo" in blockers and "waiting for review" in blockers
    queue = dom.split('class="queue"')[1].split("</table>")[0]
    assert "Export invoices as CSV" in queue and "waits for the bucket" in queue
    skipped = dom.split('class="skipped"')[1].split("</table>")[0]
    assert "Audit logging" in skipped
    reviews = dom.split('class="reviews"')[1].split("</table>")[0]
    assert "Payments fail on retry" in reviews and "no linked PR" in reviews
    events = dom.split('class="timeline"')[1]
    for kind in ("claim", "completed", "write_applied", "leader_gained"):
        assert f">{kind}<" in events, kind
    assert 'id="leader"' in dom and "none</dd>" not in dom.split('id="leader"')[1][:40]

    shot = tmp_path / "dashboard.png"
    browse(exe, tmp_path, f"{broker.url}/ui", f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOT"):  # refreshes docs/dashboard.png on request only
        shutil.copyfile(shot, SCREENSHOT)
