"""The dashboard in headless Chromium against a live stack: simulator, serve, redis-server.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages ended by NUL on file descriptors 3 and 4), so no WebDriver or websocket library is
needed: the test logs in, clicks and confirms like a maintainer."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.agent.client import BrokerClient
from github_broker.keys import RepoKeys
from github_broker.models import Task
from github_broker.simulator import Simulator
from tests.factories import body
from tests.processes import BrokerProcess, broker_env
from tests.waiting import wait_until

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


#: Who may log in, and the agents' tokens (the stack is not open: the page needs a login).
ADMIN_TOKEN = "boss-token"
AGENTS = {a: f"t-{a}-0123456789" for a in ("coder-ann", "designer-bo", "tester-cy")}


class Browser:
    """One headless Chromium with one tab, driven over the DevTools protocol on a pipe.
    JavaScript dialogs (confirm) are accepted as they open, and their messages kept."""

    def __init__(self, exe: str, profile: Path) -> None:
        to_chrome, self._out = os.pipe()
        self._in, from_chrome = os.pipe()

        def on_fds_3_and_4() -> None:
            # dup first: the pipes' own numbers may be 3 or 4.
            read_end, write_end = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self.proc = subprocess.Popen(
            [
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
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(3, 4),
            preexec_fn=on_fds_3_and_4,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer = b""
        self._ids = 0
        self.session: str | None = None
        self.dialogs: list[str] = []
        target = self.call("Target.createTarget", {"url": "about:blank"}, browser=True)
        attached = self.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}, browser=True
        )
        self.session = attached["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def _send(self, method: str, params: dict[str, Any], browser: bool = False) -> int:
        self._ids += 1
        message: dict[str, Any] = {"id": self._ids, "method": method, "params": params}
        if self.session and not browser:
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        return self._ids

    def _receive(self, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while b"\0" not in self._buffer:
            assert time.monotonic() < deadline, "chromium did not answer"
            chunk = os.read(self._in, 1 << 16)
            assert chunk, "chromium closed its pipe"
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(
        self, method: str, params: dict[str, Any] | None = None, browser: bool = False
    ) -> dict[str, Any]:
        sent = self._send(method, params or {}, browser)
        while True:
            message = self._receive()
            if message.get("method") == "Page.javascriptDialogOpening":
                self.dialogs.append(message["params"]["message"])
                self._send("Page.handleJavaScriptDialog", {"accept": True})
            if message.get("id") == sent:
                assert "error" not in message, message["error"]
                result: dict[str, Any] = message["result"]
                return result

    def js(self, expression: str) -> Any:
        """Evaluate in the page; None while a navigation replaces it."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        sent = self._send("Runtime.evaluate", params)
        while True:
            message = self._receive()
            if message.get("method") == "Page.javascriptDialogOpening":
                self.dialogs.append(message["params"]["message"])
                self._send("Page.handleJavaScriptDialog", {"accept": True})
            if message.get("id") == sent:
                result = message.get("result", {})
                if "error" in message or "exceptionDetails" in result:
                    return None
                return result["result"].get("value")

    def wait_for(self, expression: str, what: str, timeout_s: float = 15.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (value := self.js(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.1)
        return value

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'", f"{url} to load")

    def click(self, selector: str) -> None:
        """A real click (mouse pressed and released) in the middle of the element."""
        box = self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        assert box, f"nothing matches {selector}"
        for kind in ("mousePressed", "mouseReleased"):
            self.call(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1},
            )

    def type_into(self, selector: str, text: str) -> None:
        self.click(selector)
        self.call("Input.insertText", {"text": text})

    def login(self, base_url: str) -> None:
        self.goto(f"{base_url}/ui")
        assert self.js("location.pathname") == "/ui/login"
        self.type_into("#token", ADMIN_TOKEN)
        self.click("form button[type=submit]")
        self.wait_for(
            "location.pathname === '/ui' && document.readyState === 'complete'", "the dashboard"
        )

    def screenshot(self, path: Path, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        shot = self.call("Page.captureScreenshot", {"format": "png"})
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.call("Browser.close", browser=True)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        os.close(self._out)
        os.close(self._in)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    b = Browser(chromium(), tmp_path / "chromium-profile")
    try:
        yield b
    finally:
        b.close()


@contextmanager
def running_stack(
    redis_url: str, tmp_path: Path, **env: str
) -> Iterator[tuple[BrokerProcess, Simulator]]:
    with Simulator(
        {"repositories": [{"owner": "acme", "name": "widgets", "issues": ISSUES}]}
    ) as sim:
        tokens = json.dumps(AGENTS)
        settings = broker_env(
            redis_url,
            sim.base_url,
            "acme/widgets",
            GITHUB_BROKER_SERVER__ADMIN_TOKEN=ADMIN_TOKEN,
            GITHUB_BROKER_SERVER__AGENT_TOKENS=tokens,
            **env,
        )
        proc = BrokerProcess(settings, tmp_path, "broker").start()
        client = redis.Redis.from_url(redis_url)
        try:
            wait_until(lambda: client.zcard(KEYS.ready) == 5, 30, "the first sync")
        finally:
            client.close()
        try:
            yield proc, sim
        finally:
            proc.stop()


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, Simulator]]:
    with running_stack(redis_url, tmp_path) as running:
        yield running


#: The webhook secret of the health test's stack.
SECRET = "hook-secret"


@pytest.fixture
def stack_with_webhooks(
    redis_url: str, tmp_path: Path
) -> Iterator[tuple[BrokerProcess, Simulator]]:
    env = {
        "GITHUB_BROKER_WEBHOOKS__SECRET": SECRET,
        # Healthy webhooks slow the polling down; the test wants the failing sync soon.
        "GITHUB_BROKER_POLL__INTERVAL_WITH_WEBHOOKS_S": "1",
    }
    with running_stack(redis_url, tmp_path, **env) as running:
        yield running


def deliver(broker: BrokerProcess, text: str, secret: str) -> requests.Response:
    """A ping as GitHub sends it, signed with `secret`."""
    body = text.encode()
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "ping",
        "X-GitHub-Delivery": f"d-{time.monotonic_ns()}",
        "X-Hub-Signature-256": f"sha256={signature}",
    }
    return requests.post(f"{broker.url}/github/webhook", data=body, headers=headers, timeout=10)


def agent(broker: BrokerProcess, name: str) -> BrokerClient:
    return BrokerClient(broker.url, name, token=AGENTS[name])


#: The lease row of issue 12 (ids: `lease-<owner>--<name>-<issue>`).
ROW_12 = "lease-acme--widgets-12"


@pytest.mark.slow
def test_dashboard_in_a_real_browser_revoke_and_live_updates(
    stack: tuple[BrokerProcess, Simulator], browser: Browser, tmp_path: Path
) -> None:
    broker, sim = stack
    coder, designer = agent(broker, "coder-ann"), agent(broker, "designer-bo")
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
            lambda: (
                {"needs-review"} <= set(sim.state.issue_labels("acme", "widgets", 11))
                and "coder-ann" not in sim.state.issue_labels("acme", "widgets", 11)
            ),
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

    browser.login(broker.url)
    dom = browser.js("document.documentElement.outerHTML")
    leases = dom.split('class="leases"')[1].split("</table>")[0]
    assert "Login page crashes on Safari" in leases and "designer-bo" in leases
    assert "/acme/widgets/issues/12" in leases and ">in_progress<" in leases
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
    assert 'id="problems"' not in dom
    # With JavaScript the <noscript> reload is inert: the page changes only in place.
    assert browser.js("!!document.querySelector('meta[http-equiv=refresh]')") is False
    browser.wait_for("document.getElementById('live-state').textContent === 'live'", "the stream")

    # The maintainer opens the lease's controls and says why; the screenshot shows them.
    browser.js("window.notReloaded = true")
    browser.click(f"#{ROW_12} details.act summary")
    reason = f"#{ROW_12} form[action='/ui/actions/revoke'] input[name=reason]"
    browser.type_into(reason, "duplicate of #11")
    shot = tmp_path / "dashboard.png"
    browser.js("window.scrollTo(0, 0)")
    browser.screenshot(shot, 1280, 1400)
    assert shot.stat().st_size > 10_000
    if os.environ.get("UPDATE_SCREENSHOT"):  # refreshes docs/dashboard.png on request only
        shutil.copyfile(shot, SCREENSHOT)

    browser.click(f"#{ROW_12} button.act-revoke")
    assert len(browser.dialogs) == 1 and "designer-bo on acme/widgets#12" in browser.dialogs[0]
    browser.wait_for(f"!document.getElementById('{ROW_12}')", "the lease row to go")
    assert browser.js("window.notReloaded") is True  # changed in place, not reloaded
    flash = browser.js("document.getElementById('flash').textContent")
    assert flash == (
        "revoke acme/widgets#12: lease of designer-bo revoked; designer-bo is not handed #12 "
        "again until a retry; task back in the pool"
    )
    audit = browser.js("document.querySelector('table.audit tbody').textContent")
    assert "admin" in audit and "revoke" in audit and "duplicate of #11" in audit

    # Work done elsewhere reaches the open page over its stream.
    tester = agent(broker, "tester-cy")
    try:
        again = tester.request_task(roles=["FRONTENDCODER"])
        assert again is not None and again.issue_id == 12
        browser.wait_for(
            f"(document.getElementById('{ROW_12}') || {{}}).textContent?.includes('tester-cy')",
            "the new lease to show",
            timeout_s=10,
        )
    finally:
        tester.close()
    assert browser.js("window.notReloaded") is True
    assert browser.js("document.getElementById('live-state').textContent") == "live"


@pytest.mark.slow
def test_health_block_in_a_real_browser_warns_only_when_something_is_wrong(
    stack_with_webhooks: tuple[BrokerProcess, Simulator], browser: Browser
) -> None:
    broker, sim = stack_with_webhooks
    ping = json.dumps({"zen": "Design for failure.", "repository": {"full_name": "acme/widgets"}})
    assert deliver(broker, ping, SECRET).status_code == 200  # webhooks verified: healthy
    browser.login(broker.url)
    assert browser.js("document.getElementById('problems')?.textContent") is None
    sync = browser.js("document.querySelector('table.health td.sync').textContent")
    assert sync.startswith("ok")
    browser.js("window.notReloaded = true")

    # A delivery GitHub would send with a secret the broker does not know, and a repository
    # GitHub stops serving to the broker's token.
    assert deliver(broker, ping, "another-secret").status_code == 401
    sim.faults.add_error(403, path=r"^/repos/acme/widgets/issues", message="Not accessible")
    text = browser.wait_for(
        "(document.getElementById('problems') || {}).textContent?.includes('sync keeps failing')"
        " && document.getElementById('problems').textContent",
        "the warning",
        timeout_s=20,
    )
    assert "check that the repository exists under this name" in text
    assert "webhook deliveries refused" in text and "check the webhook secret" in text
    sync = browser.js("document.querySelector('table.health td.sync').textContent")
    assert sync.startswith("failing") and "403" in sync
    assert browser.js("window.notReloaded") is True


#: Where the browser test's chart screenshots go (with UPDATE_SCREENSHOT=1 only).
TRENDS_SCREENSHOT = Path(__file__).parent.parent / "docs" / "dashboard-trends.png"

#: What the page's charts say, read from their marks and attributes.
CHARTS_JS = """(() => {
  const fig = id => document.getElementById(id);
  const marks = (id, s) => [...fig(id).querySelectorAll(`svg [data-series="${s}"]`)];
  const sum = (id, s) => marks(id, s).reduce((a, e) => a + Number(e.dataset.value), 0);
  const last = (id, s) => {
    const m = marks(id, s);
    return m.length ? Number(m[m.length - 1].dataset.value) : null;
  };
  const q = fig('chart-queue');
  const series = [...new Set([...q.querySelectorAll('svg [data-series]')]
    .map(e => e.dataset.series))];
  return {
    handouts: sum('chart-throughput', 'handouts'),
    completed: sum('chart-throughput', 'completed'),
    failed: sum('chart-throughput', 'failed'),
    handouts_attr: Number(fig('chart-throughput').dataset.handouts),
    queue_now: series.filter(s => s.startsWith('P'))
      .reduce((a, s) => a + last('chart-queue', s), 0),
    queue_points: q.querySelectorAll('svg circle').length,
    to_claim: Number(fig('chart-waits').dataset.toClaimCount),
    to_pr: Number(fig('chart-waits').dataset.toPrCount),
    waits: marks('chart-waits', 'labelled → claimed median').length,
    agents: Object.fromEntries([...fig('chart-agents').querySelectorAll('svg rect[data-value]')]
      .map(e => [e.dataset.series, Number(e.dataset.value)])),
    titled: [...document.querySelectorAll('figure.chart svg')].every(s =>
      s.querySelector('title') && s.querySelector('desc').textContent.length > 20),
  };
})()"""


def timeline_counts(redis_url: str) -> tuple[Counter[str], dict[str, tuple[int, int]]]:
    """Events on the repository's timeline by kind (a development claim as `claim:dev`),
    and each agent's (completed, failed) lease ends."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entries = client.xrange(KEYS.timeline)
    finally:
        client.close()
    kinds: Counter[str] = Counter()
    agents: dict[str, tuple[int, int]] = {}
    for _, f in entries:
        kinds[f["kind"]] += 1
        if f["kind"] == "claim" and f["detail"].startswith("development:"):
            kinds["claim:dev"] += 1
        if f["kind"] == "completed" and f["detail"].startswith("development"):
            kinds["completed:dev"] += 1
        ok, bad = agents.get(f["agent"], (0, 0))
        if f["kind"] == "completed":
            agents[f["agent"]] = (ok + 1, bad)
        elif f["kind"] in ("failed", "abandoned", "expired"):
            agents[f["agent"]] = (ok, bad + 1)
    return kinds, agents


def some_work(broker: BrokerProcess) -> tuple[BrokerClient, Task]:
    """Three hand-outs, a completion and a failure by three agents; designer-bo holds #12
    (its client and task returned; the caller closes the client)."""
    ann, cy = agent(broker, "coder-ann"), agent(broker, "tester-cy")
    bo = agent(broker, "designer-bo")
    try:
        first = ann.request_task(roles=["BACKENDCODER"])
        assert first is not None and first.issue_id == 11
        ann.release(first, "failed")  # back in the pool; ann cools down on it
        again = cy.request_task(roles=["BACKENDCODER"])
        assert again is not None and again.issue_id == 11
        cy.complete(again)
        front = bo.request_task(roles=["FRONTENDCODER"])
        assert front is not None and front.issue_id == 12
    finally:
        ann.close()
        cy.close()
    return bo, front


@pytest.mark.slow
def test_trend_charts_in_a_real_browser_show_what_the_timeline_counted(
    stack: tuple[BrokerProcess, Simulator], browser: Browser, tmp_path: Path
) -> None:
    broker, _ = stack
    redis_url = broker.env["GITHUB_BROKER_REDIS__URL"]
    designer, held = some_work(broker)
    try:
        browser.login(broker.url)
        browser.wait_for("document.getElementById('live-state').textContent === 'live'", "live")
        seen = browser.js(CHARTS_JS)
        kinds, agents = timeline_counts(redis_url)
        assert kinds["claim"] == 3 and kinds["completed"] == 1  # the work above, nothing lost
        assert seen["handouts"] == seen["handouts_attr"] == kinds["claim"]
        assert seen["completed"] == kinds["completed"]
        assert seen["failed"] == kinds["failed"] == 1
        assert seen["to_claim"] == kinds["claim:dev"] == 3
        assert seen["to_pr"] == kinds["completed:dev"] == 1
        assert seen["waits"] == 1
        client = redis.Redis.from_url(redis_url)
        try:
            assert seen["queue_now"] == client.zcard(KEYS.ready) > 0
        finally:
            client.close()
        assert seen["queue_points"] >= 2  # the queue now, and its line of waiting on a person
        assert seen["agents"] == {a: ok / (ok + bad) for a, (ok, bad) in agents.items() if a}
        assert seen["titled"] is True

        # Work done while the page is open: the charts follow over the stream, no reload.
        browser.js("window.notReloaded = true")
        designer.complete(held)
    finally:
        designer.close()
    browser.wait_for(
        "document.getElementById('chart-throughput').dataset.completed === '2'",
        "the new completion in the chart",
        timeout_s=15,
    )
    assert browser.js("window.notReloaded") is True
    if os.environ.get("UPDATE_SCREENSHOT"):  # refreshes docs/dashboard-trends.png on request
        browser.js("document.getElementById('trends').scrollIntoView()")
        shot = tmp_path / "trends.png"
        browser.screenshot(shot, 1280, 820)
        shutil.copyfile(shot, TRENDS_SCREENSHOT)

    # The range switch is a link: the 24 h view counts the same work.
    browser.click("#range-24h")
    browser.wait_for("location.search === '?range=24h'", "the 24 h view")
    browser.wait_for("document.readyState === 'complete'", "the page")
    assert browser.js(CHARTS_JS)["completed"] == 2
    assert browser.js("document.querySelector('#range-24h.current') !== null") is True
