"""Maintainers' notes for the coding agent: a markdown file in the task's working directory."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from github_broker.agent.workspace import WorkspaceError, run_git
from github_broker.models import Note, Task

logger = logging.getLogger(__name__)

#: The notes file's name, in the directory the command runs in (GB_NOTES_FILE names it).
NOTES_FILE_NAME = ".broker-notes.md"
#: Seconds the `git` calls that keep the notes file out of commits may take.
GIT_TIMEOUT_S = 10.0


class NotesFile:
    """Appends each note a heartbeat delivers to `<cwd>/.broker-notes.md`, where a coding agent
    reads it like any other file. Created with the first note, kept out of git commits
    (`info/exclude` of the repository the directory is in), removed when the task ends."""

    def __init__(self, cwd: Path, task: Task) -> None:
        self.path = cwd / NOTES_FILE_NAME
        self.task = task
        self._created = False
        self._lock = threading.Lock()

    def append(self, notes: list[Note]) -> None:
        text = "".join(f"## From {n.by} at {n.at}\n\n{n.text.strip()}\n\n" for n in notes)
        with self._lock:
            try:
                mode = "a"
                if not self._created:  # a file left by an earlier task (a crash) is replaced
                    _exclude_from_git(self.path)
                    text, mode = self._header() + text, "w"
                with self.path.open(mode, encoding="utf-8") as fh:
                    fh.write(text)
                self._created = True
            except OSError as e:
                logger.warning("could not write the notes to %s: %s", self.path, e)

    def remove(self) -> None:
        """Remove the file if this task created it (the next task starts without it)."""
        with self._lock:
            if self._created:
                self.path.unlink(missing_ok=True)
                self._created = False

    def _header(self) -> str:
        task = self.task
        return (
            f"# Notes from the maintainers on {task.repository}#{task.issue_id}\n\n"
            "Messages about the task you are working on, newest last. Read them and follow "
            "them. (Written by github-broker's runner; removed when the task ends.)\n\n"
        )


def _exclude_from_git(path: Path) -> None:
    """Name the file in `info/exclude` of the repository `path` is in (a worktree's is its
    clone's), so `git add -A` does not put maintainers' notes in the task's commits."""
    try:
        found = run_git(path.parent, ("rev-parse", "--git-path", "info/exclude"), GIT_TIMEOUT_S)
    except WorkspaceError:
        return  # no git: nothing to keep it out of
    if found.returncode != 0:
        return  # not in a repository
    exclude = path.parent / found.stdout.strip()
    try:
        known = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
        if path.name not in known.splitlines():
            exclude.parent.mkdir(parents=True, exist_ok=True)
            with exclude.open("a", encoding="utf-8") as fh:
                fh.write(("\n" if known and not known.endswith("\n") else "") + f"{path.name}\n")
    except OSError as e:
        logger.info("could not keep %s out of git (%s): %s", path.name, exclude, e)
