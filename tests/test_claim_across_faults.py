"""The claim across repositories (claim_walk.py, store/agents.py's agent mutex, repo_index.py)
under a hostile environment, from the outside: real `serve` processes on a real redis-server,
their agent's requests racing across processes, the release's script flushed, the index's
subscription killed, the agent's pointers (`agent_repos`) lost or outlived by its lease.

The invariant every test reads back from Redis: an agent holds at most one live lease across
every repository."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import requests

from github_broker.keys import GlobalKeys, RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.processes import BrokerProcess, broker_env, start_all, wait_for
from tests.redis_proxy import RedisProxy, RespError
from tests.waiting import wait_until

REPOS = ["acme/widgets", "acme/gadgets", "acme/gizmos"]
GLOBAL = GlobalKeys("gb")
SETTLED = {"completed", "failed", "abandoned", "released", "expired", "revoked"}


def keys(repository: str) -> RepoKeys:
    owner, name = repository.split("/")
    return RepoKeys("gb", owner, name)


def simulator(counts: dict[str, int]) -> Simulator:
    return Simulator(
        {
            "repositories": [
                {
                    "owner": r.split("/")[0],
                    "name": r.split("/")[1],
                    "issues": generate_issues(n, priorities=("P1",)),
                }
                for r, n in counts.items()
            ]
        }
    )


@contextmanager
def brokers(
    sim: Simulator,
    redis_url: str,
    tmp_path: Path,
    counts: dict[str, int],
    n: int,
    urls: list[str] | None = None,
    **env: str,
) -> Iterator[list[BrokerProcess]]:
    """`n` single-process brokers on the repositories of `counts`, their first sync done;
    each on its own of `urls` (Redis, or a proxy in front of it) if given."""
    extra = {
        "GITHUB_BROKER_LEASES__SETTLE_GRACE_S": "0",
        "GITHUB_BROKER_FAILURES__COOLDOWN_S": "0",
        "GITHUB_BROKER_FAILURES__MAX_FAILURES": "100000",
        "GITHUB_BROKER_FAILURES__BREAKER_STREAK": "0",
        **env,
    }
    procs = [
        BrokerProcess(
            broker_env(url, sim.base_url, ",".join(counts), **extra),
            tmp_path,
            f"b{i}",
            single_process=True,
        )
        for i, url in enumerate(urls or [redis_url] * n)
    ]
    start_all(procs)
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(
            lambda: all(
                client.zcard(keys(r).ready) == c
                and (client.get(keys(r).idx) or b"").startswith(b"1|")  # mirror built
                for r, c in counts.items()
            ),
            30,
            "the first sync of every repository",
        )
        yield procs
    finally:
        client.close()
        for proc in procs:
            proc.stop()


def ask(url: str, agent: str, **body: Any) -> requests.Response:
    return requests.post(f"{url}/request-task", json={"agent_id": agent, **body}, timeout=30)


def live_leases(client: redis.Redis, agent: str, repos: list[str] = REPOS) -> list[tuple[str, int]]:
    """(repository, issue) of every live lease `agent` holds, read from Redis."""
    held = []
    for repository in repos:
        k = keys(repository)
        for raw in client.zrange(k.leases, 0, -1):
            n = int(raw)
            owner = (client.hget(k.lease(n), "agent") or b"").decode()
            if owner == agent and client.exists(k.issue_lock(n)):
                held.append((repository, n))
    return sorted(held)


def timeline(client: redis.Redis, repository: str) -> list[dict[str, str]]:
    return [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in client.xrange(keys(repository).timeline)
    ]


# --- 1. one agent racing itself across two processes ---------------------------------------------

RACE_COUNTS = {r: 60 for r in REPOS}
RACE_ROUNDS = 25


def test_one_agent_racing_itself_on_two_processes_holds_one_lease_and_settles_each_once(
    redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(32)
    client = redis.Redis.from_url(redis_url)
    with (
        simulator(RACE_COUNTS) as sim,
        brokers(sim, redis_url, tmp_path, RACE_COUNTS, 2) as procs,
        ThreadPoolExecutor(max_workers=6) as pool,
    ):
        urls = [p.url for p in procs]
        handed_out = 0
        for round_ in range(RACE_ROUNDS):
            bodies = []
            for i in range(rng.randint(2, 6)):
                body: dict[str, Any] = {
                    "previous": rng.choice(["completed", "failed", "abandoned"])
                }
                pick = rng.random()
                if pick < 0.6:
                    body["repositories"] = rng.sample(REPOS, rng.randint(1, 2))
                bodies.append((urls[i % 2], body))
            answers = list(pool.map(lambda a: ask(a[0], "solo", **a[1]), bodies))
            for r in answers:
                # 503: the agent's other request held the mutex for its whole hold (never
                # expected here: a request takes milliseconds).
                assert r.status_code in (200, 204), (round_, r.status_code, r.text)
            held = live_leases(client, "solo")
            assert len(held) <= 1, f"round {round_}: two live leases {held}"
            # The agent's last answer, if it got one, is the lease it holds.
            handed = {
                (r.json()["repository"], r.json()["issue_id"])
                for r in answers
                if r.ok and r.status_code == 200
            }
            assert set(held) <= handed, (round_, held, handed)
            handed_out += bool(handed)
        # The least work: the races hand the agent a task in most rounds (not 204s only).
        assert handed_out >= RACE_ROUNDS // 2, handed_out
        # Every lease the agent was given was settled at most once: per repository and
        # issue, its timeline alternates claim and settlement, never two settlements of one
        # claim.
        for repository in REPOS:
            last: dict[str, str] = {}
            for event in timeline(client, repository):
                if event.get("agent") != "solo":
                    continue
                n, kind = event["n"], event["kind"]
                if kind in SETTLED:
                    assert last.get(n) == "claim", (repository, n, kind, last.get(n))
                    last[n] = "settled"
                elif kind == "claim":
                    last[n] = "claim"
    client.close()


# --- 2. the release's EVALSHA gets NOSCRIPT ----------------------------------------------------


def test_a_release_refused_with_noscript_frees_the_agent_within_a_second_not_the_hold(
    redis_url: str, tmp_path: Path
) -> None:
    """SCRIPT FLUSH between two requests of one agent: the second request's release
    (EVALSHA, not waited for) gets NOSCRIPT; `_retry_release` loads the script and deletes
    the mutex at once. The agent's next request, on the other process, is answered well
    within a second, not after the mutex's hold (28 call bounds of 2 s: 56 s)."""
    counts = {r: 12 for r in REPOS}
    client = redis.Redis.from_url(redis_url)
    busy = GLOBAL.agent_busy("a1")
    with simulator(counts) as sim, brokers(sim, redis_url, tmp_path, counts, 2) as (p, q):
        assert ask(p.url, "a1").status_code == 200  # every script loaded
        for attempt in range(4):
            client.script_flush()
            assert ask(p.url, "a1").status_code == 200
            started = time.monotonic()
            r = ask(q.url, "a1")
            took = time.monotonic() - started
            assert r.status_code == 200, r.text
            assert took < 1.0, f"attempt {attempt}: the other process waited {took:.2f}s"
            wait_for(lambda: not client.exists(busy), 1.0, "the mutex released")
            assert len(live_leases(client, "a1")) == 1
    client.close()


# --- 4. the index's subscription lost while a repository gains work ----------------------------


def test_work_whose_index_message_was_lost_is_found_right_after_the_resubscription(
    redis_url: str, tmp_path: Path
) -> None:
    """gadgets has work, but the process heard (a stale message) that it has none, and the
    message saying otherwise was lost: a request finds nothing. Killing the subscription
    makes the process resubscribe and read the index again: the work is found within
    seconds, not after the 60 s reload."""
    counts = {"acme/widgets": 0, "acme/gadgets": 3}
    client = redis.Redis.from_url(redis_url)
    gadgets = keys("acme/gadgets")
    with (
        simulator(counts) as sim,
        brokers(sim, redis_url, tmp_path, counts, 1, GITHUB_BROKER_POLL__INTERVAL_S="60") as (p,),
    ):
        true_line = client.get(gadgets.idx)
        assert true_line is not None and true_line.startswith(b"1|")
        # Wait until the process is subscribed (a published message reaches one subscriber).
        wait_for(lambda: client.pubsub_numsub(GLOBAL.events)[0][1] >= 1, 10, "subscribed")
        client.publish(GLOBAL.events, "idx\tacme/gadgets\t1||0|")
        wait_for(lambda: ask(p.url, "probe").status_code == 204, 5, "the stale index")
        assert client.get(gadgets.idx) == true_line  # Redis itself still says: work
        client.client_kill_filter(_type="pubsub")

        def found() -> requests.Response | None:
            r = ask(p.url, "a1")
            assert r.status_code in (200, 204), r.text
            return r if r.status_code == 200 else None

        r = wait_until(found, 5, "work found after the resubscription", every_s=0.1)
        assert r.json()["repository"] == "acme/gadgets"
    client.close()


# --- 5. the agent's pointers: settling elsewhere, a lost key, an outlived pointer ----------------


def test_a_request_naming_only_another_repository_settles_the_held_task_as_previous_says(
    redis_url: str, tmp_path: Path
) -> None:
    counts = {"acme/widgets": 3, "acme/gadgets": 3}
    client = redis.Redis.from_url(redis_url)
    with simulator(counts) as sim, brokers(sim, redis_url, tmp_path, counts, 2) as (p, q):
        held = ask(p.url, "a1", repositories=["acme/widgets"]).json()
        assert held["repository"] == "acme/widgets"
        r = ask(q.url, "a1", repositories=["acme/gadgets"], previous="failed")
        assert r.status_code == 200, r.text
        assert r.json()["repository"] == "acme/gadgets"
        assert live_leases(client, "a1", list(counts)) == [("acme/gadgets", r.json()["issue_id"])]
        ended = [
            e["kind"]
            for e in timeline(client, "acme/widgets")
            if e.get("n") == str(held["issue_id"]) and e["kind"] in SETTLED
        ]
        assert ended == ["failed"], ended
    client.close()


def test_an_agent_whose_pointers_key_was_lost_is_pointed_again_by_its_next_heartbeat(
    redis_url: str, tmp_path: Path
) -> None:
    """The agent's pointers lost alone (a DEL, an eviction): its next heartbeat points at the
    repository of its task again, so a request claiming elsewhere settles that task first.
    (A request sent before that heartbeat cannot know: docs/operations.md says so.)"""
    counts = {"acme/widgets": 3, "acme/gadgets": 3}
    client = redis.Redis.from_url(redis_url)
    with simulator(counts) as sim, brokers(sim, redis_url, tmp_path, counts, 1) as (p,):
        held = ask(p.url, "a1", repositories=["acme/widgets"]).json()
        assert held["repository"] == "acme/widgets"
        assert client.delete(GLOBAL.agent_repos("a1")) == 1  # that key alone is lost
        beat = f"{p.url}/tasks/acme/widgets/{held['issue_id']}/heartbeat"
        body = {"agent_id": "a1", "token": held["lease"]["token"]}
        assert requests.post(beat, json=body, timeout=10).status_code == 200
        r = ask(p.url, "a1", repositories=["acme/gadgets"])
        assert r.status_code in (200, 204, 503), r.text
        held_now = live_leases(client, "a1", list(counts))
        assert len(held_now) <= 1, f"two live leases: {held_now}"
    client.close()


def test_a_lease_kept_by_heartbeats_past_agent_task_ttl_is_still_settled_by_a_claim_elsewhere(
    redis_url: str, tmp_path: Path
) -> None:
    """lease_ttl_s = agent_task_ttl_s = 2 (allowed: agent_task_ttl_s >= lease_ttl_s); the
    agent heartbeats its widgets task for 3.5 s, then asks for gadgets only."""
    counts = {"acme/widgets": 3, "acme/gadgets": 3}
    client = redis.Redis.from_url(redis_url)
    with (
        simulator(counts) as sim,
        brokers(
            sim,
            redis_url,
            tmp_path,
            counts,
            1,
            GITHUB_BROKER_LEASES__LEASE_TTL_S="2",
            GITHUB_BROKER_LEASES__AGENT_TASK_TTL_S="2",
        ) as (p,),
    ):
        held = ask(p.url, "a1", repositories=["acme/widgets"]).json()
        assert held["repository"] == "acme/widgets"
        beat = f"{p.url}/tasks/acme/widgets/{held['issue_id']}/heartbeat"
        body = {"agent_id": "a1", "token": held["lease"]["token"]}
        until = time.monotonic() + 3.5
        while time.monotonic() < until:
            assert requests.post(beat, json=body, timeout=10).status_code == 200
            time.sleep(0.4)
        assert live_leases(client, "a1", list(counts)) == [("acme/widgets", held["issue_id"])]
        r = ask(p.url, "a1", repositories=["acme/gadgets"])
        assert r.status_code in (200, 204, 503), r.text
        held_now = live_leases(client, "a1", list(counts))
        assert len(held_now) <= 1, f"two live leases: {held_now}"
    client.close()


# --- 3. a request stalled between the agent's mutex and its claim ------------------------------

#: 0.2 s call bounds: the mutex's hold with two repositories is 24 of them (a replay check,
#: a settling round, four per repository, ten sync lookups, one margin), 4.8 s.
STALL_SOCKET_TIMEOUT_S = 0.2
STALL_HOLD_S = STALL_SOCKET_TIMEOUT_S * (4 + 1 + 4 * 2 + 10 + 1)


#: The repositories of the proxy tests: P claims in widgets, Q in gadgets.
PROXIED = {"acme/widgets": 3, "acme/gadgets": 3}


@contextmanager
def behind_a_proxy(
    client: redis.Redis, redis_url: str, tmp_path: Path
) -> Iterator[tuple[RedisProxy, BrokerProcess, BrokerProcess, ThreadPoolExecutor]]:
    """Two brokers on PROXIED: P reaches Redis through a proxy that can stall it, Q directly;
    a thread to ask P from while the test watches."""
    port = client.connection_pool.connection_kwargs["port"]
    with (
        RedisProxy(port) as proxy,
        simulator(PROXIED) as sim,
        brokers(
            sim,
            redis_url,
            tmp_path,
            PROXIED,
            2,
            urls=[proxy.url, redis_url],
            GITHUB_BROKER_REDIS__SOCKET_TIMEOUT_S=str(STALL_SOCKET_TIMEOUT_S),
        ) as (p, q),
        ThreadPoolExecutor(max_workers=1) as pool,
    ):
        yield proxy, p, q, pool


def test_a_claim_reaching_redis_after_the_mutex_hold_is_refused_and_the_agent_holds_one_lease(
    redis_url: str, tmp_path: Path
) -> None:
    """P takes the agent's mutex (pointing at widgets); its way to Redis then stalls (the
    proxy holds every byte P sends from its claim script on, as a paused process or network
    would). The agent asks Q for gadgets only: Q is answered once the hold ran out on Redis's
    clock, not later. Then P's claim reaches Redis, after the hold: Redis refuses it (the
    fence, claim.lua's OUTLIVED), and the agent holds Q's lease alone. Without the fence,
    P's claim ran and the agent held two leases."""
    client = redis.Redis.from_url(redis_url)
    with behind_a_proxy(client, redis_url, tmp_path) as (proxy, p, q, pool):
        proxy.arm("a1")
        pending = pool.submit(ask, p.url, "a1", repositories=["acme/widgets"])
        wait_until(proxy.holding, 10, "P's claim script for a1 held by the proxy")
        assert client.exists(GLOBAL.agent_busy("a1")), "P holds the agent's mutex"
        first = pending.result(timeout=30)
        assert first.status_code == 503, first.text  # P gave up on its stalled call
        started = time.monotonic()
        other = ask(q.url, "a1", repositories=["acme/gadgets"])
        took = time.monotonic() - started
        assert other.status_code == 200, other.text
        assert other.json()["repository"] == "acme/gadgets"
        assert took < STALL_HOLD_S + 2.0, f"Q answered after {took:.1f}s"
        proxy.release()
        assert proxy.answered.wait(10), "Redis never answered P's held claim"
        held = live_leases(client, "a1", list(PROXIED))
        assert held == [("acme/gadgets", other.json()["issue_id"])], f"two live leases: {held}"
        reply = proxy.held_reply
        assert isinstance(reply, RespError) and reply.startswith(b"OUTLIVED"), reply
        assert not any(
            e["kind"] == "claim" and e.get("agent") == "a1"
            for e in timeline(client, "acme/widgets")
        ), "P claimed after its mutex ran out"
    client.close()


def test_a_claim_left_unanswered_keeps_the_agents_mutex_until_its_fence(
    redis_url: str, tmp_path: Path
) -> None:
    """P's claim script stalls on its connection alone (P's new connections get through): P
    gives up on it (503) but must not release the agent's mutex, since the script can still
    reach Redis before the fence. The agent asks Q for gadgets: Q waits for the hold to run
    out, then P's claim lands and is refused. Before, P released the mutex at once, Q claimed
    at once, and P's claim landed inside its fence: the agent held two leases."""
    client = redis.Redis.from_url(redis_url)
    with behind_a_proxy(client, redis_url, tmp_path) as (proxy, p, q, pool):
        proxy.arm("a1", one_connection=True)
        pending = pool.submit(ask, p.url, "a1", repositories=["acme/widgets"])
        wait_until(proxy.holding, 10, "P's claim script for a1 held by the proxy")
        first = pending.result(timeout=30)
        assert first.status_code == 503, first.text  # P gave up on its stalled call
        other = ask(q.url, "a1", repositories=["acme/gadgets"])
        assert other.status_code == 200, other.text
        assert other.json()["repository"] == "acme/gadgets"
        proxy.release()
        assert proxy.answered.wait(10), "Redis never answered P's held claim"
        held = live_leases(client, "a1", list(PROXIED))
        assert held == [("acme/gadgets", other.json()["issue_id"])], f"two live leases: {held}"
        reply = proxy.held_reply
        assert isinstance(reply, RespError) and reply.startswith(b"OUTLIVED"), reply
    client.close()
