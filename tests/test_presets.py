"""Runner presets: stub executables named like the real CLIs record how they were started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from github_broker.agent.client import BrokerClient
from github_broker.agent.presets import MAX_PROMPT_ARG_BYTES, PRESETS
from github_broker.agent.runner import Runner, RunnerConfig, RunnerError
from github_broker.agent.workspace import Workspaces
from tests.processes import LiveStack, wait_for

pytestmark = pytest.mark.live_stack(issues=1)

STUB = """\
#!{python}
import json, os, subprocess, sys
branch = subprocess.run(["git", "branch", "--show-current"], capture_output=True, text=True)
with open(os.environ["STUB_RECORD"], "w") as fh:
    json.dump(
        {{
            "name": os.path.basename(sys.argv[0]),
            "argv": sys.argv[1:],
            "cwd": os.getcwd(),
            "stdin": sys.stdin.read(),
            "branch": branch.stdout.strip(),
        }},
        fh,
    )
"""

EXPECTED = {
    "claude": ["-p", "{p}", "--permission-mode", "acceptEdits", "--output-format", "text"],
    "codex": ["exec", "--sandbox", "workspace-write", "{p}"],
    "gemini": ["--approval-mode", "auto_edit", "-p", "{p}"],
    "aider": ["--yes-always", "--message", "{p}"],
}


@pytest.fixture
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`claude`, `codex`, `gemini`, `aider` on a PATH of their own; each writes STUB_RECORD."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in PRESETS:
        exe = bin_dir / name
        exe.write_text(STUB.format(python=sys.executable))
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("STUB_RECORD", str(record))
    return record


def test_each_preset_puts_a_long_prompt_on_stdin_or_in_a_file(tmp_path: Path) -> None:
    long = "x" * (MAX_PROMPT_ARG_BYTES + 1)
    prompt_file = tmp_path / "prompt.md"
    commands = {name: p.command(long, prompt_file, ["--model", "m"]) for name, p in PRESETS.items()}
    assert all(long not in words for words in commands.values())
    assert {n for n, p in PRESETS.items() if p.reads_stdin(long)} == {"claude", "codex", "gemini"}
    assert not any(p.reads_stdin("short") for p in PRESETS.values())
    assert commands["claude"] == [
        "claude", "-p", "--permission-mode", "acceptEdits", "--output-format", "text",
        "--model", "m",
    ]  # fmt: skip
    assert commands["codex"] == [
        "codex", "exec", "--sandbox", "workspace-write", "-", "--model", "m"
    ]  # fmt: skip
    assert commands["aider"][1:4] == ["--yes-always", "--message-file", str(prompt_file)]
    assert commands["gemini"][-4:] == [
        "-p",
        "Do the task described in the text above.",
        "--model",
        "m",
    ]


def test_a_preset_whose_cli_is_missing_is_refused_before_any_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RunnerError, match="preset 'codex' needs 'codex' on PATH"):
        RunnerConfig(command=[], preset=PRESETS["codex"], workdir=tmp_path).check()


# --- against a real broker, with a worktree per task -------------------------------------


def git(cwd: Path, *args: str) -> str:
    ident = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]
    done = subprocess.run(["git", *ident, *args], cwd=cwd, check=True, capture_output=True)
    return done.stdout.decode().strip()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """A bare acme/widgets.git with one commit on main; returns the clone URL template."""
    bare = tmp_path / "remotes" / "acme" / "widgets.git"
    bare.parent.mkdir(parents=True)
    git(bare.parent, "init", "--quiet", "--bare", "--initial-branch=main", bare.name)
    seed = tmp_path / "seed"
    git(tmp_path, "clone", "--quiet", str(bare), str(seed))
    (seed / "README.md").write_text("widgets\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "--quiet", "-m", "first")
    git(seed, "push", "--quiet", "origin", "HEAD:main")
    return bare


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_runs_the_cli_in_the_task_worktree_and_cleans_it_up(
    name: str,
    stack: LiveStack,
    origin: Path,
    stubs: Path,
    tmp_path: Path,
) -> None:
    spaces = Workspaces(tmp_path / "ws", clone_url=f"{origin.parent.parent}/{{repository}}.git")
    config = RunnerConfig(
        command=["--verbose"], preset=PRESETS[name], workspaces=spaces, once=True, wait_s=5
    )
    config.check()
    with BrokerClient(stack.broker.url, "agent-a") as client:
        assert Runner(client, config).run() == 0

    seen: dict[str, Any] = json.loads(stubs.read_text())
    prompt = seen["argv"][EXPECTED[name].index("{p}")]
    assert "feature/issue-1" in prompt  # the broker's prompt, as one argument
    assert seen["name"] == name
    assert seen["argv"] == [prompt if w == "{p}" else w for w in EXPECTED[name]] + ["--verbose"]
    worktree = tmp_path / "ws" / "worktrees" / "acme" / "widgets" / "1"
    assert Path(seen["cwd"]) == worktree
    assert seen["branch"] == "feature/issue-1"
    assert seen["stdin"] == ""  # the prompt is in argv: piped again, the CLI would read it twice
    assert not worktree.exists()
    labels = lambda: set(stack.sim.state.issue_labels("acme", "widgets", 1))  # noqa: E731
    wait_for(lambda: "needs-review" in labels(), 15, "needs-review on the simulator")


@pytest.mark.slow
def test_a_failed_clone_releases_the_task_and_stops_the_runner(
    stack: LiveStack, stubs: Path, tmp_path: Path
) -> None:
    spaces = Workspaces(tmp_path / "ws", clone_url=f"{tmp_path}/nowhere/{{name}}.git")
    config = RunnerConfig(command=[], preset=PRESETS["claude"], workspaces=spaces, once=True)
    with (
        BrokerClient(stack.broker.url, "agent-a") as client,
        pytest.raises(RunnerError, match="git clone"),
    ):
        Runner(client, config).run()
    assert not stubs.exists()  # the CLI never started
    with BrokerClient(stack.broker.url, "agent-b") as other:
        task = other.request_task(wait_seconds=5)
        assert task is not None and task.issue_id == 1


@pytest.mark.slow
def test_agent_command_line_wires_preset_workspace_and_extra_words(
    stack: LiveStack, origin: Path, stubs: Path, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "github_broker", "agent", "--broker-url", stack.broker.url]
    command += ["--agent-id", "agent-a", "--once", "--wait", "5", "--preset", "aider"]
    command += ["--workspace", str(tmp_path / "ws")]
    command += ["--clone-url", f"{origin.parent.parent}/{{owner}}/{{name}}.git", "--"]
    command += ["--model", "m"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(stubs.read_text())
    assert seen["argv"][:2] == ["--yes-always", "--message"]
    assert seen["argv"][3:] == ["--model", "m"]
    assert seen["branch"] == "feature/issue-1"
