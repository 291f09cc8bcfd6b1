"""Redis loses everything while GitHub's labels lag behind it: one agent is labelled
in-progress on two issues (the label removal of a task it gave up was still queued, the labels
of its next claim went out), and the rebuild must still give it one lease, never two.

`sync_upsert.lua` adopts one of them (the issue GitHub changed last) and keeps the other out
of the pool, waiting in the lease's `contested` list; the agent's next lease call says which
one it works on (`_lib.lua`: take_contested, release_contested) and the other waits until the
leader reads GitHub: no PR for it, and it returns to the pool (a PR: completed). If the agent
never calls, both wait so once the adopted lease expires.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from github_broker.keys import RepoKeys
from github_broker.models import Outcome, Task
from github_broker.settings import Settings
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, post, start_all, wait_for
from tests.waiting import await_until
from tests.world import World, running_world, simulated

REPO = "acme/widgets"
HELD = {"in-progress", "a1"}


class Clock:
    """The simulator's clock, moved forward by hand: GitHub's `updated_at` has whole seconds,
    so the tests say which issue GitHub changed last."""

    def __init__(self) -> None:
        self.shift = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.shift

    def advance(self, seconds: float) -> None:
        self.shift += timedelta(seconds=seconds)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(generate_issues(3, priorities=("P1",))) as s:
        yield s


@pytest.fixture
def clock(sim: Simulator) -> Clock:
    c = Clock()
    sim.state.clock = c
    return c


@pytest.fixture
def lease_ttl_s() -> int:
    return 600


@pytest.fixture
async def world(
    sim: Simulator,
    clock: Clock,
    redis_url: str,
    make_settings: Callable[..., Settings],
    lease_ttl_s: int,
) -> AsyncIterator[World]:
    async with running_world(
        sim, redis_url, make_settings, leases={"lease_ttl_s": lease_ttl_s}
    ) as w:
        yield w


async def lose_redis_while_a_removal_lags(
    world: World, sim: Simulator, clock: Clock, newest: str
) -> tuple[Task, Task]:
    """a1 held #1 (its labels on GitHub), gave it up and took #2. GitHub refused #1's label
    removal so far; #2's labels went out. Then Redis loses everything and the rebuild runs.
    `newest`: which of the two GitHub changed last ('current': #2, 'stale': #1)."""
    await world.tick()
    stale = await world.ask("a1")
    assert stale is not None and stale.issue_id == 1
    await world.tick()
    assert world.labels(1) >= HELD
    sim.faults.add_error(422, method="POST", path=r"/graphql$")  # the removal's mutation
    clock.advance(5)
    current = await world.tasks.request_task("a1", previous=Outcome.ABANDONED)
    assert current is not None and current.issue_id == 2
    await world.daemon.drain_all()
    assert world.labels(1) >= HELD and world.labels(2) >= HELD
    if newest == "stale":
        clock.advance(5)
        sim.state.add_issue_comment("acme", "widgets", 1, user="maintainer", body="any news?")
    await world.store.client.flushall()  # the queued removal is lost with it
    sim.faults.clear()
    await world.tick()  # the rebuild: a full pass
    return stale, current


@pytest.mark.anyio
@pytest.mark.parametrize("newest", ["current", "stale"])
async def test_rebuild_adopts_one_lease_per_agent_and_its_heartbeat_keeps_its_task(
    world: World, sim: Simulator, clock: Clock, newest: str
) -> None:
    """Whichever of its two labelled issues the rebuild guessed, a1 holds one lease; its
    heartbeat on the issue it works on is answered and keeps that one; the other returns to
    the pool and nobody else got either meanwhile."""
    stale, current = await lose_redis_while_a_removal_lags(world, sim, clock, newest)
    guessed = current.issue_id if newest == "current" else stale.issue_id
    waiting = stale.issue_id if newest == "current" else current.issue_id
    assert await world.live_leases("a1") == [guessed]
    assert (await world.rstore.skipped())[waiting].code == "contested"
    other = await world.ask("a2")
    assert other is not None and other.issue_id == 3  # neither of a1's issues

    await world.tasks.heartbeat(REPO, current.issue_id, "a1", current.lease.token)
    assert await world.live_leases("a1") == [current.issue_id]
    # a1 moved on from the stale issue: the leader finds no PR for it, so it returns.
    await world.daemon.progress_all()
    await world.tick()  # the stale labels are removed on GitHub
    assert not world.labels(stale.issue_id) & HELD
    assert world.labels(current.issue_id) >= HELD
    again = await world.ask("a3")
    assert again is not None and again.issue_id == stale.issue_id
    await world.tasks.finish(REPO, current.issue_id, "a1", current.lease.token, Outcome.COMPLETED)


@pytest.mark.anyio
async def test_a_request_before_any_heartbeat_settles_the_adopted_lease_only(
    world: World, sim: Simulator, clock: Clock
) -> None:
    """An agent that only ever calls request-task: its request settles the adopted lease (the
    issue GitHub changed last) and the waiting issue returns to the pool; it then holds only
    its new task."""
    stale, current = await lose_redis_while_a_removal_lags(world, sim, clock, "current")
    nxt = await world.ask("a1")
    assert nxt is not None
    assert await world.live_leases("a1") == [nxt.issue_id]
    await world.daemon.progress_all()  # no PR for the issue a1 moved on from: it returns
    await world.tick()
    assert "needs-review" in world.labels(current.issue_id)
    if nxt.issue_id != stale.issue_id:
        assert not world.labels(stale.issue_id) & HELD


@pytest.mark.anyio
async def test_a_waiting_issue_someone_else_claimed_since_keeps_its_new_lease(
    world: World, sim: Simulator, clock: Clock
) -> None:
    """A maintainer removes the stale labels of the waiting issue by hand; the sync puts it
    back in the pool and a2 claims it. a1's heartbeat on its adopted issue then releases what
    still waits on it, and a2's lease is not among it."""
    stale, current = await lose_redis_while_a_removal_lags(world, sim, clock, "current")
    for label in HELD:
        sim.state.remove_label("acme", "widgets", stale.issue_id, label)
    await world.tick()
    taken = await world.ask("a2")
    assert taken is not None and taken.issue_id == stale.issue_id
    await world.tasks.heartbeat(REPO, current.issue_id, "a1", current.lease.token)
    assert await world.live_leases("a2") == [stale.issue_id]
    await world.tasks.heartbeat(REPO, stale.issue_id, "a2", taken.lease.token)
    await world.tick()
    assert world.labels(stale.issue_id) >= {"in-progress", "a2"}


@pytest.mark.anyio
@pytest.mark.parametrize("lease_ttl_s", [1])
async def test_a_vanished_agents_adopted_and_waiting_issues_return_after_the_lease_ttl(
    world: World, sim: Simulator, clock: Clock
) -> None:
    stale, current = await lose_redis_while_a_removal_lags(world, sim, clock, "current")
    keys = world.rstore.keys

    async def live() -> list[int]:
        held = {int(n) for n in await world.store.client.zrange(keys.leases, 0, -1)}
        return sorted(held & {stale.issue_id, current.issue_id})

    assert await live() == [current.issue_id]  # adopted; the stale one waits, unleased

    async def reaped() -> bool:  # nobody heartbeats: lease TTL 1 s
        await world.daemon.reap_all()
        return not await live()

    await await_until(reaped, 5, "both adopted leases reaped", every_s=0.1)
    await world.daemon.progress_all()  # GitHub shows no PR for either: both return
    await world.tick()
    assert not world.labels(stale.issue_id) & HELD
    assert not world.labels(current.issue_id) & HELD
    await world.tick()
    got = {t.issue_id for t in [await world.ask("b1"), await world.ask("b2")] if t}
    assert got == {stale.issue_id, current.issue_id}


# --- real processes ---------------------------------------------------------------------------

KEYS = RepoKeys("gb", "acme", "widgets")


def leases_by_agent(client: redis.Redis) -> dict[str, list[int]]:
    """Every live lease in Redis, by holder (read in one transaction, so one instant)."""
    numbers = [int(n) for n in client.zrange(KEYS.leases, 0, -1)]
    pipe = client.pipeline(transaction=True)
    for n in numbers:
        pipe.hget(KEYS.lease(n), "agent")
        pipe.exists(KEYS.issue_lock(n))
    answers = pipe.execute()
    held: dict[str, list[int]] = {}
    for i, n in enumerate(numbers):
        agent, locked = answers[2 * i], answers[2 * i + 1]
        if agent is not None and locked:
            held.setdefault(agent.decode(), []).append(n)
    return held


@pytest.mark.slow
def test_flushall_while_label_removals_lag_never_gives_an_agent_two_leases(
    redis_url: str, tmp_path: Path
) -> None:
    """Two serve processes; four agents each complete their first task and take another while
    GitHub refuses the completions' label removals (the claims' labels go out). FLUSHALL: the
    rebuild finds every agent labelled in-progress on two issues. No agent ever holds two
    leases, no agent is told its lease ended, no issue an agent works on goes to another, and
    the completed issues lose their stale in-progress and agent labels."""
    agents = [f"agent-{i}" for i in range(4)]
    with simulated(generate_issues(12, priorities=("P1",))) as sim:
        # No settle grace: the agents say "done" right after their claims.
        env = broker_env(redis_url, sim.base_url, REPO, GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0")
        brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])
        client = redis.Redis.from_url(redis_url)
        labels = lambda n: set(sim.state.issue_labels("acme", "widgets", n))  # noqa: E731
        try:
            wait_for(lambda: client.zcard(KEYS.ready) == 12, 20, "the first sync")
            first = {}
            for i, agent in enumerate(agents):
                first[agent] = post(brokers[i % 2].url, "/request-task", {"agent_id": agent}).json()
            wait_for(
                lambda: all({"in-progress", a} <= labels(t["issue_id"]) for a, t in first.items()),
                15,
                "the first claims' labels",
            )
            sim.faults.add_error(422, method="POST", path=r"/graphql$")  # removals refused
            second = {}
            for i, agent in enumerate(agents):
                # Done with the first: the completion's label change is one GraphQL mutation
                # (refused for now); the next claim's labels are a REST call (they go out).
                r = post(brokers[i % 2].url, "/request-task", {"agent_id": agent})
                assert r.status_code == 200, r.text
                second[agent] = r.json()
                assert second[agent]["issue_id"] != first[agent]["issue_id"]
            wait_for(
                lambda: all({"in-progress", a} <= labels(t["issue_id"]) for a, t in second.items()),
                15,
                "the second claims' labels",
            )
            assert all({"in-progress", a} <= labels(t["issue_id"]) for a, t in first.items())

            client.flushall()
            sim.faults.clear()
            flushed_at = time.monotonic()
            answers: dict[int, int] = {}
            worked_on = {t["issue_id"] for t in second.values()}
            while time.monotonic() - flushed_at < 6:
                for agent, held in leases_by_agent(client).items():
                    assert len(held) <= 1, f"{agent} holds {held}"
                for i, (agent, task) in enumerate(second.items()):
                    n = task["issue_id"]
                    r = post(
                        brokers[i % 2].url,
                        f"/tasks/acme/widgets/{n}/heartbeat",
                        {"agent_id": agent, "token": task["lease"]["token"]},
                    )
                    answers[r.status_code] = answers.get(r.status_code, 0) + 1
                    assert r.status_code in (200, 503), f"{agent} was told {r.text}"
                time.sleep(0.1)
            assert answers.get(200, 0) > 0, answers
            assert leases_by_agent(client) == {a: [t["issue_id"]] for a, t in second.items()}
            done = {t["issue_id"] for t in first.values()}
            wait_for(
                lambda: not any(labels(n) & {"in-progress", *agents} for n in done),
                15,
                "the completed issues' stale labels removed",
            )
            got = set()
            for j in range(len(agents)):
                r = post(brokers[0].url, "/request-task", {"agent_id": f"new-{j}"})
                assert r.status_code == 200, r.text
                got.add(r.json()["issue_id"])
            # A completed issue can come back: its completion's labels were lost with Redis, and
            # GitHub shows it as plain work again. An issue an agent works on never does.
            assert not got & worked_on, "an issue an agent works on went to another"
            print(f"\nFLUSHALL with lagging removals: heartbeat answers {answers}")
        finally:
            client.close()
            for b in brokers:
                b.stop()
