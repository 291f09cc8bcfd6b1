"""`github-broker sandbox` end to end (its agents never idle silently: a simulated maintainer,
or the event log saying what a person must do), its offline settings, and `labels init`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from github_broker.agent.client import BrokerClient
from github_broker.claim.rules import Rules
from github_broker.errors import ConfigError
from github_broker.gateway.label_set import cmd_labels_init
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, Task
from github_broker.reports.explain import explain_repo
from github_broker.reports.overview import repo_overview
from github_broker.sandbox import state as sandbox_state
from github_broker.sandbox.maintainer import Maintainer
from github_broker.sandbox.watch import BrokerWatcher
from github_broker.sandbox.world import Options, Sandbox, sandbox_settings
from github_broker.settings import Settings
from github_broker.simulator import DEMO_SEED_PATH, Simulator
from github_broker.store import RepoStore, Store, flush_memory
from tests.conftest import free_port
from tests.factories import issue
from tests.waiting import wait_until

#: The sandbox's intervals shortened further through the environment, so a whole backlog
#: runs in seconds: review delay, poll, no-PR grace, cool-down, own-review fallback, debounce.
FAST = {
    "GITHUB_BROKER_REVIEW__DELAY_S": "1",
    "GITHUB_BROKER_POLL__INTERVAL_S": "0.5",
    "GITHUB_BROKER_PROGRESS__NO_PR_GRACE_S": "2",
    "GITHUB_BROKER_FAILURES__COOLDOWN_S": "1",
    "GITHUB_BROKER_REVIEW__AUTHOR_FALLBACK_S": "1",
    "GITHUB_BROKER_REVIEW__FIX_DEBOUNCE_S": "1",
}
#: The development issues of the demo backlog (#9 is a story, #13 names no branch).
DEMO_WORK = {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12}
#: Of those, the ones blocked on GitHub by others (demo_seed.yaml): #1 blocks #5, #10 blocks
#: #11 and #12. They are handed out once their blockers' PRs are merged.
DEMO_BLOCKED = {5, 11, 12}
#: What the event log says when the agents have nothing to take.
QUIET = r"nothing to hand out now|nothing left for the agents"


def sandbox_cli(*args: str) -> list[str]:
    """`github-broker sandbox ...` once cli.py registers it, else the sandbox module's entry."""
    from github_broker.cli.main import build_parser

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


class Running:
    """A sandbox process: its output, broker API and simulated GitHub."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc = proc
        self.output = Output(proc)
        self.url = f"http://127.0.0.1:{port}"
        self.github_url = ""

    def ready(self) -> int:
        """Index of the event log's first line, once the banner is out."""
        at, _ = self.output.index(r"--- event log", 30)
        _, match = self.output.index(r"simulated GitHub\s+(http://\S+)", 1)
        self.github_url = match.group(1)
        return at

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.output.join()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def start_sandbox(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Running:
        port = free_port()
        proc = subprocess.Popen(
            sandbox_cli("--port", str(port), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Its log directory (kept for a person to read) goes with the test's.
            env={**os.environ, "TMPDIR": str(tmp_path), **(env or {})},
        )
        started.append(Running(proc, port))
        return started[-1]

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def sandbox(
    start_sandbox: Callable[..., Running],
) -> tuple[subprocess.Popen[str], Output, str]:
    running = start_sandbox("--agents", "1", "--work-seconds", "1")
    return running.proc, running.output, running.url


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
    # An agent alone gets its own reviews, and work completed without a PR comes back, soon.
    assert settings.review.author_fallback_s <= 10 and settings.progress.no_pr_grace_s <= 30


def test_sandbox_intervals_are_the_ones_the_quickstart_gives() -> None:
    """docs/quickstart.md: review after 10 s, an agent alone gets the review of its own work
    10 s later, a task completed without a PR comes back after 30 s, a failed one is offered
    to the same agent a minute later."""
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    text = " ".join((Path(__file__).parent.parent / "docs" / "quickstart.md").read_text().split())
    assert (
        "(review after 10 s, an agent alone gets the review of its own work 10 s later, a task "
        "completed without a PR comes back after 30 s, a failed one is offered to the same "
        "agent a minute later)" in text
    )
    assert settings.review.delay_s == 10 and settings.review.author_fallback_s == 10
    assert settings.progress.no_pr_grace_s == 30 and settings.failures.cooldown_s == 60


@pytest.mark.parametrize(("every", "asked_on"), [(3, [3]), (0, [])])
def test_the_maintainer_asks_for_changes_on_every_nth_reviewed_pr_and_never_with_0(
    every: int, asked_on: list[int]
) -> None:
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    with Simulator(DEMO_SEED_PATH) as sim:
        # Without the demo's required check: these PRs never run its fake CI.
        sim.state.delete_protection("demo", "sandbox", "main")
        maintainer = Maintainer(sim, settings, "demo/sandbox", changes_every=every)
        pulls = []
        for n in (1, 2, 3, 4):
            pull = sim.state.create_pull(
                "demo", "sandbox", title=f"Fix #{n}", head=f"feature/fix-{n}", body=f"Closes #{n}"
            )
            pulls.append(pull["number"])
            maintainer._decide(n, pull["number"])
        asked = [
            i + 1
            for i, pr in enumerate(pulls)
            if any(
                r["state"] == "CHANGES_REQUESTED"
                for r in sim.state.list_reviews("demo", "sandbox", pr)
            )
        ]
        merged = [
            i + 1
            for i, pr in enumerate(pulls)
            if sim.state.get_pull("demo", "sandbox", pr)["merged"]
        ]
    assert asked == asked_on
    assert merged == [n for n in (1, 2, 3, 4) if n not in asked_on]


def test_sandbox_short_intervals_yield_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_BROKER_REVIEW__DELAY_S", "1")
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    assert settings.review.delay_s == 1
    assert settings.review.timeout_s == 60  # the rest of the section stays the sandbox's


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


def test_broker_watcher_logs_other_agents_and_says_what_each_waiting_issue_needs_from_a_person(
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
            issue(3, "P1", "BACKENDCODER", "needs-human"),
        ]
        await rstore.upsert_issues([index_item(rules, i, "main") for i in items])
        await rstore.save_sync_state({}, rebuilt=True)  # the mirror is complete
        got = await rstore.claim(
            "my-agent", previous="completed", mode="strict", base_branch="main", roles=None
        )
        assert isinstance(got, Claimed) and got.issue.number == 1
        assert (await rstore.finish(1, "my-agent", got.token, "completed"))[0]
        await rstore.remove_issues([1])  # its PR was merged: the issue closed
        await store.close()

    caplog.set_level(logging.INFO, logger="github_broker.sandbox.watch")
    hints = ["  what a person does here: merge with curl"]
    watcher = BrokerWatcher(settings, "demo/sandbox", ["demo-agent-1"], hints, interval_s=0.05)
    asyncio.run(seed_and_work())
    watcher.start()
    try:
        wait_until(
            lambda: "nothing left for the agents" in caplog.text,
            20,
            "'nothing left for the agents' logged",
        )
    finally:
        watcher.stop()
        flush_memory()
    text = caplog.text
    assert "broker: my-agent claimed demo/sandbox#1 (development)" in text
    assert "broker: my-agent completed demo/sandbox#1" in text
    assert "backlog of demo/sandbox: nothing left for the agents; 1 wait on a person" in text
    assert "done (1): #1 by my-agent" in text
    assert "#3 Task 3: labelled needs-human: look at it, then retry it" in text
    assert "#2 Task 2: body has no deliverables section" in text
    assert hints[0] in text


#: A list of labels in parentheses, as the idle lines once dumped: "(BACKENDCODER, P0, a, b)".
LABEL_DUMP = re.compile(r"\((?:[\w.-]+, ){2,}[\w.-]+\)")
#: A task id as the indexes name it: "development:6".
TASK_ID = re.compile(r"\b(?:development|review|fix):\d+\b")


async def seed_one_claimed(settings: Settings, *numbers: int) -> tuple[Store, RepoStore, Claimed]:
    """The sandbox's store with P0 issues `numbers` mirrored, the first claimed by my-agent."""
    store = Store.from_settings(settings)
    rstore = store.repo("demo/sandbox")
    rules = Rules(settings)
    items = [index_item(rules, issue(n, "P0", "BACKENDCODER"), "main") for n in numbers]
    await rstore.upsert_issues(items)
    await rstore.save_sync_state({}, rebuilt=True)  # the mirror is complete
    got = await rstore.claim(
        "my-agent", previous="completed", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(got, Claimed) and got.issue.number == numbers[0]
    return store, rstore, got


def test_an_issue_just_completed_is_explained_in_words_not_as_labels_or_task_ids() -> None:
    """#1 completed, its labels not yet on GitHub: explain's verdict, the sandbox's idle line
    and the bucket row say what happens next, with no list of its labels; the ready #2 is a
    development task, not `development:2`."""
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    flush_memory()

    async def judged() -> tuple[str, str, list[str]]:
        store, rstore, got = await seed_one_claimed(settings, 1, 2)
        assert (await rstore.finish(1, "my-agent", got.token, "completed"))[0]
        verdict = next(v for v in await explain_repo(rstore, settings, None) if v.issue == 1)
        bucket = (await repo_overview(rstore, settings)).blockers
        await store.close()
        return verdict.verdict, verdict.detail, [b.state for b in bucket]

    try:
        verdict, detail, blockers = asyncio.run(judged())
    finally:
        flush_memory()
    assert verdict == "waiting" and "just completed" in detail
    assert blockers == [detail, "ready (development task)"]
    for text in (detail, *blockers):
        assert not LABEL_DUMP.search(text) and not TASK_ID.search(text), text
        assert "BACKENDCODER" not in text and "my-agent" not in text, text


def test_the_sandbox_says_when_an_issue_it_said_moves_on_by_itself_becomes_a_cool_down(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing is claimed in between: #1, completed without a PR, goes back to the pool in
    my-agent's cool-down. The line the quickstart promises (`#1 for my-agent: in your
    cool-down …`) is logged though the event log already said that the backlog moves on by
    itself; before, nothing was said until the next claim (a minute of 204s)."""
    settings = sandbox_settings("http://127.0.0.1:9", "memory://", 8080)
    flush_memory()
    caplog.set_level(logging.INFO, logger="github_broker.sandbox.watch")
    watcher = BrokerWatcher(settings, "demo/sandbox", ["my-agent"], interval_s=0.05)

    def logged(pattern: str) -> None:
        wait_until(lambda: re.search(pattern, caplog.text), 10, f"{pattern!r} logged")

    async def completed() -> None:
        store, rstore, got = await seed_one_claimed(settings, 1)
        assert (await rstore.finish(1, "my-agent", got.token, "completed"))[0]
        await store.close()

    async def no_pr() -> None:
        store = Store.from_settings(settings)
        rstore = store.repo("demo/sandbox")
        rules = Rules(settings)
        labelled = issue(1, "P0", "BACKENDCODER", "needs-review")
        await rstore.upsert_issues([index_item(rules, labelled, "main")])  # the sync saw it
        reason = "no PR and no commit on feature/issue-1"
        done = await rstore.control("no_pr", "broker", "1", reason, "my-agent", "")
        assert done.reindex, done
        await rstore.upsert_issues([index_item(rules, issue(1, "P0", "BACKENDCODER"), "main")])
        await store.close()

    asyncio.run(completed())
    watcher.start()
    try:
        logged(r"nothing to hand out now; it moves on by itself: #1 ")
        asyncio.run(no_pr())
        logged(r"#1 for my-agent: in your cool-down")
    finally:
        watcher.stop()
        flush_memory()
    for line in caplog.messages:
        assert not LABEL_DUMP.search(line) and not TASK_ID.search(line), line


def test_the_sandbox_says_where_it_is_only_once_its_first_sync_built_the_mirror() -> None:
    """The first sync is slow (GitHub takes half a second to list the backlog): start() returns,
    and the banner and the state file say where the API is, only once the mirror is built,
    so the first request-task (a demo agent's, the user's) never meets a 503 "the mirror is
    being rebuilt" (one start in six logged one)."""
    flush_memory()
    sandbox = Sandbox(Options(port=free_port(), agents=0, maintainer=False))
    sandbox.sim.faults.add_latency(500, method="GET", path=r"/repos/demo/sandbox/issues$")
    try:
        sandbox.start()
        assert sandbox_state.read() is not None
        with BrokerClient(sandbox.url, "first-agent", retries=0) as client:
            task = client.request_task(wait_seconds=0)
        assert task is not None and task.repository == "demo/sandbox"
    finally:
        sandbox.close()
        flush_memory()


class OutsideAgent:
    """An agent of the user's own over HTTP: development pushes a commit to the task's branch
    and opens a PR (except on `without_pr`, completed as docs/mcp.md's walk-through does);
    a review is completed without approving anything."""

    def __init__(self, running: Running, without_pr: set[int]) -> None:
        self.github_url = running.github_url
        self.without_pr = set(without_pr)
        self.done: list[tuple[int, str]] = []

    def work(self, client: BrokerClient, task: Task) -> None:
        if task.task_type == "development" and task.issue_id not in self.without_pr:
            repo = f"{self.github_url}/repos/{task.repository}"
            push = f"{self.github_url}/_sim/repos/{task.repository}/push"
            body = {"branch": task.branch_name, "author": client.agent_id}
            requests.post(push, json=body, timeout=10).raise_for_status()
            pull = {
                "title": task.title,
                "head": task.branch_name,
                "base": task.base_branch,
                "body": f"Closes #{task.issue_id}",
            }
            headers = {"Authorization": "token outside-agent"}
            requests.post(
                f"{repo}/pulls", json=pull, headers=headers, timeout=10
            ).raise_for_status()
        self.without_pr.discard(task.issue_id)
        client.complete(task)
        self.done.append((task.issue_id, task.task_type.value))


@pytest.mark.slow
def test_an_outside_agent_alone_never_idles_silently_and_hears_what_waits_on_a_person(
    start_sandbox: Callable[..., Running],
) -> None:
    running = start_sandbox("--agents", "0", "--no-maintainer", env=FAST)
    running.ready()
    output = running.output
    agent = OutsideAgent(running, without_pr={1})
    deadline = time.monotonic() + 100
    with BrokerClient(running.url, "my-agent") as client:
        since_work = len(output.lines)
        while True:
            assert time.monotonic() < deadline, output.text
            task = client.request_task(wait_seconds=3)
            if task is None:
                # Idle: the event log said why since the agent's last task, within a judgement.
                output.index(QUIET, 3, since_work)
                if re.search(r"nothing left for the agents", "\n".join(output.lines[since_work:])):
                    break
                continue
            agent.work(client, task)
            since_work = len(output.lines)

    # Nobody merges here: the blocked issues wait for their blockers' PRs.
    assert {n for n, kind in agent.done if kind == "development"} == DEMO_WORK - DEMO_BLOCKED
    assert {n for n, kind in agent.done if kind == "review"} == DEMO_WORK - DEMO_BLOCKED
    # The development completed without a PR was named, came back and was done again.
    output.index(r"#1 completed without a PR: back in the pool at \S+ .*feature/issue-1", 1)
    output.index(r"broker: my-agent completed with no PR \(back in the pool\) demo/sandbox#1", 1)
    assert agent.done.count((1, "development")) == 2
    # A reviewed P0 waits on a person, and the P1 work goes on meanwhile.
    waits, _ = output.index(r"waits on a person: #(1|6) .*: merge PR #\d+ \(reviewed\)", 1)
    p1, _ = output.index(r"broker: my-agent claimed demo/sandbox#(2|3|5|8|10|12) \(development", 1)
    assert waits < p1
    summary, _ = output.index(
        r"backlog of demo/sandbox: nothing left for the agents; 11 wait on a person", 1
    )
    for n in DEMO_WORK - DEMO_BLOCKED:
        output.index(
            rf"^\S+ +#{n} .*: merge PR #\d+ \(reviewed\) — or comment on it to ask for changes$",
            1,
            summary,
        )
    for n in DEMO_BLOCKED:
        blocked = r"starts when its blocker closes: blocked by demo/sandbox#\d+ \(open\)$"
        output.index(rf"^\S+ +#{n} .*: {blocked}", 1, summary)
    output.index(r"merge: +curl -s -X PUT http://\S+/repos/demo/sandbox/pulls/PR/merge", 1, summary)
    assert "Traceback" not in output.text


@pytest.mark.slow
def test_with_its_maintainer_the_demo_runs_to_done_with_every_workable_issue_closed(
    start_sandbox: Callable[..., Running],
) -> None:
    running = start_sandbox(
        "--agents", "2", "--work-seconds", "0.3", "--ask-changes-every", "3", env=FAST
    )
    ready = running.ready()
    output = running.output
    output.index(r"backlog of demo/sandbox done: nothing left for the agents", 100, ready)

    listed = requests.get(
        f"{running.github_url}/repos/demo/sandbox/issues",
        params={"state": "open", "per_page": "100"},
        headers={"Authorization": "token test"},
        timeout=10,
    )
    # Only the issue that names no branch is open: a person must decide its scope.
    assert [i["number"] for i in listed.json()] == [13], output.text
    text = output.text
    maintainer = r"maintainer \(the sandbox's stand-in for a person\)"
    merged = set(re.findall(rf"{maintainer}: merged PR #\d+; #(\d+) closed", text))
    assert {int(n) for n in merged} == DEMO_WORK
    assert re.search(rf"{maintainer}: asked for changes on PR #\d+", text)
    assert re.search(r"demo-agent-\d claimed demo/sandbox#\d+ \(fix", text)
    # Done means green: a red PR got a fix task from its failing check, went green, was merged.
    red = re.search(
        r"broker: demo/sandbox#(\d+) checks failed: PR #\d+ at \w+: checks failed: ci/test", text
    )
    assert red, text
    n = red.group(1)
    assert re.search(rf"broker: demo/sandbox#{n} checks fix: fix round 1 of 3", text)
    assert re.search(rf"broker: demo/sandbox#{n} checks green: .*checks passed: ci/test", text)
    assert re.search(rf"{maintainer}: merged PR #\d+; #{n} closed", text)
    assert (
        f"{maintainer[:-2]}): closed story #9: #10, #11, #12 are closed".replace("\\", "") in text
    )
    assert "Traceback" not in text
