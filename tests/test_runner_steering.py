"""The runner under maintainers' steering: a revoke or a stop ends the command's process group
within one heartbeat interval, a paused agent finishes its task and waits, a budget pause
suspends the command until a retry, notes reach the coding agent, and the heartbeat says what
the command is doing. Real commands, a real `serve`, the GitHub simulator."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from github_broker.agent.client import BrokerClient
from github_broker.agent.runner import Runner, RunnerConfig
from github_broker.agent.runner.notes import NOTES_FILE_NAME, NotesFile
from github_broker.agent.runner.output import OutputTap
from github_broker.keys import RepoKeys
from github_broker.models import Note
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, live_broker, post, wait_for
from tests.test_runner import TASK as RUNNER_TASK
from tests.waiting import wait_until

KEYS = RepoKeys("gb", "acme", "widgets")
#: The lease of these tests (seconds): a heartbeat interval of 2 s.
LEASE_TTL_S = 6
INTERVAL_S = LEASE_TTL_S // 3


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(2, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.fixture
def serve(sim: Simulator, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start `serve` with a 6 s lease (and more environment); stopped at the end."""
    with ExitStack() as stack:

        def start(**extra: str) -> BrokerProcess:
            env = {"GITHUB_BROKER_LEASES__LEASE_TTL_S": str(LEASE_TTL_S), **extra}
            return stack.enter_context(live_broker(sim, redis_url, tmp_path, 2, **env))

        yield start


def admin(broker: BrokerProcess, path: str, **body: Any) -> dict[str, Any]:
    r = post(broker.url, path, body)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def group_members(pgid: int) -> list[int]:
    """Processes of group `pgid` that still run (zombies aside), read from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(entry))
    return members


def proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def seconds_until_gone(pgid: int, limit_s: float) -> float:
    started = time.monotonic()
    wait_until(lambda: not group_members(pgid), limit_s, f"group {pgid} gone", every_s=0.02)
    return time.monotonic() - started


def lease_note(store: redis.Redis, number: int) -> str:
    raw = store.hget(KEYS.lease(number), "note")
    return raw.decode() if raw else ""


# --- the runner as a process: revoke and stop ----------------------------------------------

#: A long shell command: its shell and two sleeps, one in the background, in one group.
LONG_COMMAND = (
    'echo $$ > "group-$GB_ISSUE_ID"; echo "exporting widgets to CSV"; sleep 600 & sleep 600; wait'
)


@pytest.mark.slow
def test_revoke_and_stop_end_the_process_group_within_one_heartbeat_interval(
    serve: Callable[..., BrokerProcess], redis_url: str, tmp_path: Path
) -> None:
    broker = serve()
    work = tmp_path / "work"
    work.mkdir()
    command = [sys.executable, "-m", "github_broker", "agent", "--broker-url", broker.url]
    command += ["--agent-id", "agent-a", "--wait", "2", "--workdir", str(work), "--", LONG_COMMAND]
    log = tmp_path / "runner.log"
    store = redis.Redis.from_url(redis_url)
    with log.open("wb") as out:
        runner = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (work / "group-1").exists(), 20, "the command on #1")
        group = int((work / "group-1").read_text())
        # The heartbeat tells maintainers what the command last said.
        wait_for(
            lambda: lease_note(store, 1) == "exporting widgets to CSV", 3 * INTERVAL_S, "the note"
        )

        revoked_at = time.monotonic()
        admin(broker, "/admin/tasks/acme/widgets/1/revoke", reason="wrong approach", hold=True)
        seconds_until_gone(group, 10)
        gone_s = time.monotonic() - revoked_at
        print(f"\nrevoke: group gone after {gone_s:.2f}s")
        assert gone_s <= INTERVAL_S, f"revoke: group gone after {gone_s:.2f}s"

        wait_for(lambda: (work / "group-2").exists(), 20, "the command on #2")
        group = int((work / "group-2").read_text())
        stopped_at = time.monotonic()
        admin(broker, "/admin/agents/agent-a/stop", reason="end of the day")
        seconds_until_gone(group, 10)
        gone_s = time.monotonic() - stopped_at
        print(f"stop: group gone after {gone_s:.2f}s")
        assert gone_s <= INTERVAL_S, f"stop: group gone after {gone_s:.2f}s"

        # Stopped means paused: the runner stays, asks for no work, and says why once.
        wait_for(lambda: "agent-a is paused" in log.read_text(), 10, "the paused message")
        time.sleep(1.0)
        assert runner.poll() is None, log.read_text()
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        store.close()
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    text = log.read_text()
    assert "lost acme/widgets#1 (revoked); command stopped" in text
    assert "wrong approach" in text
    paused = [line for line in text.splitlines() if "is paused" in line]
    assert len(paused) == 1 and "end of the day" in paused[0]
    assert "Traceback" not in text


# --- the runner in this process: pause, budget pause, notes --------------------------------

#: Starts, writes what it spent, ticks until told to go; exits 0.
TICKER = """\
import json, os, pathlib, time
n = os.environ["GB_ISSUE_ID"]
pathlib.Path(f"pid-{n}").write_text(str(os.getpid()))
if os.environ.get("SPEND"):
    pathlib.Path(os.environ["GB_USAGE_FILE"]).write_text(os.environ["SPEND"])
ticks = 0
while not os.path.exists(f"go-{n}"):
    ticks += 1
    pathlib.Path(f"ticks-{n}").write_text(str(ticks))
    time.sleep(0.05)
"""


@contextmanager
def running(
    broker: BrokerProcess, work: Path, **options: Any
) -> Iterator[tuple[threading.Thread, list[int]]]:
    """A Runner on TICKER in a thread; stopped (and joined) on exit."""
    (work / "ticker.py").write_text(TICKER)
    client = BrokerClient(broker.url, "agent-a", backoff_s=0.1)
    config = RunnerConfig(command=[sys.executable, "ticker.py"], workdir=work, wait_s=1, **options)
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(Runner(client, config, stop).run()))
    thread.start()
    try:
        yield thread, result
    finally:
        stop.set()
        for n in (1, 2):
            (work / f"go-{n}").touch()
        thread.join(timeout=30)
        client.close()


def ticks(work: Path, n: int) -> int:
    return int((work / f"ticks-{n}").read_text() or 0)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


@pytest.mark.slow
def test_a_paused_agent_finishes_its_task_then_waits_and_carries_on_when_resumed(
    serve: Callable[..., BrokerProcess],
    sim: Simulator,
    redis_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="github_broker.agent")
    broker = serve()
    work = tmp_path / "work"
    work.mkdir()
    store = redis.Redis.from_url(redis_url)
    try:
        with running(broker, work, paused_retry_s=0.2) as (thread, _):
            wait_for(lambda: (work / "pid-1").exists(), 20, "the command on #1")
            admin(broker, "/admin/agents/agent-a/pause", reason="rota change")
            wait_for(
                lambda: any("this agent is paused" in m for m in messages(caplog)),
                3 * INTERVAL_S,
                "the pause heard by the heartbeat",
            )
            (work / "go-1").touch()  # the current task may finish
            wait_for(
                lambda: "needs-review" in sim.state.issue_labels("acme", "widgets", 1),
                15,
                "#1 completed",
            )
            # Asked again (after 0.2, 0.4, 0.8 s ...) and refused: no new claim, said once.
            time.sleep(1.2)
            assert not (work / "pid-2").exists()
            assert store.zcard(KEYS.leases) == 0
            paused = [m for m in messages(caplog) if "agent-a is paused;" in m]
            assert len(paused) == 1 and "rota change" in paused[0]
            assert thread.is_alive()

            admin(broker, "/admin/agents/agent-a/resume")
            wait_for(lambda: (work / "pid-2").exists(), 10, "the command on #2 after resume")
    finally:
        store.close()
    assert any("agent-a was resumed" in m for m in messages(caplog))


@pytest.mark.slow
def test_a_budget_pause_suspends_the_command_until_a_retry_and_notes_reach_its_directory(
    serve: Callable[..., BrokerProcess],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="github_broker.agent")
    broker = serve(GITHUB_BROKER_BUDGETS__TOKENS="1000")
    work = tmp_path / "work"
    work.mkdir()
    notes = work / NOTES_FILE_NAME
    monkeypatch.setenv("SPEND", '{"tokens": 1500, "cost": 0.2}')  # TICKER's usage file
    with running(broker, work, once=True) as (thread, result):
        wait_for(lambda: (work / "pid-1").exists(), 20, "the command")
        pid = int((work / "pid-1").read_text())
        admin(broker, "/admin/tasks/acme/widgets/1/note", text="Use the new parser.")
        wait_for(
            lambda: notes.exists() and "Use the new parser." in notes.read_text(),
            3 * INTERVAL_S,
            "the note in the task's directory",
        )
        # The usage it reported reached the budget: the command is stopped where it is.
        wait_for(lambda: proc_state(pid) == "T", 3 * INTERVAL_S, "SIGSTOP")
        before = ticks(work, 1)
        time.sleep(0.5)
        assert ticks(work, 1) == before

        admin(broker, "/admin/tasks/acme/widgets/1/retry")
        wait_for(lambda: proc_state(pid) != "T", 3 * INTERVAL_S, "SIGCONT")
        wait_for(lambda: ticks(work, 1) > before + 2, 5, "the command ticking again")
        (work / "go-1").touch()
        thread.join(timeout=20)
    assert result == [0]
    assert not notes.exists()  # the next task starts without this one's notes
    said = messages(caplog)
    assert any("note from admin: Use the new parser." in m for m in said)
    assert any("waits for a person (budget" in m and "SIGSTOP" in m for m in said)
    assert any("retried by a maintainer; command continued (SIGCONT)" in m for m in said)


# --- the heartbeat's note ------------------------------------------------------------------


def test_the_note_is_the_last_output_line_with_text_without_terminal_codes(tmp_path: Path) -> None:
    out = tmp_path / "out.log"
    with out.open("wb") as sink:
        tap = OutputTap(sink, sink)
        w_out, w_err = tap.open()
        script = "echo warn >&2; sleep 0.2; printf 'one\\n\\033[32mrunning tests\\033[0m\\r\\n \\n'"
        proc = subprocess.Popen(["sh", "-c", script], stdout=w_out, stderr=w_err)
        tap.start()
        proc.wait()
        tap.close()
    assert tap.last_line() == "running tests"
    assert b"warn\n" in out.read_bytes() and b"one\n" in out.read_bytes()
    assert OutputTap().last_line() is None


def test_the_notes_file_stays_out_of_git_and_goes_when_the_task_ends(tmp_path: Path) -> None:
    def git(cwd: Path, *args: str) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
        return done.stdout

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=main")
    git(
        repo,
        "-c",
        "user.name=T",
        "-c",
        "user.email=t@example.com",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "0",
    )
    git(repo, "worktree", "add", "--quiet", str(tmp_path / "task"), "-b", "feature/issue-7")
    task = RUNNER_TASK
    for cwd in (repo, tmp_path / "task"):
        notes = NotesFile(cwd, task)
        notes.append([Note(by="alice", text="Use the new parser.", at="2026-11-20T12:11:00Z")])
        notes.append([Note(by="bob", text="And rebase.", at="2026-11-20T12:12:00Z")])
        text = notes.path.read_text()
        assert text.index("Use the new parser.") < text.index("And rebase.")
        assert git(cwd, "status", "--porcelain", "--untracked-files=all") == ""
        notes.remove()
        assert not notes.path.exists()
