"""Task workspaces: a bare clone per repository and a worktree per task, on a local bare repo."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from github_broker.agent.workspace import WorkspaceError, Workspaces
from github_broker.models import Task, TaskType
from tests.factories import body

GIT_ID = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *GIT_ID, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def origin(tmp_path: Path) -> Path:
    """A bare `acme/widgets.git` with `main` (one commit) and `feature/issue-2` (one more)."""
    remotes = tmp_path / "remotes" / "acme"
    remotes.mkdir(parents=True)
    git(remotes, "init", "--quiet", "--bare", "--initial-branch=main", "widgets.git")
    seed = tmp_path / "seed"
    git(tmp_path, "clone", "--quiet", str(remotes / "widgets.git"), str(seed))
    (seed / "README.md").write_text("widgets\n")
    git(seed, "add", "README.md")
    git(seed, "commit", "--quiet", "-m", "first")
    git(seed, "push", "--quiet", "origin", "HEAD:main")
    git(seed, "switch", "--quiet", "-c", "feature/issue-2")
    (seed / "csv.py").write_text("print('csv')\n")
    git(seed, "add", "csv.py")
    git(seed, "commit", "--quiet", "-m", "csv export")
    git(seed, "push", "--quiet", "origin", "feature/issue-2")
    return remotes.parent


def task(number: int, task_type: TaskType = TaskType.DEVELOPMENT, base: str = "main") -> Task:
    return Task.model_validate(
        {
            "issue_id": number,
            "issue_url": f"https://github.com/acme/widgets/issues/{number}",
            "title": "Add CSV export",
            "body": body(),
            "labels": ["P1"],
            "branch_name": f"feature/issue-{number}",
            "prompt": "Do it.",
            "required_role": "BACKENDCODER",
            "task_type": task_type,
            "repository": "acme/widgets",
            "base_branch": base,
            "lease": {
                "token": "t",
                "expires_at": "2030-01-01T00:00:00Z",
                "heartbeat_interval_s": 5,
            },
        }
    )


def test_a_new_task_gets_a_worktree_on_its_branch_from_the_base_branch(
    origin: Path, tmp_path: Path
) -> None:
    spaces = Workspaces(tmp_path / "ws", clone_url=f"{origin}/{{repository}}.git")
    with spaces.checkout(task(1)) as path:
        assert path == tmp_path / "ws" / "worktrees" / "acme" / "widgets" / "1"
        assert git(path, "branch", "--show-current") == "feature/issue-1"
        assert git(path, "rev-parse", "HEAD") == git(
            origin / "acme" / "widgets.git", "rev-parse", "main"
        )
        assert (path / "README.md").read_text() == "widgets\n"
        # The agent can commit and push its branch from here.
        (path / "export.py").write_text("x = 1\n")
        git(path, "add", "export.py")
        git(path, "commit", "--quiet", "-m", "work")
        git(path, "push", "--quiet", "origin", "HEAD")
    assert not path.exists()
    assert "feature/issue-1" in git(origin / "acme" / "widgets.git", "branch", "--list")
    # One clone per repository, kept for the next task; no worktree left registered in it.
    clone = tmp_path / "ws" / "acme" / "widgets.git"
    assert git(clone, "rev-parse", "--is-bare-repository") == "true"
    assert len(git(clone, "worktree", "list").splitlines()) == 1


def test_a_task_whose_branch_exists_starts_from_the_pushed_work(
    origin: Path, tmp_path: Path
) -> None:
    spaces = Workspaces(tmp_path / "ws", clone_url=f"{origin}/{{repository}}.git")
    with spaces.checkout(task(1)):
        pass  # the clone now exists; the next checkout fetches instead of cloning
    with spaces.checkout(task(2, TaskType.FIX)) as path:
        assert git(path, "branch", "--show-current") == "feature/issue-2"
        assert (path / "csv.py").is_file()
        assert git(path, "rev-parse", "--abbrev-ref", "@{upstream}") == "origin/feature/issue-2"


def test_a_leftover_worktree_from_a_crash_is_replaced(origin: Path, tmp_path: Path) -> None:
    spaces = Workspaces(tmp_path / "ws", clone_url=f"{origin}/{{repository}}.git")
    first = spaces.add(task(1))
    (first / "junk.txt").write_text("left behind")
    second = spaces.add(task(1))  # no remove() in between: the runner was killed
    assert second == first and not (second / "junk.txt").exists()
    spaces.remove(task(1))
    assert not first.exists()


def test_a_bad_clone_url_or_base_branch_is_a_clear_error(origin: Path, tmp_path: Path) -> None:
    missing = Workspaces(tmp_path / "ws1", clone_url=f"{tmp_path}/nowhere/{{name}}.git")
    with pytest.raises(WorkspaceError, match="git clone"):
        missing.add(task(1))
    spaces = Workspaces(tmp_path / "ws2", clone_url=f"{origin}/{{repository}}.git")
    with pytest.raises(WorkspaceError, match="no branch 'develop'"):
        spaces.add(task(1, base="develop"))
