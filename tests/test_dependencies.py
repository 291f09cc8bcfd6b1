"""GitHub's dependencies decide what is claimable: blocked issues are never handed out (a
blocker here, in a second served repository, in an unserved one), the claim re-checks, a
link after the hand-out reaches the holder, not planned and unreadable blockers wait for a
person, cycles are reported, the order prefers what unblocks most (docs/dependencies.md)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from github_broker.metrics import Metrics
from github_broker.models import Issue, Outcome
from github_broker.reports.explain import explain
from github_broker.reports.status import repo_status
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store.graph import GraphUpdate
from tests.factories import body
from tests.world import TWO_REPOS, World, running_world, simulated

pytestmark = pytest.mark.anyio
W = ("acme", "widgets")


def work(number: int, minute: int, **extra: Any) -> dict[str, Any]:
    """An assignable P1 issue created `minute` minutes into 2026."""
    return {
        "number": number,
        "title": f"Task {number}",
        "body": body(),
        "labels": ["P1", "BACKENDCODER"],
        "created_at": f"2026-01-01T00:{minute:02d}:00Z",
        **extra,
    }


async def ready_ids(w: World) -> set[str]:
    return {task_id for task_id, _ in await w.rstore.ready_tasks()}


async def flush(url: str) -> None:
    """Empty Redis between two worlds of one test (the second starts afresh)."""
    client = redis.asyncio.Redis.from_url(url)
    await client.flushall()
    await client.aclose()


async def handed_out(w: World, agents: int = 5) -> list[int]:
    """What `agents` fresh agents get, one after the other (each keeps its task)."""
    got = []
    for i in range(agents):
        task = await w.ask(f"agent-{i}")
        if task is not None:
            got.append(task.issue_id)
    return got


async def test_a_blocked_issue_is_never_handed_out_until_its_blocker_closes_as_completed(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    # #2 is the oldest, yet blocked by #1: only #1 and #3 are handed out.
    with simulated([work(1, 5), work(2, 1, blocked_by=[1]), work(3, 9)]) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            assert sorted(await handed_out(w)) == [1, 3]
            assert (await w.rstore.blocked())[2].ref == "acme/widgets#1"
            sim.state.update_issue(*W, 1, state="closed")  # completed
            await w.tick()
            assert await handed_out(w, 1) == [2]
            assert await w.rstore.blocked() == {}


async def test_a_blocker_in_a_second_served_repository_blocks_until_it_closes(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets",
             "issues": [work(1, 1, blocked_by=["acme/gadgets#7"])]},
            {"owner": "acme", "name": "gadgets", "issues": [
                {"number": 7, "title": "Gadget API", "body": "no labels: not work"}]},
        ]
    }
    with Simulator(seed) as sim:
        async with running_world(sim, redis_url, make_settings, repositories=TWO_REPOS) as w:
            await w.tick()
            assert await handed_out(w) == []
            verdicts = (await explain(w.store, w.settings))["acme/widgets"]
            assert [(v.issue, v.verdict) for v in verdicts] == [(1, "blocked")]
            assert "blocked by acme/gadgets#7 (open)" in verdicts[0].detail
            sim.state.update_issue("acme", "gadgets", 7, state="closed")
            await w.tick()
            assert await handed_out(w) == [1]


async def test_a_blocker_in_an_unserved_repository_blocks_with_the_reason_named(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": [
                work(1, 1, blocked_by=["acme/outside#3"]),
                work(2, 2, blocked_by=["acme/outside#4"]),
            ]},
            {"owner": "acme", "name": "outside", "issues": [
                {"number": 3, "title": "Open elsewhere"},
                {"number": 4, "title": "Closed elsewhere", "state": "closed"},
            ]},
        ]
    }
    with Simulator(seed) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            # Fail closed: acme/outside is not served, so even its closed issue blocks.
            assert await handed_out(w) == []
            status = await repo_status(w.rstore, w.settings)
            assert [(b.issue, b.state) for b in status.blocked] == [
                (1, "unserved"), (2, "unserved")
            ]
            assert "acme/outside#3 is in a repository this broker does not serve" in (
                status.blocked[0].detail
            )
        # `last_read`: the state GitHub reported when the links were read decides.
        await flush(redis_url)
        async with running_world(
            sim, redis_url, make_settings, dependencies={"unserved": "last_read"}
        ) as w:
            await w.tick()
            assert await handed_out(w) == [2]


async def test_a_blocker_reopened_after_the_dependents_last_sync_blocks_the_claim(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated([work(1, 5, state="closed"), work(2, 1, blocked_by=[1])]) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            assert "development:2" in await ready_ids(w)
            # The blocker reopens and only its own update reaches the mirror (a delivery for
            # #1, or the sync of #1); the dependent's index still says claimable.
            sim.state.update_issue(*W, 1, state="open")
            reopened = sim.state.get_issue(*W, 1)
            await w.daemon.syncer.mirror(w.rstore, [issue_of(reopened)])
            assert "development:2" in await ready_ids(w)
            got = await handed_out(w, 3)
            assert 2 not in got and got == [1]
            # The claim took the stale entry out of the pool on its way.
            assert "development:2" not in await ready_ids(w)


async def test_a_cross_repository_blocker_state_mirrored_into_the_dependent_blocks_the_claim(
    lua_redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The claim reads graph:state for a blocker of another repository (Redis 7, fakeredis,
    Cluster alike): a reopen mirrored there blocks though the ready index still lists it."""
    with simulated([work(2, 1)]) as sim:
        async with running_world(sim, lua_redis_url, make_settings) as w:
            dependent = issue_of(sim.state.get_issue(*W, 2))
            await w.rstore.save_sync_state({}, rebuilt=True)
            ref = "acme/gadgets#7"
            await w.rstore.save_graph(GraphUpdate(links={2: [ref]}, states={ref: "completed"}))
            await w.daemon.syncer.mirror(w.rstore, [dependent], read_links=False)
            assert "development:2" in await ready_ids(w)
            await w.rstore.save_graph(GraphUpdate(states={ref: "open"}))
            assert "development:2" in await ready_ids(w)
            assert await w.ask("agent-1") is None
            assert "development:2" not in await ready_ids(w)
            await w.rstore.save_graph(GraphUpdate(states={ref: "completed"}))
            await w.daemon.syncer.mirror(w.rstore, [dependent], read_links=False)
            task = await w.ask("agent-1")
            assert task is not None and task.issue_id == 2


@pytest.mark.parametrize("mode", ["note", "pause", "revoke"])
async def test_a_link_added_after_the_hand_out_reaches_the_holder_at_its_next_heartbeat(
    redis_url: str, make_settings: Callable[..., Settings], mode: str
) -> None:
    with simulated([work(1, 5), work(2, 1)]) as sim:
        async with running_world(
            sim, redis_url, make_settings, dependencies={"after_handout": mode}
        ) as w:
            await w.tick()
            first = await w.ask("agent-a")
            holder = await w.ask("agent-b")
            assert first is not None and first.issue_id == 2
            assert holder is not None and holder.issue_id == 1
            sim.state.block(*W, 2, by=(*W, 1))
            # Links leave updated_at alone: the full pass reads them (webhooks at once).
            await w.full_sync()
            assert (await w.rstore.blocked())[2].ref == "acme/widgets#1"
            token = first.lease.token
            if mode == "revoke":
                with pytest.raises(Exception, match="blocked by acme/widgets#1"):
                    await w.tasks.heartbeat("acme/widgets", 2, "agent-a", token)
                return
            beat = await w.tasks.heartbeat("acme/widgets", 2, "agent-a", token)
            if mode == "note":
                assert any("blocked by acme/widgets#1 (open)" in n.text for n in beat.notes)
                assert beat.state == "in_progress"
            else:
                assert beat.state == "waiting_for_user" and beat.paused is not None
                assert "blocked by acme/widgets#1" in beat.paused.detail
                sim.state.update_issue(*W, 1, state="closed")
                await w.tick()
                beat = await w.tasks.heartbeat("acme/widgets", 2, "agent-a", token)
                assert beat.state == "in_progress" and beat.paused is None


async def test_a_blocker_closed_as_not_planned_leaves_the_dependent_waiting_for_a_person(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated([work(1, 5), work(2, 1, blocked_by=[1])]) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            sim.state.update_issue(*W, 1, state="closed", state_reason="not_planned")
            await w.tick()
            assert await handed_out(w) == []
            verdicts = (await explain(w.store, w.settings))["acme/widgets"]
            assert [v.verdict for v in verdicts] == ["blocked"]
            assert "closed as not planned: a person must remove the link or reopen it" in (
                verdicts[0].detail
            )
        await flush(redis_url)
        async with running_world(
            sim, redis_url, make_settings, dependencies={"not_planned": "unblock"}
        ) as w:
            await w.tick()
            assert await handed_out(w) == [2]


async def test_a_dependency_cycle_is_reported_and_never_followed_round(
    redis_url: str, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    issues = [work(1, 1, blocked_by=[3]), work(2, 2, blocked_by=[1]), work(3, 3, blocked_by=[2]),
              work(4, 4)]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            with caplog.at_level(logging.WARNING, "github_broker.leader.graph"):
                await w.tick()
            assert await handed_out(w) == [4]
            cycle = ["acme/widgets#1", "acme/widgets#3", "acme/widgets#2"]
            assert await w.rstore.cycles() == {1: cycle, 2: cycle, 3: cycle}
            assert "dependency cycle" in caplog.text
            status = await repo_status(w.rstore, w.settings)
            assert {b.issue: b.cycle for b in status.blocked} == {1: cycle, 2: cycle, 3: cycle}
            assert "on a dependency cycle (acme/widgets#1 -> acme/widgets#3 -> " in (
                status.blocked[0].detail
            )
            # Breaking one link ends the cycle; #1 (blocked by #3 only) is still blocked.
            sim.state.unblock(*W, 2, by=(*W, 1))
            await w.full_sync()
            assert await w.rstore.cycles() == {}
            assert await handed_out(w, 2) == [2]


async def test_within_a_priority_the_issue_that_unblocks_most_goes_first_and_sub_issues_follow_their_parents_order(  # noqa: E501
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues = [
        work(1, 1),  # oldest, unblocks nothing
        work(2, 2),  # unblocks #5 and #6
        work(3, 3),  # unblocks #5
        work(5, 5, blocked_by=[2, 3]),
        work(6, 6, blocked_by=[2]),
        # A parent whose sub-issues are #12, #10, #11 in that order (its own order wins over
        # their creation).
        {"number": 9, "title": "Parent", "body": "the whole", "labels": ["P1", "BACKENDCODER"],
         "created_at": "2026-01-01T00:30:00Z", "sub_issues": [12, 10, 11]},
        work(10, 40), work(11, 41), work(12, 42),
    ]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            order = await handed_out(w, 8)
            assert order == [2, 3, 1, 12, 10, 11]
            verdicts = (await explain(w.store, w.settings))["acme/widgets"]
            parent = next(v for v in verdicts if v.issue == 9)
            assert parent.verdict == "skipped" and "waits for 3 of its 3 sub-issues" in (
                parent.detail
            )


async def test_a_parent_whose_sub_issues_are_closed_goes_to_a_person_unless_it_asks_for_work(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues = [
        {"number": 1, "title": "Parent", "body": "the whole", "labels": ["P1", "BACKENDCODER"],
         "sub_issues": [2]},
        {"number": 3, "title": "Parent with its own work", "body": body(),
         "labels": ["P1", "BACKENDCODER"], "sub_issues": [4]},
        {"number": 2, "title": "Part", "state": "closed"},
        {"number": 4, "title": "Part", "state": "closed"},
    ]
    with simulated(issues) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            assert await handed_out(w) == [3]
            skipped = await w.rstore.skipped()
            assert skipped[1].code == "sub_issues_done"


async def test_the_priority_field_and_issue_type_mappings_hand_out_what_the_labels_would_have(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    labels = {1: ["P2", "BACKENDCODER"], 2: ["P0", "FRONTENDCODER"], 3: ["P1", "BACKENDCODER"],
              4: ["P0", "BACKENDCODER"]}
    planned = {1: ("Medium", "Bug"), 2: ("Urgent", "Feature"), 3: ("High", "Bug"),
               4: ("Urgent", "Bug")}
    by_labels = [work(n, n, labels=labels[n]) for n in labels]
    by_fields = [
        work(n, n, labels=[], type=planned[n][1], fields={"Priority": planned[n][0]})
        for n in planned
    ]
    mapping = {"priority_field": "Priority", "type_roles": {
        "Bug": "BACKENDCODER", "Feature": "FRONTENDCODER"}}
    orders = []
    for issues in (by_labels, by_fields):
        await flush(redis_url)
        with simulated(issues) as sim:
            async with running_world(
                sim, redis_url, make_settings, planning=mapping, priority_mode="best_effort"
            ) as w:
                await w.tick()
                first = (await explain(w.store, w.settings))["acme/widgets"][0]
                got = []
                for i in range(5):
                    task = await w.ask(f"agent-{i}")
                    if task is not None:
                        got.append((task.issue_id, task.required_role))
                orders.append(got)
    assert orders[0] == orders[1] == [(2, "FRONTENDCODER"), (4, "BACKENDCODER"),
                                      (3, "BACKENDCODER"), (1, "BACKENDCODER")]
    # explain says which rule decided (the last world's: fields and types alone).
    assert first.issue == 2 and first.verdict == "next"
    assert "P0 from the Priority field (Urgent)" in first.detail
    assert "role FRONTENDCODER from its issue type Feature" in first.detail


async def test_labels_win_over_the_priority_field_unless_github_is_preferred(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    issues = [work(1, 1, labels=["P3", "BACKENDCODER"], fields={"Priority": "Urgent"}),
              work(2, 2, labels=["P1", "BACKENDCODER"])]
    for prefer, first in (("labels", 2), ("github", 1)):
        with simulated(issues) as sim:
            await flush(redis_url)
            async with running_world(
                sim, redis_url, make_settings, priority_mode="best_effort",
                planning={"priority_field": "Priority", "prefer": prefer},
            ) as w:
                await w.tick()
                verdicts = (await explain(w.store, w.settings))["acme/widgets"]
                top = verdicts[0]
                assert top.issue == first and top.verdict == "next"
                if prefer == "github":
                    assert "P0 from the Priority field (Urgent); its label says P3" in top.detail


def issue_of(data: dict[str, Any]) -> Issue:
    return Issue.from_github(data)


async def test_a_blocked_task_back_in_the_pool_is_skipped_by_the_claim(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """An abandoned task goes back to the pool (end_lease knows nothing of blockers): the
    claim itself skips it while it is blocked, and takes it out of the pool."""
    with simulated([work(1, 5), work(2, 1)]) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            task = await w.ask("agent-a")
            assert task is not None and task.issue_id == 2
            sim.state.block(*W, 2, by=(*W, 1))
            await w.full_sync()
            again = await w.tasks.request_task("agent-a", previous=Outcome.ABANDONED)
            assert again is not None and again.issue_id == 1
            assert "development:2" in await ready_ids(w)
            assert await handed_out(w, 3) == []
            assert "development:2" not in await ready_ids(w)


async def test_a_priority_field_set_on_github_reaches_the_mirror_by_its_delivery(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """`issues.field_added` (and `typed`) are `issues` deliveries: the issue is mirrored with
    its field values and type, and becomes work by the mapping, with no poll pass."""
    issue = work(1, 1, labels=[])
    with simulated([issue]) as sim:
        async with running_world(
            sim, redis_url, make_settings,
            planning={"priority_field": "Priority", "type_roles": {"Bug": "BACKENDCODER"}},
        ) as w:
            await w.tick()
            assert await w.ask("agent-1") is None
            sim.state.set_issue_type(*W, 1, "Bug")
            sim.state.set_field(*W, 1, "Priority", "High")
            payload = {"action": "field_added", "issue": sim.state.get_issue(*W, 1)}
            head = json.dumps({"event": "issues", "delivery": "d-1"})
            repo = w.settings.repositories[0]
            await w.daemon.webhooks.apply(repo, w.rstore, head + "\n" + json.dumps(payload))
            task = await w.ask("agent-1")
            assert task is not None and task.issue_id == 1
            assert task.required_role == "BACKENDCODER"
            verdicts = (await explain(w.store, w.settings, agent_id="agent-2"))["acme/widgets"]
            assert verdicts[0].verdict == "held" and verdicts[0].issue == 1


async def test_status_and_metrics_count_blocked_issues_per_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    with simulated([work(1, 1), work(2, 2, blocked_by=[1]), work(3, 3, blocked_by=[1])]) as sim:
        async with running_world(sim, redis_url, make_settings) as w:
            await w.tick()
            status = await repo_status(w.rstore, w.settings)
            assert [b.issue for b in status.blocked] == [2, 3]
            assert status.blocked[0].detail == "blocked by acme/widgets#1 (open)"
            text = await Metrics().render(w.store)
            assert 'gb_blocked_issues{repository="acme/widgets"} 2.0' in text
