"""`/broker …` comment commands: each verb from an issue comment, by a signed webhook delivery
and by the poller's read of new comments, with its effect on Redis, on GitHub's labels and on
the agent's next heartbeat; who may give them and what that costs; once per comment."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.gateway.pacing import TokenBucket
from github_broker.models import Outcome
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.steering.commands import grammar
from tests.factories import body, make_known
from tests.test_review_loop import REVIEW, developed
from tests.test_webhooks import SECRET, Capture, deliver, hooked
from tests.world import ONE_ISSUE, REPO, World, running_world, simulated

ISSUES = [
    {"number": n, "title": f"Task {n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
    for n in (1, 2, 3)
]
#: alice and mona may steer (write, maintain); tina (triage) and rita (read) may not.
PEOPLE = {"alice": "write", "mona": "maintain", "tina": "triage", "rita": "read"}
PERMISSION = "GET /repos/{owner}/{repo}/collaborators/{username}/permission"
BROKER_LOGIN = "broker-bot"  # the simulator's login for any token
PATHS = ["webhook", "poll"]


@pytest.fixture
def sim() -> Iterator[Simulator]:
    repo = {"owner": "acme", "name": "widgets", "issues": ISSUES, "collaborators": PEOPLE}
    with Simulator({"repositories": [repo]}) as s:
        yield s


@pytest.fixture
def capture() -> Iterator[Capture]:
    c = Capture()
    yield c
    c.close()


@dataclass
class Broker:
    """The leader's side in process (World), agents over HTTP, comments by either path."""

    w: World
    http: TestClient
    capture: Capture
    path: str

    async def say(self, text: str, n: int = 1, user: str = "alice") -> int:
        """`user` comments `text` on issue n; the broker sees it by this broker's path.
        Returns the comment id."""
        comment = self.w.sim.state.add_issue_comment("acme", "widgets", n, user=user, body=text)
        if self.path == "webhook":
            await deliver(self.w, self.capture)
        else:
            await self.w.tick()
        return int(comment["id"])

    def claim(self, agent: str) -> dict[str, Any]:
        r = self.http.post("/request-task", json={"agent_id": agent})
        assert r.status_code == 200, r.text
        task: dict[str, Any] = r.json()
        return task

    def beat(self, task: dict[str, Any], agent: str) -> Any:
        lease = {"agent_id": agent, "token": task["lease"]["token"]}
        return self.http.post(f"/tasks/{REPO}/{task['issue_id']}/heartbeat", json=lease)

    def reactions(self, comment_id: int) -> list[tuple[str, str]]:
        got = self.w.sim.state.list_reactions("acme", "widgets", comment_id)
        return [(r["user"]["login"], r["content"]) for r in got]

    def replies(self, n: int) -> list[str]:
        comments = self.w.sim.state.list_issue_comments("acme", "widgets", n)
        return [c["body"] for c in comments if c["user"]["login"] == BROKER_LOGIN]

    async def audit(self) -> list[Any]:
        return await self.w.store.audit_log(100)

    def calls(self, route: str) -> int:
        return int(self.w.sim.stats.snapshot()["by_route"].get(route, 0))


@asynccontextmanager
async def broker(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
    **overrides: Any,
) -> AsyncIterator[Broker]:
    overrides.setdefault("server", {"run_poller": False})
    if path == "webhook":
        overrides.setdefault("webhooks", {"secret": SECRET})
    async with running_world(sim, redis_url, make_settings, **overrides) as w:
        if path == "webhook":
            hooked(sim, capture.url)
        await w.tick()  # the mirror, and the comment cursor starts now
        with TestClient(create_app(w.settings)) as http:
            yield Broker(w, http, capture, path)


def agent_labels(b: Broker, n: int) -> set[str]:
    return b.w.labels(n) & {"in-progress", "a1", "a2"}


# --- each verb, by either path -------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_release_revokes_the_lease_names_the_commenter_and_frees_the_labels(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.w.daemon.drain_all()
        assert agent_labels(b, n) == {"in-progress", "a1"}
        cid = await b.say("Stopping this one.\n/broker release wrong approach", n)
        beat = b.beat(task, "a1")
        assert beat.status_code == 409 and beat.json()["reason"] == "revoked"
        assert "revoked by github:alice: wrong approach" in beat.json()["detail"]
        await b.w.daemon.drain_all()
        assert agent_labels(b, n) == set()
        assert b.claim("a2")["issue_id"] == n  # back in the pool
        assert b.reactions(cid) == [(BROKER_LOGIN, "+1")]
        assert b.replies(n) == []  # it did what it says: the reaction is the answer
        entries = [e for e in await b.audit() if e.action == "revoke"]
        assert [(e.actor, e.agent, e.reason) for e in entries] == [
            ("github:alice", "a1", "wrong approach")
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_hold_keeps_the_issue_for_a_person_until_retry_gives_it_back(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.say("/broker hold", n, user="mona")  # maintain: a maintainer
        assert b.beat(task, "a1").status_code == 409
        others = {b.claim(f"b{i}")["issue_id"] for i in range(2)}
        assert n not in others
        assert b.http.post("/request-task", json={"agent_id": "b9"}).status_code == 204
        assert [w.code for w in (await b.w.rstore.waiting()).values()] == ["held"]
        # A writer cannot lift a maintainer's hold: refused, said, audited.
        cid = await b.say("/broker retry", n)
        assert b.reactions(cid) == [(BROKER_LOGIN, "confused")]
        assert b.http.post("/request-task", json={"agent_id": "b9"}).status_code == 204
        cid = await b.say("/broker retry", n, user="mona")
        assert b.reactions(cid) == [(BROKER_LOGIN, "+1")]
        assert b.claim("b9")["issue_id"] == n
        actions = [(e.action, e.actor) for e in reversed(await b.audit())]
        assert actions == [
            ("revoke", "github:mona"),
            ("retry", "github:alice"),
            ("retry", "github:mona"),
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_reassign_moves_the_task_to_the_named_agent_with_its_branch(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    make_known(redis_url, "a2")
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.w.daemon.drain_all()
        await b.say("/broker reassign a2 a1 is stuck", n)
        beat = b.beat(task, "a1")
        assert beat.status_code == 409 and "reassigned to a2 by github:alice" in beat.text
        assert b.claim("a3")["issue_id"] != n
        moved = b.claim("a2")
        assert moved["issue_id"] == n and moved["branch_name"] == task["branch_name"]
        assert moved["continues"]["from_agent"] == "a1"
        await b.w.daemon.drain_all()
        assert agent_labels(b, n) == {"in-progress", "a2"}


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_note_reaches_the_holder_with_its_next_heartbeat(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.say("/broker note Use the new parser, not the regex.", n)
        notes = b.beat(task, "a1").json()["notes"]
        assert [(x["by"], x["text"]) for x in notes] == [
            ("github:alice", "Use the new parser, not the regex.")
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_pause_lets_the_task_finish_and_resume_gives_work_again(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.say("/broker pause a1 draining for the upgrade", n)
        paused = b.beat(task, "a1").json()["agent_paused"]
        assert paused["kind"] == "pause" and paused["by"] == "github:alice"
        lease = {"agent_id": "a1", "token": task["lease"]["token"]}
        assert b.http.post(f"/tasks/{REPO}/{n}/complete", json=lease).status_code == 200
        refused = b.http.post("/request-task", json={"agent_id": "a1"})
        assert refused.status_code == 409 and refused.json()["reason"] == "agent_paused"
        await b.say("/broker resume a1", 2)
        assert b.claim("a1")["issue_id"] != n


@pytest.mark.anyio
@pytest.mark.parametrize("path", PATHS)
async def test_stop_revokes_the_agents_lease_now_and_frees_its_labels(
    sim: Simulator,
    redis_url: str,
    make_settings: Callable[..., Settings],
    capture: Capture,
    path: str,
) -> None:
    async with broker(sim, redis_url, make_settings, capture, path) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.w.daemon.drain_all()
        cid = await b.say("/broker stop a1 runaway", 3)  # any issue of the repository
        beat = b.beat(task, "a1")
        assert beat.status_code == 409 and "agent stopped by github:alice: runaway" in beat.text
        assert b.http.post("/request-task", json={"agent_id": "a1"}).status_code == 409
        await b.w.daemon.drain_all()
        assert agent_labels(b, n) == set()
        assert b.reactions(cid) == [(BROKER_LOGIN, "+1")]
        # Once, for the deployment; its outcome names the lease it revoked.
        stops = [e for e in await b.audit() if e.action == "stop_agent"]
        assert [(e.actor, e.issue) for e in stops] == [("github:alice", None)]
        assert f"lease on #{n} revoked" in stops[0].outcome


# --- answers --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_command_with_nothing_to_act_on_is_answered_with_what_happened(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with broker(sim, redis_url, make_settings, capture, "webhook") as b:
        cid = await b.say("/broker release", 2)
        assert b.reactions(cid) == [(BROKER_LOGIN, "confused")]
        assert b.replies(2) == ["@alice\n- `/broker release`: no live lease on #2"]


@pytest.mark.anyio
async def test_an_unknown_verb_runs_nothing_and_is_answered_with_the_usage(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with broker(sim, redis_url, make_settings, capture, "webhook") as b:
        task = b.claim("a1")
        n = task["issue_id"]
        cid = await b.say("/broker pause a1\n/broker frobnicate now", n)
        assert b.reactions(cid) == [(BROKER_LOGIN, "confused")]
        (reply,) = b.replies(n)
        assert "unknown verb `frobnicate`" in reply and "`/broker release`" in reply
        assert await b.audit() == []  # the valid line did not run either
        assert b.beat(task, "a1").json().get("agent_paused") is None


# --- who may steer, and what it costs -------------------------------------------------------


@pytest.mark.anyio
async def test_comments_without_write_access_change_nothing_and_cost_one_lookup_per_person(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with broker(
        sim,
        redis_url,
        make_settings,
        capture,
        "webhook",
        poll={"interval_with_webhooks_s": 0.01},
    ) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.w.daemon.drain_all()
        labels = b.w.labels(n)
        writes = b.calls("POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions")
        ids = []
        for user in ("rita", "tina", "rita", "tina", "rita", "stranger"):
            ids.append(await b.say(f"/broker release\n/broker stop a1 ({user})", n, user=user))
        await asyncio.sleep(0.05)
        await b.w.tick()  # the poll reads the same comments again
        assert b.calls(PERMISSION) == 3  # rita, tina, stranger: once each within the cache
        cached = b.w.store.client.ttl(b.w.rstore.keys.permission("rita"))
        assert 590 <= await cached <= 600  # commands.permission_cache_s
        assert b.beat(task, "a1").status_code == 200
        assert b.w.labels(n) == labels
        assert await b.audit() == []
        assert all(b.reactions(i) == [] for i in ids)
        assert b.replies(n) == []
        assert b.calls("POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions") == (
            writes
        )


@pytest.mark.anyio
async def test_a_flood_from_many_accounts_spends_no_more_lookups_than_the_budget(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    overrides: dict[str, Any] = {"commands": {"lookups_per_hour": 4}}  # one at once
    async with broker(sim, redis_url, make_settings, capture, "poll", **overrides) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        for i in range(5):
            sim.state.add_issue_comment("acme", "widgets", n, user=f"s{i}", body="/broker release")
        sim.state.add_issue_comment("acme", "widgets", n, user="alice", body="/broker note hi")
        await b.w.tick()
        await b.w.tick()
        assert b.calls(PERMISSION) == 1
        assert b.beat(task, "a1").json()["notes"] == []  # alice waits her turn
        # The budget refills: the comments left waiting are read again, none lost, none twice.
        b.w.daemon.webhooks.commands.access.lookups = TokenBucket(1000, 10)
        b.w.daemon._not_before.clear()
        await b.w.tick()
        assert b.calls(PERMISSION) == 6
        assert [x["text"] for x in b.beat(task, "a1").json()["notes"]] == ["hi"]
        assert [e.action for e in await b.audit()] == ["note"]


@pytest.mark.anyio
async def test_a_bots_command_costs_no_github_call(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with broker(sim, redis_url, make_settings, capture, "webhook") as b:
        task = b.claim("a1")
        n = task["issue_id"]
        await b.w.daemon.drain_all()
        await deliver(b.w, capture)  # the label writes' own deliveries, before measuring
        calls = b.w.sim.stats.snapshot()["total"]
        await b.say("/broker release", n, user="renovate[bot]")
        assert b.w.sim.stats.snapshot()["total"] == calls
        assert b.beat(task, "a1").status_code == 200


@pytest.mark.anyio
async def test_the_same_comment_seen_by_webhook_and_by_the_poll_acts_once(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    async with broker(
        sim,
        redis_url,
        make_settings,
        capture,
        "webhook",
        poll={"interval_with_webhooks_s": 0.01},
    ) as b:
        task = b.claim("a1")
        n = task["issue_id"]
        cid = await b.say("/broker note first", n)
        await asyncio.sleep(0.05)
        read = b.calls("GET /repos/{owner}/{repo}/issues/comments")
        await b.w.tick()
        assert b.calls("GET /repos/{owner}/{repo}/issues/comments") > read  # it was read
        notes = b.beat(task, "a1").json()["notes"]
        assert [x["text"] for x in notes] == ["first"]
        assert [e.action for e in await b.audit()] == ["note"]
        assert b.reactions(cid) == [(BROKER_LOGIN, "+1")]


@pytest.mark.anyio
async def test_the_poll_asks_for_new_comments_conditionally_and_replays_no_history(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings], capture: Capture
) -> None:
    a_minute_ago = datetime.now(UTC) - timedelta(seconds=60)
    sim.state.clock = lambda: a_minute_ago
    old = sim.state.add_issue_comment("acme", "widgets", 2, user="alice", body="/broker hold")
    sim.state.clock = lambda: datetime.now(UTC)
    async with broker(sim, redis_url, make_settings, capture, "poll") as b:
        statuses: list[int] = []
        real = b.w.gateway.comments_page

        def recorded(*args: Any, **kwargs: Any) -> Any:
            page = real(*args, **kwargs)
            statuses.append(page.status)
            return page

        b.w.gateway.comments_page = recorded  # type: ignore[method-assign]
        await b.w.tick()
        await b.w.tick()
        assert statuses[-1] == 304  # nothing new: GitHub's free answer
        assert b.reactions(int(old["id"])) == []  # posted before the broker first looked
        assert await b.w.rstore.waiting() == {}
        cid = await b.say("/broker hold", 2)
        assert statuses[-1] == 200 and b.reactions(cid) == [(BROKER_LOGIN, "+1")]
        await b.w.tick()
        assert statuses[-1] == 200  # the broker's reaction changed the listing once
        await b.w.tick()
        assert statuses[-1] == 304


@pytest.mark.anyio
async def test_a_command_on_a_pull_request_is_not_review_feedback_for_a_fix_round(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated(ONE_ISSUE) as sim:
        async with running_world(sim, redis_url, make_settings, review=REVIEW) as w:
            pr = await developed(w, sim)
            review = await w.ask("rev-1")
            assert review is not None
            await w.tasks.finish(REPO, 1, "rev-1", review.lease.token, Outcome.COMPLETED)
            await w.tick()
            sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="/broker help")
            await w.tick()
            await w.tick()
            assert await w.ask("fix-1") is None
            sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="Rename it.")
            await w.tick()
            fix = await w.ask("fix-1")
            assert fix is not None and [c.body for c in fix.review_comments] == ["Rename it."]


# --- the command language -------------------------------------------------------------------


def test_commands_are_lines_of_their_own_outside_code_blocks_and_quotes(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    text = (
        "Thanks! Try `/broker release` later.\n"
        "> /broker stop a9\n"
        "```\n/broker stop a8\n```\n"
        "/brokerage is not one\n"
        "   /broker pause a1 too busy\n"
        "/broker NOTE keep going\n"
    )
    parsed = grammar.parse(text, settings)
    assert parsed.errors == []
    assert [(c.verb, c.agent, c.text) for c in parsed.commands] == [
        ("pause", "a1", "too busy"),
        ("note", "", "keep going"),
    ]
    assert not grammar.has_command("see /broker release in the docs")


def test_bad_commands_are_refused_with_a_reason_before_anything_runs(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    cases = {
        "/broker": "no verb",
        "/broker pause": "needs an agent id",
        "/broker pause P1": "is the label",
        "/broker stop in-progress": "is the label",
        "/broker pause has@sign": "is not an agent id",
        "/broker note": "needs a text",
        "/broker explode": "unknown verb",
        "/broker note " + "x" * 1001: "more than 1000 characters",
    }
    for text, reason in cases.items():
        parsed = grammar.parse(text, settings)
        assert parsed.commands == [] and reason in parsed.errors[0], (text, parsed)
    six = "\n".join(["/broker retry"] * 6)
    assert grammar.parse(six, settings).errors == ["more than 5 commands in one comment"]
    long = "/broker retry\n" + "x" * grammar.MAX_BODY_CHARS
    assert "longer than" in grammar.parse(long, settings).errors[0]
