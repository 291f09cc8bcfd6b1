"""Git workspaces for tasks: one bare clone per repository, a `git worktree` per task."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from github_broker.models import Task

logger = logging.getLogger(__name__)

#: Where repositories are cloned from unless told; `{repository}` is owner/name, `{owner}`
#: and `{name}` its halves. SSH (`git@github.com:{repository}.git`) or a credential helper
#: carry the credentials: a token in this URL would end up in logs.
DEFAULT_CLONE_URL = "https://github.com/{repository}.git"
#: Seconds a git command may take (a first clone of a big repository is the slow one).
GIT_TIMEOUT_S = 600.0


class WorkspaceError(Exception):
    """A git command for a task's workspace failed: clone, fetch or worktree."""


@dataclass(frozen=True)
class Workspaces:
    """Checkouts under `root`: `<root>/<owner>/<name>.git` (a bare clone, fetched before each
    task) and `<root>/worktrees/<owner>/<name>/<issue>` (the task's branch)."""

    root: Path
    clone_url: str = DEFAULT_CLONE_URL

    def url(self, repository: str) -> str:
        owner, _, name = repository.partition("/")
        return self.clone_url.format(repository=repository, owner=owner, name=name)

    def clone_dir(self, repository: str) -> Path:
        owner, _, name = repository.partition("/")
        return self.root / owner / f"{name}.git"

    def task_dir(self, task: Task) -> Path:
        owner, _, name = task.repository.partition("/")
        return self.root / "worktrees" / owner / name / str(task.issue_id)

    @contextlib.contextmanager
    def checkout(self, task: Task) -> Iterator[Path]:
        """A worktree on the task's branch for the duration of the block, then removed.

        The branch starts from the remote branch when it exists (review and fix tasks, a
        retried task whose work was pushed), else from the base branch. Removing the worktree
        keeps the branch in the clone, so unpushed commits stay reachable until the next
        checkout of the same branch resets it.
        """
        path = self.add(task)
        try:
            yield path
        finally:
            self.remove(task)

    def add(self, task: Task) -> Path:
        clone, dest = self.clone_dir(task.repository), self.task_dir(task)
        with self._locked(task.repository):
            self._ensure_clone(task.repository, clone)
            self._drop(clone, dest)  # left over by a crashed run
            branch, base = task.branch_name, task.base_branch
            if _git_ok(clone, "rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{branch}"):
                start, track = f"origin/{branch}", ["--track"]
            elif _git_ok(clone, "rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{base}"):
                start, track = f"origin/{base}", ["--no-track"]
            else:
                raise WorkspaceError(
                    f"{task.repository} has no branch {base!r} at {self.url(task.repository)}"
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            _git(clone, "worktree", "add", *track, "-B", branch, str(dest), start)
        logger.info(
            "%s#%d: worktree %s on %s from %s", task.repository, task.issue_id, dest, branch, start
        )
        return dest

    def remove(self, task: Task) -> None:
        clone, dest = self.clone_dir(task.repository), self.task_dir(task)
        with self._locked(task.repository):
            self._drop(clone, dest)

    def _ensure_clone(self, repository: str, clone: Path) -> None:
        if not (clone / "HEAD").is_file():
            shutil.rmtree(clone, ignore_errors=True)  # a clone that was cut short
            clone.parent.mkdir(parents=True, exist_ok=True)
            _git(clone.parent, "clone", "--bare", "--quiet", self.url(repository), clone.name)
            # A bare clone maps branches onto refs/heads; fetch them as origin/* instead, so
            # task branches are local branches of their own.
            _git(clone, "config", "remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*")
        _git(clone, "fetch", "--prune", "--quiet", "origin")

    def _drop(self, clone: Path, dest: Path) -> None:
        if not (clone / "HEAD").is_file():
            shutil.rmtree(dest, ignore_errors=True)
            return
        if dest.exists() and not _git_ok(clone, "worktree", "remove", "--force", str(dest)):
            shutil.rmtree(dest, ignore_errors=True)
        _git(clone, "worktree", "prune")

    @contextlib.contextmanager
    def _locked(self, repository: str) -> Iterator[None]:
        """Runners sharing a root take turns on a repository's clone."""
        lock = self.clone_dir(repository).with_suffix(".lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def run_git(
    cwd: Path, args: tuple[str, ...], timeout_s: float = GIT_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`git args` in `cwd`, its output captured; WorkspaceError when git cannot run."""
    # No terminal prompt: a missing credential fails the command instead of hanging it.
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise WorkspaceError(f"git {' '.join(args)}: {e}") from e


def _git(cwd: Path, *args: str) -> str:
    result = run_git(cwd, args)
    if result.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} (in {cwd}): {result.stderr.strip()}")
    return result.stdout


def _git_ok(cwd: Path, *args: str) -> bool:
    return run_git(cwd, args).returncode == 0
