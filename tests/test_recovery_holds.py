"""After Redis loses its data, the latest grant wins and ended leases stay ended.

Two serve processes share one Redis (no persistence: `redis.durability: none`, the default).
Before the loss, leases end every way a lease can end — revoked, revoked with hold, released
(and claimed again by someone else), reassigned, expired, completed during a GitHub write
outage — and other leases are live. Then Redis loses everything (FLUSHALL, or kill -9 and a
restart with no data). From then on, every old token is replayed without pause and every
current holder heartbeats: no old token is honoured, no current holder is told its lease
ended, nothing is handed out before the post-loss hold-back ends, and the task completed with
its PR open goes to review instead of back to the pool.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import requests

from github_broker.keys import RepoKeys
from github_broker.simulator import Simulator, generate_issues
from tests.factories import make_known
from tests.processes import BrokerProcess, broker_env, start_all
from tests.test_durability import SIGNING, RedisNode
from tests.waiting import wait_until

pytestmark = pytest.mark.slow
REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")


@dataclass
class Held:
    agent: str
    task: dict[str, Any]

    @property
    def n(self) -> int:
        return int(self.task["issue_id"])

    def body(self) -> dict[str, str]:
        return {"agent_id": self.agent, "token": self.task["lease"]["token"]}


@dataclass
class Ledger:
    """What every call after the loss was answered."""

    replays: dict[str, list[int]] = field(default_factory=dict)
    holders: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    handouts: list[tuple[float, int]] = field(default_factory=list)


class Stack:
    def __init__(self, sim: Simulator, node: RedisNode, tmp_path: Path, lease_ttl_s: int) -> None:
        env = broker_env(
            node.url,
            sim.base_url,
            REPO,
            GITHUB_BROKER_LEASES__SIGNING_KEYS=SIGNING,
            GITHUB_BROKER_LEASES__LEASE_TTL_S=str(lease_ttl_s),
            GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
            GITHUB_BROKER_PROGRESS__CHECK_INTERVAL_S="0.5",
            GITHUB_BROKER_PROGRESS__NO_PR_GRACE_S="3600",
        )
        self.sim = sim
        self.node = node
        self.brokers = start_all([BrokerProcess(env, tmp_path, f"b{i}") for i in range(2)])

    def url(self, i: int) -> str:
        return self.brokers[i % 2].url

    def claim(self, agent: str, i: int = 0) -> Held:
        r = requests.post(f"{self.url(i)}/request-task", json={"agent_id": agent}, timeout=10)
        assert r.status_code == 200, (agent, r.status_code, r.text)
        return Held(agent, r.json())

    def lease_call(self, held: Held, verb: str, i: int = 0) -> requests.Response:
        return requests.post(
            f"{self.url(i)}/tasks/{REPO}/{held.n}/{verb}", json=held.body(), timeout=10
        )

    def admin(self, path: str, body: dict[str, Any], i: int = 0) -> dict[str, Any]:
        r = requests.post(f"{self.url(i)}/admin{path}", json=body, timeout=10)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def labels(self, n: int) -> set[str]:
        return set(self.sim.state.issue_labels("acme", "widgets", n))

    def stop(self) -> None:
        for broker in self.brokers:
            broker.stop()


def end_every_way(stack: Stack, client: redis.Redis, lease_ttl_s: int) -> tuple[dict, dict]:
    """Leases ended each way a lease ends (agent -> its old lease) and leases live now (agent
    -> its current lease), in a state GitHub partly lags behind."""
    ended: dict[str, Held] = {}
    live: dict[str, Held] = {}
    revoked, held, released = stack.claim("revoked"), stack.claim("held", 1), stack.claim("rel")
    reassigned = stack.claim("from", 1)
    assert stack.lease_call(released, "release").status_code == 200
    # Someone else takes the released issue (the head of the pool): the current holder.
    taker = stack.claim("taker", 1)
    assert taker.n == released.n
    stack.admin(f"/tasks/{REPO}/{revoked.n}/revoke", {"reason": "wrong approach"})
    stack.admin(f"/tasks/{REPO}/{held.n}/revoke", {"reason": "wait for me", "hold": True}, 1)
    make_known(stack.node.url, "to")  # a reassignment names an agent the broker knows
    stack.admin(f"/tasks/{REPO}/{reassigned.n}/reassign", {"agent_id": "to"})
    to = stack.claim("to")
    assert to.n == reassigned.n
    ended.update(revoked=revoked, held=held, rel=released, **{"from": reassigned})
    live.update(taker=taker, to=to)
    if lease_ttl_s <= 15:
        expired = stack.claim("expired")
        tomb = KEYS.lease_end_prefix + expired.task["lease"]["token"].split(".")[0]

        def expired_while_the_others_beat() -> bool:
            for cur in live.values():
                assert stack.lease_call(cur, "heartbeat").status_code == 200
            return bool(client.get(tomb))

        wait_until(
            expired_while_the_others_beat,
            lease_ttl_s + 15,
            "the unrenewed lease to expire (reaped: its tombstone written)",
            every_s=0.5,
        )
        ended["expired"] = expired
    # A completion while GitHub refuses writes: its labels still say in progress, its PR is
    # open; its agent then takes another task (whose labels cannot land either).
    done = stack.claim("done")
    stack.sim.state.create_pull(
        "acme",
        "widgets",
        title="x",
        head=done.task["branch_name"],
        body=f"Closes #{done.n}",
        user="bot",
    )
    rule = stack.sim.faults.add_error(503, method="POST")
    assert stack.lease_call(done, "complete", 1).status_code == 200
    ended["done"] = done
    live["done"] = stack.claim("done")
    live["steady"] = stack.claim("steady", 1)
    assert stack.sim.faults.remove(rule.id)
    # Labels GitHub accepted before the loss (the hold's needs-human among them) are there.
    wait_until(lambda: "needs-human" in stack.labels(held.n), 10, "the hold on GitHub")
    return ended, live


def replay_and_watch(stack: Stack, ended: dict, live: dict, seconds: float) -> Ledger:
    ledger = Ledger()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        i += 1
        for agent, old in ended.items():
            ledger.replays.setdefault(agent, []).append(
                stack.lease_call(old, "heartbeat", i).status_code
            )
        for agent, cur in live.items():
            r = stack.lease_call(cur, "heartbeat", i + 1)
            ledger.holders.setdefault(agent, []).append(
                (r.status_code, r.json().get("reason") or "")
            )
        got = requests.post(
            f"{stack.url(i)}/request-task", json={"agent_id": "newcomer"}, timeout=10
        )
        if got.status_code == 200:
            ledger.handouts.append((time.monotonic(), int(got.json()["issue_id"])))
            # Done with it at once: the newcomer keeps asking.
            requests.post(
                f"{stack.url(i)}/tasks/{REPO}/{got.json()['issue_id']}/release",
                json={"agent_id": "newcomer", "token": got.json()["lease"]["token"]},
                timeout=10,
            )
        time.sleep(0.2)
    return ledger


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {
        "repositories": [
            {"owner": "acme", "name": "widgets", "issues": generate_issues(14, priorities=("P1",))}
        ]
    }
    with Simulator(seed) as s:
        yield s


@pytest.mark.parametrize(
    ("lease_ttl_s", "loss"),
    [(12, "flushall"), (600, "restart-empty")],
    ids=["ttl12-flushall", "ttl600-kill9"],
)
def test_after_redis_loses_its_data_ended_leases_stay_ended_and_the_latest_grant_wins(
    sim: Simulator, tmp_path: Path, lease_ttl_s: int, loss: str
) -> None:
    node = RedisNode(tmp_path / "redis").start()
    stack = Stack(sim, node, tmp_path, lease_ttl_s)
    client = node.client()
    try:
        wait_until(lambda: client.zcard(KEYS.ready) == 14, 30, "the first sync")
        ended, live = end_every_way(stack, client, lease_ttl_s)
        if loss == "flushall":
            client.flushall()
        else:
            node.kill()
            node.start()  # no persistence: empty
        lost_at = time.monotonic()
        # Until the hold-back is set, the rebuild answers "retry"; read when it ends.
        until_ms = wait_until(lambda: client.get(KEYS.quarantine), 20, "the post-loss hold-back")
        # When it ends on this clock: Redis's clock (to the microsecond) read beside ours.
        seconds, micros = client.time()
        hold_back_ends = time.monotonic() + (int(until_ms) - seconds * 1000 - micros / 1000) / 1000
        watch_s = 14.0 if lease_ttl_s <= 15 else 12.0
        ledger = replay_and_watch(stack, ended, live, watch_s)

        honoured = {a: codes.count(200) for a, codes in ledger.replays.items() if 200 in codes}
        assert honoured == {}, f"old tokens honoured after the loss: {honoured}"
        assert all(len(codes) >= 10 for codes in ledger.replays.values())  # they kept trying
        told_ended = {
            a: [r for code, r in answers if code == 409]
            for a, answers in ledger.holders.items()
            if any(code == 409 for code, _ in answers)
        }
        assert told_ended == {}, f"current holders told their lease ended: {told_ended}"
        for agent, answers in ledger.holders.items():
            assert answers[-1][0] == 200, (agent, answers[-3:])  # proven, working on
        early = [(t - lost_at, n) for t, n in ledger.handouts if t < hold_back_ends - 0.5]
        assert early == [], f"handed out before the hold-back ended: {early}"
        taken = {n for _, n in ledger.handouts}
        held = {h.n for h in live.values()} | {ended["held"].n, ended["done"].n}
        assert not taken & held, f"handed out: {sorted(taken & held)} (held or completed)"
        if lease_ttl_s <= 15:
            assert ledger.handouts, "nothing was handed out once the hold-back ended"
        # The completion made during the outage is recovered from its PR: in review.
        done_n = ended["done"].n
        wait_until(
            lambda: (
                {"needs-review"} <= stack.labels(done_n)
                and not {"in-progress", "done"} & stack.labels(done_n)
            ),
            20,
            "the completed task in review on GitHub",
        )
        assert "needs-human" in stack.labels(ended["held"].n)  # the hold outlived the loss
    finally:
        client.close()
        stack.stop()
        node.stop()
