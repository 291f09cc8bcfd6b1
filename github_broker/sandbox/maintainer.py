"""The sandbox's simulated maintainer: a stand-in for the person who merges reviewed PRs.

On real GitHub a person merges a PR once its review is done, or asks for changes; the broker
only says the issue waits on that person. In the sandbox nobody would, and the demo backlog
would stop at its first reviewed PR. This loop reads what waits on a person (the broker's
`waiting` index) and, on the simulated GitHub, merges each reviewed PR (closing its issue),
asks for changes once on every Nth one (a fix round), and closes a story once every issue it
lists is closed. Off (`--no-maintainer`), it only says what a person must do.
"""

from __future__ import annotations

import json
import logging
import re
import time

from github_broker.models import Waiting
from github_broker.sandbox.summary import person_todo
from github_broker.sandbox.watch import StoreLoop
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.simulator.messages import ApiError
from github_broker.store import RepoStore

logger = logging.getLogger(__name__)

#: How the event log names it, so nobody takes it for the broker or an agent.
SAYS = "maintainer (the sandbox's stand-in for a person)"
#: GitHub login it acts as: not the broker's, whose comments never count as feedback.
LOGIN = "sandbox-maintainer"
#: Seconds a reviewed PR waits before the maintainer acts: a person is not instant, and the
#: dashboard shows the issue waiting on a person meanwhile.
DELAY_S = 2.0
#: Seconds between two looks at what waits on a person.
INTERVAL_S = 0.5
#: It asks for changes once on every Nth reviewed PR (0: never), so fix rounds show.
CHANGES_EVERY = 3
CHANGES_BODY = (
    "Please also handle the error path and add a test for it. "
    "(The sandbox's simulated maintainer asks this on every few PRs to show a fix round.)"
)
_REFERENCE = re.compile(r"#(\d+)\b")


class Maintainer(StoreLoop):
    """Acts on (or, off, tells a person of) what waits on a person; see the module."""

    name = "sandbox-maintainer"

    def __init__(
        self,
        sim: Simulator,
        settings: Settings,
        repository: str,
        *,
        acting: bool = True,
        changes_every: int = CHANGES_EVERY,
        delay_s: float = DELAY_S,
        interval_s: float = INTERVAL_S,
    ) -> None:
        super().__init__(settings, repository, interval_s)
        self.sim = sim
        self.owner, self.repo = repository.split("/")
        self.acting = acting
        self.changes_every = changes_every
        self.delay_s = delay_s
        #: issue -> since_ms of the wait it acted on (a new wait after a fix round is new).
        self.acted: dict[int, int] = {}
        #: Reviewed PRs seen, in order (the Nth asks for changes), and those it asked on.
        self.reviewed: list[int] = []
        self.asked: set[int] = set()
        #: (issue, code, since_ms) of the waits already told to a person.
        self.told: set[tuple[int, str, int]] = set()

    async def step(self, rstore: RepoStore) -> None:
        waiting = await rstore.waiting()
        states = await rstore.review_states(sorted(waiting))
        now_ms = time.time() * 1000
        for n, w in sorted(waiting.items()):
            link = json.loads(states[n][1].get("link") or "{}")
            pr = int(link["pr"]) if link.get("pr") else None
            if self.acting and w.code == "awaiting_feedback" and pr is not None:
                if self.acted.get(n) != w.since_ms and now_ms - w.since_ms >= self.delay_s * 1000:
                    self.acted[n] = w.since_ms
                    self._decide(n, pr)
                continue
            self._tell(n, w, pr)
        if self.acting:
            self._close_stories()

    def _tell(self, n: int, w: Waiting, pr: int | None) -> None:
        if (n, w.code, w.since_ms) in self.told:
            return
        self.told.add((n, w.code, w.since_ms))
        logger.info("waits on a person: #%d %s: %s", n, self._title(n), person_todo(w, pr))

    def _decide(self, n: int, pr: int) -> None:
        """Merge the reviewed PR, or (once, on every Nth PR) ask for changes."""
        if pr not in self.reviewed:
            self.reviewed.append(pr)
        nth = self.reviewed.index(pr) + 1
        if self.changes_every and nth % self.changes_every == 0 and pr not in self.asked:
            self.asked.add(pr)
            self.sim.state.add_review(
                self.owner, self.repo, pr, user=LOGIN, body=CHANGES_BODY, state="REQUEST_CHANGES"
            )
            logger.info("%s: asked for changes on PR #%d (#%d)", SAYS, pr, n)
            return
        try:
            self.sim.state.merge_pull(self.owner, self.repo, pr, user=LOGIN)
        except ApiError as e:  # merged or closed by someone else meanwhile, or not green yet
            logger.info("%s: PR #%d not merged: %s", SAYS, pr, e)
            if "Required status check" in e.message:
                self.acted.pop(n, None)  # its checks still run: merge it once they pass
            return
        closed = "closed by it"
        if self.sim.state.get_issue(self.owner, self.repo, n)["state"] == "open":
            # Its body did not say "Closes #n": the PR's branch names the issue, close it.
            self.sim.state.update_issue(self.owner, self.repo, n, state="closed")
            closed = "closed"
        logger.info("%s: merged PR #%d; #%d %s", SAYS, pr, n, closed)

    def _close_stories(self) -> None:
        labels = self.settings.labels
        for label in (labels.story, labels.epic):
            stories, _ = self.sim.state.list_issues(
                self.owner, self.repo, state="open", labels=[label], per_page=100
            )
            for story in stories:
                listed = {int(m) for m in _REFERENCE.findall(story.get("body") or "")}
                listed.discard(story["number"])
                if listed and all(self._closed(m) for m in listed):
                    self.sim.state.update_issue(
                        self.owner, self.repo, story["number"], state="closed"
                    )
                    numbers = ", ".join(f"#{m}" for m in sorted(listed))
                    logger.info(
                        "%s: closed %s #%d: %s are closed", SAYS, label, story["number"], numbers
                    )

    def _closed(self, n: int) -> bool:
        try:
            return bool(self.sim.state.get_issue(self.owner, self.repo, n)["state"] == "closed")
        except ApiError:  # not an issue of this repository: it does not keep the story open
            return True

    def _title(self, n: int) -> str:
        try:
            return str(self.sim.state.get_issue(self.owner, self.repo, n)["title"])
        except ApiError:
            return ""
