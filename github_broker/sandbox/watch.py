"""The sandbox's event log: what changes on the simulated GitHub, what agents other than the
demo ones do, and what is left whenever the agents have nothing to take."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

from github_broker.errors import BrokerError, MirrorRebuilding
from github_broker.models import Event
from github_broker.sandbox.summary import backlog_left, moving_line, summary_lines
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: What the event log said last while the agents had nothing to take: the Backlog.key of its
#: line (the backlog moves on by itself) or of its summary; None: they had something.
Said = tuple[tuple[int, str, str], ...] | None

#: Seconds between two looks at the simulated GitHub and the broker's timeline.
WATCH_INTERVAL_S = 0.25
#: Seconds between two judgements of what is left (explain per agent: heavier than a look).
LEFT_INTERVAL_S = 1.0
#: Timeline kinds the event log shows for agents other than the demo ones (the demo agents'
#: runners log their own).
AGENT_EVENTS = {
    "claim": "claimed",
    "completed": "completed",
    "failed": "failed",
    "abandoned": "abandoned",
    "expired": "lost to expiry",
    "revoked": "had revoked",
    "issue_closed": "lost (issue closed)",
    "label_removed": "lost (label removed)",
    "no_pr": "completed with no PR (back in the pool)",
}


#: Timeline kinds of done-means-green (leader/checks.py) the event log shows, whoever acts.
CHECK_EVENTS = frozenset(
    {
        "checks_running",
        "checks_failed",
        "checks_green",
        "checks_fix",
        "checks_rebase",
        "conflict",
        "merged",
        "fix_withdrawn",
        "overlap",
        "wait_checks_failed",
        "wait_checks_stale",
        "wait_checks_approval",
    }
)


def check_event_line(event: Event) -> str:
    """A done-means-green event: `checks_failed` -> `checks failed: ...`."""
    kind = event.kind.removeprefix("wait_").replace("_", " ")
    if event.kind.startswith("wait_"):
        kind = f"waits on a person ({kind})"
    return f"broker: {event.repository}#{event.issue} {kind}: {event.detail}"


class Loop:
    """A daemon thread running `tick` every `interval_s` until stopped."""

    name = "sandbox-loop"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        raise NotImplementedError


class StoreLoop(Loop):
    """A Loop with an event loop and a connection to the broker's store of its own: `step`
    on one repository every `interval_s`."""

    def __init__(self, settings: Settings, repository: str, interval_s: float) -> None:
        super().__init__(interval_s)
        self.settings = settings
        self.repository = repository

    def _run(self) -> None:
        asyncio.run(self._steps())

    async def _steps(self) -> None:
        store = Store.from_settings(self.settings)
        rstore = store.repo(self.repository)
        try:
            while not self._stop.is_set():
                try:
                    await self.step(rstore)
                except MirrorRebuilding:
                    pass  # the first sync has not run yet
                except BrokerError as e:
                    logger.warning("%s: broker state unreadable: %s", self.name, e)
                await asyncio.sleep(self.interval_s)
        finally:
            await store.close()

    async def step(self, rstore: RepoStore) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Item:
    """One issue or pull request as the event log last saw it."""

    kind: str
    state: str
    labels: frozenset[str]
    title: str


class GitHubWatcher(Loop):
    """Logs what changes on the simulated GitHub: labels, new pull requests, closed issues."""

    name = "sandbox-watch"

    def __init__(self, sim: Simulator, repository: str, interval_s: float = WATCH_INTERVAL_S):
        super().__init__(interval_s)
        self.sim = sim
        self.owner, self.repo = repository.split("/")
        self.seen: dict[int, Item] = {}

    def start(self) -> None:
        self.seen = self.snapshot()
        super().start()

    def snapshot(self) -> dict[int, Item]:
        items: dict[int, Item] = {}
        page = 1
        while True:
            batch, total = self.sim.state.list_issues(
                self.owner, self.repo, state="all", per_page=100, page=page
            )
            for d in batch:
                items[d["number"]] = Item(
                    kind="PR" if "pull_request" in d else "issue",
                    state=d["state"],
                    labels=frozenset(lab["name"] for lab in d["labels"]),
                    title=d["title"],
                )
            if page * 100 >= total:
                return items
            page += 1

    def tick(self) -> None:
        current = self.snapshot()
        for number, item in sorted(current.items()):
            self._report(number, self.seen.get(number), item)
        self.seen = current

    def _report(self, number: int, before: Item | None, item: Item) -> None:
        if before is None:
            self._opened(number, item)
            return
        added, removed = item.labels - before.labels, before.labels - item.labels
        if added or removed:
            changes = [f"+{n}" for n in sorted(added)] + [f"-{n}" for n in sorted(removed)]
            logger.info(
                "github: %s#%d labels %s",
                "PR " if item.kind == "PR" else "",
                number,
                " ".join(changes),
            )
        if item.state != before.state:
            logger.info("github: %s #%d %s", item.kind, number, item.state)

    def _opened(self, number: int, item: Item) -> None:
        if item.kind != "PR":
            logger.info("github: issue #%d opened: %s", number, item.title)
            return
        pull = self.sim.state.get_pull(self.owner, self.repo, number)
        first_line = (pull.get("body") or "").splitlines()[:1]
        logger.info(
            "github: PR #%d opened: %s -> %s, %r",
            number,
            pull["head"]["ref"],
            pull["base"]["ref"],
            first_line[0] if first_line else "",
        )


def agent_event_line(event: Event) -> str:
    what = AGENT_EVENTS[event.kind]
    task = f" ({event.detail.split(':')[0]})" if event.kind == "claim" and event.detail else ""
    return f"broker: {event.agent} {what} {event.repository}#{event.issue}{task}"


class BrokerWatcher(StoreLoop):
    """Logs what other agents do (from the broker's timeline) and, each time the agents have
    nothing to take, what is left: one line while the backlog moves on by itself, the whole
    summary (done, waiting on a person and what to do, skipped) when only people can."""

    name = "sandbox-broker"

    def __init__(
        self,
        settings: Settings,
        repository: str,
        demo_agents: list[str],
        hints: list[str] | None = None,
        maintainer: bool = False,
        interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        super().__init__(settings, repository, interval_s)
        self.maintainer = maintainer
        self.demo_agents = set(demo_agents)
        #: The agents whose turn the summary judges: the demo ones and every one seen claim.
        self.agents = set(demo_agents)
        #: How a person does what the summary asks, on this sandbox.
        self.hints = hints or []
        self.done: dict[int, str] = {}
        #: What was said since the last claim (a claim starts a new stretch of work).
        self.said: Said = None
        self.last_event = "0-0"
        self.judged_at = 0.0

    async def step(self, rstore: RepoStore) -> None:
        for event in await rstore.timeline_since(self.last_event):
            self.last_event = event.id
            self._note(event)
        if time.monotonic() - self.judged_at >= LEFT_INTERVAL_S:
            self.judged_at = time.monotonic()
            self.said = await self._left(rstore, self.said)

    async def _left(self, rstore: RepoStore, said: Said) -> Said:
        """Log what is left when the agents have nothing to take, each time what holds each
        issue changes: one line while the backlog moves on by itself (a review delay, a
        grace, a cool-down ending), the summary once only people can move it. Returns what
        was said."""
        agents = sorted(self.agents)
        backlog = await backlog_left(rstore, self.settings, agents, self.maintainer)
        if backlog is None:
            return None
        key = backlog.key()
        if key == said:
            return said
        if backlog.moving:
            logger.info("%s", moving_line(backlog))
        else:
            for line in summary_lines(backlog, self.done, self.hints):
                logger.info("%s", line)
        return key

    def _note(self, event: Event) -> None:
        if event.kind == "completed" and event.issue is not None and event.detail == "development":
            self.done[event.issue] = event.agent
        if event.kind == "no_pr" and event.issue is not None:
            self.done.pop(event.issue, None)
        if event.kind == "claim" and event.agent:
            self.agents.add(event.agent)
            self.said = None
        if event.kind in AGENT_EVENTS and event.agent and event.agent not in self.demo_agents:
            logger.info("%s", agent_event_line(event))
        if event.kind in CHECK_EVENTS:
            logger.info("%s", check_event_line(event))
