"""The agent runner: real commands, a real `serve` process, labels checked on the simulator."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from github_broker.agent.client import BrokerClient, BrokerUnavailable
from github_broker.agent.runner import Runner, RunnerConfig, RunnerError
from github_broker.agent.runner.cli import command_from_argv
from github_broker.agent.runner.task_files import MAX_ENV_JSON_BYTES, task_env
from github_broker.agent.runner.task_run import Ending
from github_broker.models import Task
from tests.conftest import free_port
from tests.processes import LiveStack
from tests.processes import wait_for as wait_until

# A 3 s lease: heartbeats every second, so a revocation shows within a second or two.
pytestmark = pytest.mark.live_stack(issues=1, env={"GITHUB_BROKER_LEASES__LEASE_TTL_S": "3"})

#: The agent command of these tests: records what it was given, then acts out its first argument.
AGENT_SCRIPT = """\
import json, os, signal, sys, time
record = {"env": {k: v for k, v in os.environ.items() if k.startswith("GB_")},
          "stdin": sys.stdin.read(), "pid": os.getpid(), "cwd": os.getcwd()}
with open("seen.json.tmp", "w") as fh:
    json.dump(record, fh)
os.replace("seen.json.tmp", "seen.json")
mode = sys.argv[1]
if mode == "ok":
    sys.exit(0)
if mode == "fail":
    sys.exit(3)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(60)
"""

TASK = Task.model_validate(
    {
        "issue_id": 7,
        "issue_url": "https://github.com/acme/widgets/issues/7",
        "title": "Fix it",
        "body": "body",
        "labels": ["P1", "BACKENDCODER"],
        "branch_name": "feature/issue-7",
        "prompt": "Do the work",
        "required_role": "BACKENDCODER",
        "task_type": "development",
        "repository": "acme/widgets",
        "base_branch": "main",
        "lease": {
            "token": "secret-lease",
            "expires_at": "2026-01-01T00:00:00Z",
            "heartbeat_interval_s": 1,
        },
    }
)


def agent_cli(*args: str) -> list[str]:
    """`github-broker agent ...` once cli.py registers it, else the runner module's own entry."""
    from github_broker.cli.main import build_parser

    parser = build_parser()
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if any("agent" in a.choices for a in subcommands):
        return [sys.executable, "-m", "github_broker", "agent", *args]
    return [sys.executable, "-m", "github_broker.agent.runner", "agent", *args]


def process_gone(pid: int) -> bool:
    """Not running: no such process, or a zombie (an orphan init has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


# --- pieces without a broker -----------------------------------------------------------------


def test_task_env_names_the_task_and_keeps_the_lease_token_out(tmp_path: Path) -> None:
    env = task_env(TASK, "agent-a", tmp_path / "prompt.md", tmp_path / "task.json")
    assert env["GB_ISSUE_ID"] == "7"
    assert env["GB_BRANCH"] == "feature/issue-7"
    assert env["GB_BASE_BRANCH"] == "main"
    assert env["GB_REPOSITORY"] == "acme/widgets"
    assert env["GB_TASK_TYPE"] == "development"
    assert env["GB_ROLE"] == "BACKENDCODER"
    assert env["GB_PROMPT_FILE"] == str(tmp_path / "prompt.md")
    assert json.loads(env["GB_TASK_JSON"])["issue_id"] == 7
    assert "secret-lease" not in env["GB_TASK_JSON"]


def test_task_env_leaves_out_json_too_big_for_the_environment(tmp_path: Path) -> None:
    huge = TASK.model_copy(update={"body": "x" * MAX_ENV_JSON_BYTES})
    env = task_env(huge, "agent-a", tmp_path / "prompt.md", tmp_path / "task.json")
    assert "GB_TASK_JSON" not in env
    assert env["GB_TASK_FILE"] == str(tmp_path / "task.json")


def test_one_word_runs_through_the_shell_several_run_as_argv() -> None:
    assert command_from_argv(["--", "claude -p < $GB_PROMPT_FILE"]) == "claude -p < $GB_PROMPT_FILE"
    assert command_from_argv(["--", "claude", "-p"]) == ["claude", "-p"]


def test_a_missing_command_or_workdir_is_refused_before_any_task(tmp_path: Path) -> None:
    with pytest.raises(RunnerError, match="not found"):
        RunnerConfig(command=["no-such-agent-binary"], workdir=tmp_path).check()
    with pytest.raises(RunnerError, match="does not exist"):
        RunnerConfig(command=["python3"], workdir=tmp_path / "missing").check()
    with pytest.raises(RunnerError, match="after `--`"):
        RunnerConfig(command=[], workdir=tmp_path).check()


def test_unreachable_broker_is_given_up_after_the_limit_with_one_message(tmp_path: Path) -> None:
    client = BrokerClient(f"http://127.0.0.1:{free_port()}", "agent-a", retries=0)
    config = RunnerConfig(command=["true"], workdir=tmp_path, once=True, give_up_s=1.5)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"unreachable for .*giving up"):
        Runner(client, config).run()
    assert time.monotonic() - started < 10
    client.close()


def test_give_up_after_counts_seconds_from_the_first_failure_the_clients_retries_included(
    tmp_path: Path,
) -> None:
    """`--give-up-after 1` ends the runner about 1 s after the broker first failed to answer,
    however many retries the client itself makes (its default: 4, backing off 4 to 8 s in
    all, after which the runner used to start counting)."""
    client = BrokerClient(f"http://127.0.0.1:{free_port()}", "agent-a")
    config = RunnerConfig(command=["true"], workdir=tmp_path, once=True, give_up_s=1)
    started = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"giving up \(limit 1s, --give-up-after\)"):
        Runner(client, config).run()
    assert 0.8 <= time.monotonic() - started < 2.5
    client.close()


class Waits(threading.Event):
    """A stop event that records the pauses asked of it and returns at once."""

    def __init__(self) -> None:
        super().__init__()
        self.pauses: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.pauses.append(timeout or 0.0)
        return False


def test_after_a_failure_the_runner_pauses_2_s_doubling_up_to_2_min(tmp_path: Path) -> None:
    """docs/quickstart.md: "After a failure it pauses (2 s, doubling up to 2 min while failures
    continue)"; a completion starts over, a lost lease or a stop does not pause."""
    stop = Waits()
    client = BrokerClient(f"http://127.0.0.1:{free_port()}", "agent-a")
    runner = Runner(client, RunnerConfig(command=["true"], workdir=tmp_path), stop)
    endings = [Ending.FAILED] * 3 + [Ending.TIMED_OUT] * 5 + [Ending.COMPLETED, Ending.FAILED]
    for ending in [*endings, Ending.LEASE_LOST, Ending.STOPPED]:
        runner._pause_after(ending)
    assert stop.pauses == [2, 4, 8, 16, 32, 64, 120, 120, 2]
    client.close()


@pytest.mark.slow
def test_agent_once_against_a_dead_broker_exits_with_one_clear_message(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    command = agent_cli(
        "--broker-url", dead, "--agent-id", "agent-a", "--once", "--give-up-after", "1"
    )
    done = subprocess.run(
        [*command, "--", "true"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr.count("giving up") == 1, done.stderr


def test_unreachable_broker_is_retried_until_stopped(tmp_path: Path) -> None:
    client = BrokerClient(f"http://127.0.0.1:{free_port()}", "agent-a", retries=0)
    stop = threading.Event()
    runner = Runner(client, RunnerConfig(command=["true"], workdir=tmp_path), stop)
    threading.Timer(0.5, stop.set).start()
    started = time.monotonic()
    assert runner.run() == 0
    assert time.monotonic() - started < 5
    client.close()


# --- against a real broker -------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    (path / "agent.py").write_text(AGENT_SCRIPT)
    return path


@pytest.fixture
def run_agent(stack: LiveStack, workdir: Path) -> Iterator[Callable[..., int]]:
    clients: list[BrokerClient] = []

    def run(mode: str, **config: Any) -> int:
        client = BrokerClient(stack.broker.url, "agent-a", backoff_s=0.1)
        clients.append(client)
        options = {"workdir": workdir, "once": True, "wait_s": 5, **config}
        command = [sys.executable, str(workdir / "agent.py"), mode]
        return Runner(client, RunnerConfig(command=command, **options)).run()

    yield run
    for client in clients:
        client.close()


def labels(stack: LiveStack) -> set[str]:
    return set(stack.sim.state.issue_labels("acme", "widgets", 1))


def seen(workdir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((workdir / "seen.json").read_text())
    return data


def assert_back_in_pool(stack: LiveStack) -> None:
    with BrokerClient(stack.broker.url, "agent-b") as other:
        task = other.request_task(wait_seconds=5)
        assert task is not None and task.issue_id == 1
        other.release(task)


@pytest.mark.slow
def test_success_completes_and_the_issue_gets_needs_review(
    stack: LiveStack, workdir: Path, run_agent: Callable[..., int]
) -> None:
    assert run_agent("ok") == 0

    record = seen(workdir)
    env = record["env"]
    assert (env["GB_ISSUE_ID"], env["GB_BRANCH"], env["GB_REPOSITORY"]) == (
        "1",
        "feature/issue-1",
        "acme/widgets",
    )
    assert (env["GB_BASE_BRANCH"], env["GB_TASK_TYPE"], env["GB_ROLE"]) == (
        "main",
        "development",
        "BACKENDCODER",
    )
    assert record["stdin"] == json.loads(env["GB_TASK_JSON"])["prompt"] != ""
    assert Path(record["cwd"]) == workdir
    # The write queue applies one label at a time: wait for the whole change.
    wait_until(
        lambda: "needs-review" in labels(stack) and not labels(stack) & {"in-progress", "agent-a"},
        15,
        "needs-review without in-progress on the simulator",
    )


@pytest.mark.slow
def test_failed_command_releases_the_task_back_to_the_pool(
    stack: LiveStack, run_agent: Callable[..., int]
) -> None:
    assert run_agent("fail") == 1
    assert_back_in_pool(stack)
    wait_until(lambda: not labels(stack) & {"agent-a", "needs-review"}, 15, "labels removed")


@pytest.mark.slow
def test_time_limit_kills_a_command_that_ignores_sigterm_and_releases(
    stack: LiveStack, workdir: Path, run_agent: Callable[..., int]
) -> None:
    started = time.monotonic()
    assert run_agent("stubborn", timeout_s=1.0, kill_grace_s=0.5) == 1
    assert time.monotonic() - started < 10
    assert process_gone(seen(workdir)["pid"])
    assert_back_in_pool(stack)


#: A script that traps SIGTERM, started by a shell that does not (the shell dies at once).
TRAPPER = """\
#!/bin/sh
echo $$ > trapper.pid
trap 'echo ignoring TERM' TERM
while true; do sleep 0.1; done
"""


@pytest.mark.slow
def test_time_limit_ends_the_whole_process_group_before_releasing(
    stack: LiveStack, workdir: Path
) -> None:
    script = workdir / "agent.sh"
    script.write_text(TRAPPER)
    script.chmod(0o755)
    client = BrokerClient(stack.broker.url, "agent-a", backoff_s=0.1)
    config = RunnerConfig(
        command="./agent.sh; echo finished",
        workdir=workdir,
        once=True,
        wait_s=5,
        timeout_s=1.5,
        kill_grace_s=1.0,
    )
    try:
        assert Runner(client, config).run() == 1
        # By the time the task is released, nothing of the command is left working on it.
        assert process_gone(int((workdir / "trapper.pid").read_text()))
    finally:
        client.close()
    assert_back_in_pool(stack)


@pytest.mark.slow
def test_revoked_lease_stops_the_command(
    stack: LiveStack,
    workdir: Path,
    run_agent: Callable[..., int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="github_broker.agent.runner")
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(run_agent("sleep")))
    worker.start()
    wait_until(lambda: (workdir / "seen.json").exists(), 15, "the command to start")
    stack.sim.state.update_issue("acme", "widgets", 1, state="closed")
    worker.join(timeout=30)
    assert result == [1]
    assert process_gone(seen(workdir)["pid"])
    assert any(
        "agent-a lost acme/widgets#1 (issue_closed)" in r.getMessage() for r in caplog.records
    )


@pytest.mark.slow
def test_sigterm_stops_the_command_and_releases_the_lease(
    stack: LiveStack, workdir: Path, tmp_path: Path
) -> None:
    command = agent_cli(
        "--broker-url",
        stack.broker.url,
        "--agent-id",
        "agent-a",
        "--wait",
        "2",
        "--workdir",
        str(workdir),
        "--",
        sys.executable,
        "agent.py",
        "sleep",
    )
    with (tmp_path / "runner.log").open("wb") as log:
        runner = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: (workdir / "seen.json").exists(), 20, "the command to start")
        wait_until(lambda: "agent-a" in labels(stack), 15, "the claim labels on the simulator")
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == 128 + signal.SIGTERM
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    assert process_gone(seen(workdir)["pid"])
    wait_until(lambda: not labels(stack) & {"in-progress", "agent-a"}, 15, "labels removed")
    assert "Traceback" not in (tmp_path / "runner.log").read_text()
    assert_back_in_pool(stack)
