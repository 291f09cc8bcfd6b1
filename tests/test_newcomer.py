"""The newcomer's path, as README.md and docs/quickstart.md tell it, checked on what a person
reads: `make sandbox` (demo agents and the simulated maintainer), `--agents 0
--no-maintainer --redis-url …` for an agent of one's own, the steering verbs, `status` and
`explain` from another terminal against the running sandbox, and `--help` of every command.

Two sandboxes, each shared by the module's tests (module-scoped fixtures): `demo` with slow
demo agents (their leases stay held while the verbs act on them) and `alone`, where the
user's agent works by itself on fast intervals."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.agent.client import BrokerClient, LeaseLost
from github_broker.cli.main import build_parser, main
from github_broker.models import Task
from tests.conftest import free_port
from tests.test_first_run import cli
from tests.test_sandbox import FAST, LABEL_DUMP, QUIET, TASK_ID, Running

ROOT = Path(__file__).parent.parent
#: The steering verbs of `github-broker` (cli/steer.py).
VERBS = ("revoke", "reassign", "note", "retry", "pause", "resume", "stop", "audit")
#: demo: leases last 6 s, so a runner heartbeats every 1.6 s and hears a verb at once.
DEMO_ENV = {"GITHUB_BROKER_LEASES__LEASE_TTL_S": "6"}
#: alone: FAST, plus a review delay and a cool-down long enough to be seen, and the no-PR
#: check every second.
ALONE_ENV = {
    **FAST,
    "GITHUB_BROKER_REVIEW__DELAY_S": "3",
    "GITHUB_BROKER_FAILURES__COOLDOWN_S": "6",
    "GITHUB_BROKER_PROGRESS__BRANCH_CHECK_INTERVAL_S": "1",
}


class Started(Running):
    """A sandbox this module started, with the runtime directory where it says how to reach
    it (another terminal of the same user finds it there)."""

    def __init__(self, proc: subprocess.Popen[str], port: int, runtime: Path) -> None:
        super().__init__(proc, port)
        self.runtime = runtime


def newcomer_env(runtime: Path, **extra: str) -> dict[str, str]:
    """A new user's shell: no GITHUB_BROKER_* variable, a runtime directory of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_BROKER_")}
    return {**env, "XDG_RUNTIME_DIR": str(runtime), "TMPDIR": str(runtime), **extra}


@pytest.fixture(scope="module")
def start_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Started]]:
    """Starts `github-broker sandbox` with a runtime directory of its own (where it says how
    to reach it), as a person would type it; each is stopped with Ctrl-C at the end."""
    started: list[Started] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Started:
        runtime = tmp_path_factory.mktemp("runtime")
        port = free_port()
        proc = subprocess.Popen(
            cli("sandbox", "--port", str(port), *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=newcomer_env(runtime, **(env or {})),
        )
        running = Started(proc, port, runtime)
        started.append(running)
        running.ready()
        return running

    yield start
    for running in started:  # Ctrl-C to all first: they stop side by side
        running.proc.send_signal(signal.SIGINT)
    for running in started:
        try:
            running.proc.wait(timeout=40)
        finally:
            running.stop()
        assert "Traceback" not in running.output.text, running.output.text


@pytest.fixture(scope="module")
def demo(start_sandbox: Callable[..., Started]) -> Started:
    """`make sandbox`, its demo agents working 30 s on each task."""
    return start_sandbox("--work-seconds", "30", env=DEMO_ENV)


@pytest.fixture(scope="module")
def alone(start_sandbox: Callable[..., Started], redis_server: str) -> Started:
    """`--agents 0 --no-maintainer` on a real Redis (`--redis-url`)."""
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    return start_sandbox(
        "--agents", "0", "--no-maintainer", "--redis-url", redis_server, env=ALONE_ENV
    )


@pytest.fixture
def terminal(demo: Started, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """`github-broker ARGS` from another terminal (in this process): its stdout. The logging
    the command sets up is undone afterwards."""
    for name in [k for k in os.environ if k.startswith("GITHUB_BROKER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(demo.runtime))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level

    def run(*args: str, capsys: pytest.CaptureFixture[str]) -> str:
        assert main(list(args)) == 0
        out, err = capsys.readouterr()
        assert f"showing the sandbox running at {demo.url}" in err
        assert not TASK_ID.search(out) and not LABEL_DUMP.search(out), out
        return out

    yield run
    root.handlers[:] = handlers
    root.setLevel(level)


# --- --help ----------------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser, path: str = "github-broker") -> Iterator[Any]:
    """(path, parser) of the command and every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}")


def test_every_command_has_a_description_and_help_on_each_argument() -> None:
    found = list(commands(build_parser()))
    assert len(found) >= 19
    for path, parser in found:
        assert parser.description, f"{path}: no description"
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction):
                assert action.help, f"{path} {action.option_strings or action.dest}: no help"


def test_each_steering_verbs_help_says_how_it_finds_the_broker_and_where_a_reason_goes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for verb in VERBS:
        with pytest.raises(SystemExit) as done:
            main([verb, "--help"])
        assert done.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "--config DIR" in text and "GITHUB_BROKER_*" in text, text
        assert "running `github-broker sandbox`" in text and "--sandbox" in text, text
    parsers = dict(commands(build_parser()))
    reasons = {
        verb: action.help
        for verb in VERBS
        for action in parsers[f"github-broker {verb}"]._actions
        if "--reason" in action.option_strings
    }
    assert set(reasons) == set(VERBS) - {"note", "audit"}
    assert "agent hears it at its next heartbeat" in str(reasons["revoke"])
    assert "taking it over" in str(reasons["reassign"])
    for verb in ("retry", "resume"):  # nobody but the audit log hears these
        assert "hears" not in str(reasons[verb]) and "audit log" in str(reasons[verb])
    assert "paused agent hears it" in str(reasons["pause"])


# --- make sandbox ------------------------------------------------------------------------


def test_make_sandbox_says_what_runs_and_its_agents_claim_without_a_warning(
    demo: Started,
) -> None:
    url, output = demo.url, demo.output
    banner = output.text.split("--- event log")[0]
    for promised in (
        f"dashboard         {url}/ui",
        f"broker API        {url}  (OpenAPI: {url}/docs, queues: {url}/status)",
        "demo agents       demo-agent-1, demo-agent-2, demo-agent-3",
        "maintainer        on: a stand-in for a person merges reviewed PRs",
        "Look at it from another terminal: github-broker status, github-broker explain",
        f"curl -s -X POST {url}/request-task",
    ):
        assert promised in banner, promised
    first, _ = output.index(r"demo-agent-\d claimed demo/sandbox#\d+ \(development, role ", 30)
    output.index(r"github: #\d+ labels .*\+in-progress", 30)
    before = "\n".join(output.lines[:first])
    assert "WARNING" not in before and "503" not in before, before
    for path in ("/ui", "/favicon.ico", "/docs", "/status", "/explain"):
        assert requests.get(f"{url}{path}", timeout=10).ok, path


def held_by_demo_agents(url: str) -> dict[int, str]:
    """issue -> agent of the demo agents' live leases, as /status shows them."""
    (repo,) = requests.get(f"{url}/status", timeout=10).json()["repositories"]
    return {lease["issue"]: lease["agent_id"] for lease in repo["leases"]}


def test_the_steering_verbs_reach_the_running_sandbox(
    demo: Started, terminal: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    output, url = demo.output, demo.url
    deadline = time.monotonic() + 30
    while len(held := held_by_demo_agents(url)) < 2:
        assert time.monotonic() < deadline, output.text
        time.sleep(0.2)
    (noted, noted_agent), (revoked, revoked_agent) = sorted(held.items())[:2]
    mine = terminal("explain", "--agent", noted_agent, "--role", "BACKENDCODER", capsys=capsys)
    assert f"held by {noted_agent} (yours)" in mine
    since = len(output.lines)

    said = terminal("note", str(noted), "look at the tests first", capsys=capsys)
    assert f"queued for the next heartbeat of {noted_agent}" in said
    output.index(rf"{noted_agent}.*note from cli:\S+: look at the tests first", 15, since)

    said = terminal(
        "revoke", f"demo/sandbox#{revoked}", "--reason", "wrong approach", capsys=capsys
    )
    assert f"lease of {revoked_agent} revoked" in said
    output.index(rf"{revoked_agent} lost demo/sandbox#{revoked} \(revoked\).*wrong approach", 15)

    # A reassignment names an agent the broker knows: my-agent asks once first (and gives
    # back what it got).
    with BrokerClient(url, "my-agent") as client:
        first = client.request_task()
        if first is not None:
            client.release(first, "abandoned")
    said = terminal("reassign", str(noted), "my-agent", "--reason", "fresh eyes", capsys=capsys)
    assert f"lease of {noted_agent} revoked" in said
    with BrokerClient(url, "my-agent") as client:
        task = client.request_task(wait_seconds=10)
        assert task is not None and task.issue_id == noted
        assert task.continues is not None and task.continues.from_agent == noted_agent
        said = terminal("revoke", str(noted), "--hold", capsys=capsys)
        assert "held for a person" in said
        with pytest.raises(LeaseLost):
            client.heartbeat(task)
    assert "back in the pool" in terminal("retry", str(noted), capsys=capsys)

    assert "paused" in terminal("pause", "demo-agent-3", "--reason", "lunch", capsys=capsys)
    assert "resumed" in terminal("resume", "demo-agent-3", capsys=capsys)
    assert "stopped" in terminal("stop", "demo-agent-2", "--reason", "x", capsys=capsys)
    assert "resumed" in terminal("resume", "demo-agent-2", capsys=capsys)
    assert "paused" in terminal("pause", "--repo", "demo/sandbox", capsys=capsys)
    assert "resumed" in terminal("resume", "--repo", "demo/sandbox", capsys=capsys)

    log = terminal("audit", capsys=capsys)
    for action in ("note", "revoke", "reassign", "retry", "pause_agent", "stop_agent"):
        assert re.search(rf"cli:\S+ +{action} ", log), (action, log)
    assert "(wrong approach)" in log
    status = terminal("status", capsys=capsys)
    assert "demo/sandbox   bucket P" in status and "Leases:" in status
    assert terminal("explain", "--role", "BACKENDCODER", capsys=capsys).startswith("demo/sandbox")


def test_the_steering_verbs_find_the_sandbox_from_a_shell(demo: Started, tmp_path: Path) -> None:
    """The real command, from a directory with no config, nothing exported."""
    env = newcomer_env(demo.runtime)
    shell = {"env": env, "capture_output": True, "text": True, "cwd": tmp_path, "timeout": 60}
    done = subprocess.run(cli("audit"), **shell)
    assert done.returncode == 0, done.stderr
    assert f"showing the sandbox running at {demo.url}" in done.stderr
    assert done.stdout.strip(), "audit printed nothing"


# --- an agent of one's own -------------------------------------------------------------


def readme_curl() -> str:
    """README.md's curl that points one's own agent at the running sandbox."""
    text = (ROOT / "README.md").read_text()
    block = text.split("Point your own agent at it while it runs:", 1)[1]
    return block.split("```sh\n", 1)[1].split("```", 1)[0]


def push_and_open_pr(github_url: str, task: Task, agent: str) -> None:
    """What the quickstart's plain-HTTP example does on the simulated GitHub."""
    push = f"{github_url}/_sim/repos/{task.repository}/push"
    requests.post(push, json={"branch": task.branch_name, "author": agent}, timeout=10)
    pull = {
        "title": f"Fix #{task.issue_id}",
        "head": task.branch_name,
        "base": task.base_branch,
        "body": f"Closes #{task.issue_id}",
    }
    requests.post(
        f"{github_url}/repos/{task.repository}/pulls",
        json=pull,
        headers={"Authorization": "token me"},
        timeout=10,
    ).raise_for_status()


@pytest.mark.skipif(not shutil.which("curl"), reason="the README's example uses curl")
def test_an_agent_of_ones_own_hears_why_it_waits_in_words(
    alone: Started, redis_server: str
) -> None:
    """README's curl claims #1; completed without a PR it comes back in the agent's cool-down,
    and every idle line says what moves each issue on, in words, never as labels or ids."""
    output = alone.output
    banner = output.text.split("--- event log")[0]
    assert "demo agents       none (--agents 0)" in banner
    assert "maintainer        off: the event log says what a person must do" in banner
    script = readme_curl().replace("localhost:8080", alone.url.removeprefix("http://"))
    claimed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert claimed.returncode == 0, claimed.stderr
    first = Task.model_validate_json(claimed.stdout)
    assert first.issue_id == 1 and first.repository == "demo/sandbox"
    output.index(r"broker: me claimed demo/sandbox#1 \(development\)", 10)
    with BrokerClient(alone.url, "me") as client:
        client.complete(first)  # no push, no PR
        second = client.request_task(wait_seconds=10)
        assert second is not None and second.issue_id == 6
        push_and_open_pr(alone.github_url, second, "me")
        client.complete(second)
        idle_since = len(output.lines)
        deadline = time.monotonic() + 40
        while not re.search(r"#1 for me: in your cool-down", "\n".join(output.lines[idle_since:])):
            assert time.monotonic() < deadline, output.text
            task = client.request_task(wait_seconds=1)
            if task is not None:
                assert task.task_type.value == "review" and task.issue_id == 6, task
                client.complete(task)
    output.index(r"#1 completed without a PR: back in the pool at \d\d:\d\d:\d\d ", 1)
    output.index(r"#6 in review: offered to an agent at \d\d:\d\d:\d\d", 1)
    idle = [line for line in output.lines if re.search(QUIET, line)]
    assert len(idle) >= 2, output.text
    for line in idle:
        assert not LABEL_DUMP.search(line) and not TASK_ID.search(line), line
    client_keys = redis.Redis.from_url(redis_server)
    try:
        assert client_keys.keys("gb-sandbox:*"), "the sandbox's keys carry its own prefix"
    finally:
        client_keys.close()
