"""A tiny fake CI for the simulated GitHub: one check run on every push to a branch, which
fails while a marker file (`marker`, or any file under `marker/`) is in the branch and passes
once it is gone.

Set on a state (`state.ci = FakeCI(...)`, or a seed's `ci:` section): a push starts the check
(`in_progress`, App `github-actions`) and it completes `delay_s` later from the pushed
commit's files: failure with the marker's content as the summary and an annotation on it,
success otherwise. Pushes by a login in `approval_for` (a first-time contributor) start a
workflow run that waits for a maintainer's approval instead; approving it runs the check.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import commits
from .checks import ACTIONS_APP
from .model import Record, Repo

logger = logging.getLogger(__name__)

#: The check the fake CI reports.
DEFAULT_CHECK = "ci/test"
#: While this file is in a branch, its check fails.
DEFAULT_MARKER = ".ci-fail"
#: Seconds a check runs before it completes.
DEFAULT_DELAY_S = 1.0
#: The workflow whose run waits for approval.
WORKFLOW = "CI"


class FakeCI:
    """Runs one check per push; see the module."""

    def __init__(
        self,
        *,
        check: str = DEFAULT_CHECK,
        marker: str = DEFAULT_MARKER,
        delay_s: float = DEFAULT_DELAY_S,
        approval_for: list[str] | tuple[str, ...] = (),
    ) -> None:
        self.check = check
        self.marker = marker
        self.delay_s = delay_s
        self.approval_for = {login.lower() for login in approval_for}
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._closed = False

    def pushed(self, state: Any, repo: Repo, branch: str, push: Record) -> None:
        """A ref moved (called under the state lock)."""
        if str(push["pusher"]).lower() in self.approval_for:
            state.request_approval(
                repo.owner, repo.name, push["after"], workflow=WORKFLOW, actor=push["pusher"]
            )
            return
        self.run(state, repo, push["after"])

    def run(self, state: Any, repo: Repo, sha: str) -> None:
        """Start the check on `sha`; it completes after `delay_s`."""
        started = state.create_check_run(
            repo.owner,
            repo.name,
            {"name": self.check, "head_sha": sha, "status": "in_progress"},
            app=ACTIONS_APP,
        )
        with self._lock:
            if self._closed:
                return
            timer = threading.Timer(
                self.delay_s, self._complete, (state, repo.owner, repo.name, started["id"], sha)
            )
            timer.daemon = True
            self._timers.add(timer)
        timer.start()

    def verdict(self, files: dict[str, str]) -> dict[str, Any]:
        """The check's outcome for a commit with these files."""
        found = sorted(p for p in files if p == self.marker or p.startswith(self.marker + "/"))
        if not found:
            return {
                "conclusion": "success",
                "output": {"title": "All tests passed", "summary": "No test failed."},
            }
        path = found[0]
        reason = files[path].strip() or "the marker file is in the branch"
        return {
            "conclusion": "failure",
            "output": {
                "title": "1 test failed",
                "summary": f"`{path}` is in the branch: {reason}",
                "text": f"Remove `{path}` to make the check pass.",
                "annotations": [
                    {
                        "path": path,
                        "start_line": 1,
                        "end_line": 1,
                        "annotation_level": "failure",
                        "title": "test failed",
                        "message": reason,
                    }
                ],
            },
        }

    def _complete(self, state: Any, owner: str, name: str, run_id: int, sha: str) -> None:
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive()}
            if self._closed:
                return
        try:
            with state.lock:
                files = commits.tree(state.repo(owner, name), sha)
                state.update_check_run(owner, name, run_id, self.verdict(files))
        except Exception:  # the repository went away meanwhile: nothing to report to
            logger.exception("fake CI could not complete check run %d", run_id)

    def close(self) -> None:
        """Cancel the checks still running (the simulator stops)."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, set()
        for timer in timers:
            timer.cancel()
