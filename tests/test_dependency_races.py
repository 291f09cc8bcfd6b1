"""Links added and removed, blockers closed and reopened, while 50 agents claim: no issue is
ever handed out while the broker holds it blocked.

The judge is Redis's own order of events: the claim and graph_save.lua write to the
repository's timeline stream inside their scripts, so the stream is the order in which they
ran. Replaying it, no `claim` of an issue may fall between its `blocked` and `unblocked`. A
blocker reopened reaches the claim before its `blocked` event (the mirror's `open`, moved by
the delivery of the blocker itself), so the replay is conservative: it sees no blocked issue
that the claim could not see.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from github_broker.models import Outcome
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import repo as repo_store
from tests.factories import body
from tests.world import World, running_world, simulated

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
W = ("acme", "widgets")
AGENTS = 50
BLOCKERS = range(1, 9)
DEPENDENTS = range(11, 61)
#: The maintainer's changes: the race lasts until it has made them all (however slow the
#: machine), agents claiming all along; a bound for a machine that cannot.
LINK_CHANGES = 60
BLOCKER_MOVES = 25
RACE_LIMIT_S = 120.0


def backlog() -> list[dict[str, Any]]:
    """Blockers are not work (no labels): only links and their state move the dependents."""
    issues = [{"number": n, "title": f"Blocker {n}", "body": "upstream"} for n in BLOCKERS]
    for n in DEPENDENTS:
        issues.append({
            "number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"],
            "blocked_by": [n % 8 + 1] if n % 3 == 0 else [],
        })
    return issues


def envelope(event: str, payload: dict[str, Any]) -> str:
    head = {"event": event, "delivery": str(uuid.uuid4())}
    return json.dumps(head) + "\n" + json.dumps(payload)


class Maintainer:
    """Edits the graph on GitHub and delivers each change to the leader's webhook worker."""

    def __init__(self, w: World, sim: Simulator, rng: random.Random) -> None:
        self.w, self.sim, self.rng = w, sim, rng
        self.links = 0
        self.moves = 0

    async def deliver(self, event: str, payload: dict[str, Any]) -> None:
        repo = self.w.settings.repositories[0]
        await self.w.daemon.webhooks.apply(repo, self.w.rstore, envelope(event, payload))

    async def toggle_link(self) -> None:
        st = self.sim.state
        d, b = self.rng.choice(DEPENDENTS), self.rng.choice(BLOCKERS)
        linked = any(i["number"] == b for i in st.blocked_by(*W, d)[0])
        if linked:
            st.unblock(*W, d, by=(*W, b))
        else:
            st.block(*W, d, by=(*W, b))
        action = "blocked_by_removed" if linked else "blocked_by_added"
        await self.deliver("issue_dependencies", {
            "action": action,
            "blocked_issue": st.get_issue(*W, d),
            "blocking_issue": st.get_issue(*W, b),
            "blocking_issue_repo": {"full_name": "acme/widgets"},
        })
        self.links += 1

    async def move_blocker(self) -> None:
        st = self.sim.state
        b = self.rng.choice(BLOCKERS)
        closing = st.get_issue(*W, b)["state"] == "open"
        st.update_issue(*W, b, state="closed" if closing else "open")
        await self.deliver("issues", {
            "action": "closed" if closing else "reopened", "issue": st.get_issue(*W, b)
        })
        self.moves += 1

    async def run(self, done: asyncio.Event) -> None:
        """Links and blockers changed in random order until both quotas are met."""
        deadline = time.monotonic() + RACE_LIMIT_S
        try:
            while self.links < LINK_CHANGES or self.moves < BLOCKER_MOVES:
                assert time.monotonic() < deadline, (self.links, self.moves)
                if self.moves >= BLOCKER_MOVES or (
                    self.links < LINK_CHANGES and self.rng.random() < 0.7
                ):
                    await self.toggle_link()
                else:
                    await self.move_blocker()
                await asyncio.sleep(self.rng.uniform(0, 0.02))
        finally:
            done.set()


async def agent(w: World, name: str, done: asyncio.Event, claims: list[int]) -> None:
    while not done.is_set():
        task = await w.tasks.request_task(name, previous=Outcome.ABANDONED)
        if task is None:
            await asyncio.sleep(0.005)
        else:
            claims.append(task.issue_id)


def replay(events: list[Any]) -> tuple[list[str], dict[str, int]]:
    """Violations (a claim of an issue the stream holds blocked) and counts."""
    blocked: set[int] = set()
    violations, counts = [], {"claim": 0, "blocked": 0, "unblocked": 0, "claim_once_blocked": 0}
    ever: set[int] = set()
    for e in events:
        if e.kind == "blocked":
            blocked.add(e.issue)
            ever.add(e.issue)
        elif e.kind == "unblocked":
            blocked.discard(e.issue)
        elif e.kind == "claim":
            if e.issue in blocked:
                violations.append(f"{e.id}: #{e.issue} claimed by {e.agent} while blocked")
            if e.issue in ever:
                counts["claim_once_blocked"] += 1
        if e.kind in counts:
            counts[e.kind] += 1
    return violations, counts


async def test_links_added_and_removed_while_50_agents_claim_never_hand_out_a_blocked_issue(
    redis_url: str, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every event of the race stays in the stream for the replay.
    monkeypatch.setattr(repo_store, "TIMELINE_MAX", 1_000_000)
    rng = random.Random(35)
    with simulated(backlog()) as sim:
        async with running_world(
            sim, redis_url, make_settings,
            failures={"cooldown_s": 0, "max_failures": 1_000_000, "breaker_streak": 0},
        ) as w:
            await w.tick()
            assert len(await w.rstore.blocked()) == len([n for n in DEPENDENTS if n % 3 == 0])
            done = asyncio.Event()
            claims: list[int] = []
            maintainer = Maintainer(w, sim, rng)
            await asyncio.gather(
                maintainer.run(done),
                *(agent(w, f"agent-{i}", done, claims) for i in range(AGENTS)),
            )
            events = []
            last = "0-0"
            while batch := await w.rstore.timeline_since(last, count=5000):
                events += batch
                last = batch[-1].id
    violations, counts = replay(events)
    print(f"\nrace: {len(claims)} claims, {maintainer.links} link changes, "
          f"{maintainer.moves} blocker moves, stream {counts}")
    assert violations == []
    # The race had work on both sides.
    assert counts["claim"] == len(claims) >= 500
    assert counts["blocked"] >= 30 and counts["unblocked"] >= 30
    assert counts["claim_once_blocked"] >= 50
