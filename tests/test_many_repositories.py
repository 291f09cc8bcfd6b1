"""One broker for many repositories: a request touches the repositories that can give it
something, whatever the number configured; what is mirrored is served during a first sync."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis as sync_redis

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.rules import Rules
from github_broker.claim.service import TaskService
from github_broker.errors import MirrorRebuilding
from github_broker.leader.sync import index_item
from github_broker.models import Actor, Task
from github_broker.settings import Settings
from github_broker.store import Store
from tests.conftest import sync_client
from tests.factories import issue

pytestmark = pytest.mark.anyio


def names(count: int) -> list[str]:
    return [f"acme/repo-{i:04d}" for i in range(count)]


async def mirrored(store: Store, name: str, numbers: list[int]) -> None:
    rstore = store.repo(name)
    rules = Rules(store.settings)
    if numbers:
        await rstore.upsert_issues(
            [index_item(rules, issue(n, "P1", "BACKENDCODER"), "main") for n in numbers]
        )
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would


async def held_in_first_work_in_last(store: Store, settings: Settings) -> tuple[TaskService, Task]:
    """Three repositories: one issue in the first, none in the second, two in the last; agent
    a1 holds the first's issue (the last has work left, the first none)."""
    await mirrored(store, names(3)[0], [1])
    await mirrored(store, names(3)[1], [])
    await mirrored(store, names(3)[2], [7, 8])
    tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
    held = await tasks.request_task("a1")
    assert held is not None and (held.repository, held.issue_id) == (names(3)[0], 1)
    return tasks, held


async def holds_only_the_last(store: Store, tasks: TaskService) -> None:
    """a1's next request claims in the last repository and holds that task alone."""
    following = await tasks.request_task("a1")
    assert following is not None and following.repository == names(3)[2]
    leases = [(r, lease.issue) for r in names(3) for lease in await store.repo(r).leases()]
    assert leases == [(names(3)[2], following.issue_id)]


def commands(url: str) -> dict[str, int]:
    """Commands Redis ran since the last reset, by name (scripts' own calls included)."""
    client = sync_redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    # Calls that failed (a script's first EVALSHA: NOSCRIPT, then loaded) and the loads
    # themselves are each script's first use, not the request's work.
    return {
        k.removeprefix("cmdstat_"): int(v["calls"]) - int(v.get("failed_calls", 0))
        for k, v in stats.items()
        if not k.startswith("cmdstat_script")
    }


async def redis_work_of_requests(
    redis_url: str, make_settings: Callable[..., Settings], count: int
) -> dict[str, int]:
    """Five agents each ask twice (a claim, then a claim settling the first) in a deployment of
    `count` repositories with work in the last one only: what Redis ran for it."""
    settings = make_settings(
        redis={"url": redis_url}, repositories=names(count), leases={"settle_grace_s": 0}
    )
    store = Store.from_settings(settings)
    waker = ReadyWaker(1.0)
    waker.start(store)
    try:
        for name in names(count)[:-1]:
            await mirrored(store, name, [])
        await mirrored(store, names(count)[-1], list(range(1, 21)))
        await waker.index.reload(store)
        tasks = TaskService(settings, store, Prompts.load(None), waker)
        client = sync_redis.Redis.from_url(redis_url)
        client.config_resetstat()
        client.close()
        for round_ in range(2):
            for agent in range(5):
                task = await tasks.request_task(f"a{agent}")
                assert task is not None and task.repository == names(count)[-1], round_
        # The last mutex release is written without waiting for its answer.
        client = sync_redis.Redis.from_url(redis_url)
        for _ in range(100):
            if not client.keys(store.global_keys.agent_busy("*")):
                break
            await asyncio.sleep(0.01)
        client.close()
        return commands(redis_url)
    finally:
        await waker.stop()
        await store.close()


async def test_a_request_costs_the_same_redis_work_with_20_or_200_repositories(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    few = await redis_work_of_requests(redis_url, make_settings, 20)
    sync_redis.Redis.from_url(redis_url).flushall()
    many = await redis_work_of_requests(redis_url, make_settings, 200)
    # Scripts run, plain commands sent and the commands inside the scripts: all the same.
    # Per request a claim script and the agent mutex's release: the agent's held task is in
    # the repository it claims in next, whose claim settles it (no settling script).
    assert few.get("evalsha") == many.get("evalsha")
    assert few["evalsha"] <= 10 * 2
    assert sum(few.values()) == sum(many.values()), sorted(set(few.items()) ^ set(many.items()))


async def test_a_claim_during_the_first_sync_gets_work_from_a_mirrored_repository(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(redis={"url": redis_url}, repositories=names(50))
    store = Store.from_settings(settings)
    waker = ReadyWaker(1.0)
    try:
        tasks = TaskService(settings, store, Prompts.load(None), waker)
        # Nothing mirrored yet: retry, not "no work".
        with pytest.raises(MirrorRebuilding, match="being built"):
            await tasks.request_task("a1")
        # The sync has mirrored 3 of 50 repositories; one of them has work.
        for name in names(50)[:2]:
            await mirrored(store, name, [])
        await mirrored(store, names(50)[2], [1, 2])
        got = await tasks.request_task("a1")
        assert got is not None and got.repository == names(50)[2]
        # A request naming a repository not mirrored yet is told to retry.
        with pytest.raises(MirrorRebuilding, match="being built"):
            await tasks.request_task("a2", repositories=[names(50)[10]])
        # The mirrored work is taken: the rest is still being built, so retry (not 204).
        await tasks.request_task("a3")
        with pytest.raises(MirrorRebuilding):
            await tasks.request_task("a4")
        for name in names(50)[3:]:
            await mirrored(store, name, [])
        assert await tasks.request_task("a4") is None  # everything mirrored, nothing left
    finally:
        await store.close()


async def test_a_task_reassigned_in_a_repository_the_agent_never_claimed_in_reaches_it(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    from github_broker.steering.actions import Steering

    settings = make_settings(
        redis={"url": redis_url}, repositories=names(30), leases={"settle_grace_s": 0}
    )
    store = Store.from_settings(settings)
    try:
        for name in names(30)[:-1]:
            await mirrored(store, name, [])
        await mirrored(store, names(30)[-1], [1])
        tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
        held = await tasks.request_task("a1")
        assert held is not None and held.repository == names(30)[-1]
        await store.note_seen("newcomer")  # a reassignment names an agent the broker knows
        await Steering(settings, store).reassign(names(30)[-1], 1, "newcomer", Actor.admin("alice"))
        moved = await tasks.request_task("newcomer")
        assert moved is not None and moved.issue_id == 1
        assert moved.continues is not None and moved.continues.from_agent == "a1"
    finally:
        await store.close()


@pytest.mark.parametrize("engine", ["redis-server", "redis-cluster"])
async def test_a_request_claiming_elsewhere_first_settles_the_task_the_agent_holds(
    engine: str, request: pytest.FixtureRequest, make_settings: Callable[..., Settings]
) -> None:
    """The agent holds a task in the first repository, which has no work left: its next
    request settles that task there before it claims in the second (never two tasks). On a
    Cluster too: the mutex's batch (its TIME has no key) and each repository's slot differ."""
    url = str(request.getfixturevalue("redis_url" if engine == "redis-server" else "redis_cluster"))
    if engine == "redis-cluster":
        client = sync_client(url)
        client.flushall(target_nodes="all")
        client.close()
    settings = make_settings(
        redis={"url": url}, repositories=names(3), leases={"settle_grace_s": 0}
    )
    store = Store.from_settings(settings)
    try:
        tasks, _ = await held_in_first_work_in_last(store, settings)
        await holds_only_the_last(store, tasks)
    finally:
        await store.close()


async def test_the_index_is_read_again_when_its_subscription_comes_back(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """A line published while the subscription was down is lost; the reload after the
    reconnect finds it, long before the periodic reload (RELOAD_S)."""
    from github_broker.claim.repo_index import RELOAD_S

    settings = make_settings(redis={"url": redis_url}, repositories=names(2))
    store = Store.from_settings(settings)
    waker = ReadyWaker(1.0)
    client = sync_redis.Redis.from_url(redis_url)
    try:
        for name in names(2):
            await mirrored(store, name, [])
        waker.start(store)
        for _ in range(200):
            if len(waker.index.lines) == 2:
                break
            await asyncio.sleep(0.02)
        assert waker.index.with_work(None, None) == {}
        client.client_kill_filter(_type="pubsub")
        # As a script's line whose message nobody heard: work at bucket 3 in the second.
        client.set(store.repo(names(2)[1]).keys.idx, "1|3|1|BACKENDCODER")
        started = asyncio.get_running_loop().time()
        while not waker.index.with_work(None, None):
            assert asyncio.get_running_loop().time() - started < 10 < RELOAD_S
            await asyncio.sleep(0.05)
        assert waker.index.with_work(["BACKENDCODER"], None) == {names(2)[1]: 3}
    finally:
        client.close()
        await waker.stop()
        await store.close()


async def test_a_task_heartbeaten_past_the_pointers_keep_time_is_settled_by_the_next_request(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The agent's pointer to the repository where it works is kept by its heartbeats: a task
    held longer than `agent_task_ttl_s` is still settled by the next request, which claims
    elsewhere (before, the pointer aged out and the agent ended with two live leases)."""
    settings = make_settings(
        redis={"url": redis_url},
        repositories=names(3),
        leases={"settle_grace_s": 0, "lease_ttl_s": 2, "agent_task_ttl_s": 2},
    )
    store = Store.from_settings(settings)
    try:
        tasks, held = await held_in_first_work_in_last(store, settings)
        for _ in range(6):  # 3 s of work, heartbeating every 0.5 s: past the 2 s keep time
            await asyncio.sleep(0.5)
            await tasks.heartbeat(held.repository, held.issue_id, "a1", held.lease.token)
        await holds_only_the_last(store, tasks)
    finally:
        await store.close()


async def test_a_reload_keeps_a_line_that_a_message_brought_while_it_read(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """A reload's read that Redis answered before a repository gained work, applied after that
    repository's message, must not put the older line back: the work would stay invisible
    until the next reload (60 s)."""
    from github_broker.claim.repo_index import RepoIndex

    settings = make_settings(redis={"url": redis_url}, repositories=names(2))
    store = Store.from_settings(settings)
    try:
        for name in names(2):
            await mirrored(store, name, [])
        index = RepoIndex()
        read = asyncio.Event()
        real = store.index_lines

        async def slow_lines() -> dict[str, str]:
            lines = await real()  # Redis answers now: no work anywhere
            read.set()
            await asyncio.sleep(0.2)  # the reply is still on its way while the message lands
            return lines

        store.index_lines = slow_lines  # type: ignore[method-assign]
        reloading = asyncio.create_task(index.reload(store))
        await read.wait()
        await mirrored(store, names(2)[1], [5])  # the claim scripts publish the new line
        line = await store.client.get(store.repo(names(2)[1]).keys.idx)
        assert index.apply(f"idx\t{names(2)[1]}\t{line.decode()}")
        await reloading
        assert set(index.with_work(None, None)) == {names(2)[1]}
    finally:
        await store.close()


async def test_the_index_is_read_again_once_redis_confirms_the_subscription(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """The reload after a reconnect follows Redis's confirmation of the subscription, not the
    connection: a line published between the two is heard (or read), never lost."""
    from github_broker.store import RESUBSCRIBED

    settings = make_settings(redis={"url": redis_url}, repositories=names(2))
    store = Store.from_settings(settings)
    client = sync_redis.Redis.from_url(redis_url)
    try:
        async with store.ready_events() as queue:
            first = await asyncio.wait_for(queue.get(), 5)
            assert first == RESUBSCRIBED  # the first confirmation
            client.publish(store.global_keys.events, "ready")
            assert await asyncio.wait_for(queue.get(), 5) == "ready"
            client.client_kill_filter(_type="pubsub")
            assert await asyncio.wait_for(queue.get(), 10) == RESUBSCRIBED
            # Confirmed: everything published from now on arrives.
            client.publish(store.global_keys.events, "ready")
            assert await asyncio.wait_for(queue.get(), 5) == "ready"
    finally:
        client.close()
        await store.close()


async def test_a_lease_the_sync_adopts_after_a_loss_is_settled_by_the_agents_next_request(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """Redis lost the agent's lease and its pointer; the sync adopts the lease from GitHub's
    labels and points the agent at that repository, so the agent's next request, which claims
    elsewhere, settles the adopted task first (never two live leases)."""
    from github_broker.leader.sync import Syncer

    settings = make_settings(
        redis={"url": redis_url}, repositories=names(3), leases={"settle_grace_s": 0}
    )
    store = Store.from_settings(settings)
    try:
        await mirrored(store, names(3)[1], [])
        await mirrored(store, names(3)[2], [7, 8])
        rstore = store.repo(names(3)[0])
        await rstore.save_sync_state({}, rebuilt=True)
        # GitHub shows issue 1 at work for a1; Redis knows nothing of it.
        held = issue(1, "P1", "BACKENDCODER", "in-progress", "a1")
        report = await Syncer(settings, store, gateway=None).apply_issues(  # type: ignore[arg-type]
            rstore, [held], "main"
        )
        assert report.adopted == 1
        tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
        await holds_only_the_last(store, tasks)
    finally:
        await store.close()
