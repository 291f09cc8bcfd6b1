"""Redis comes back with OLDER data: a restart that loads its persistence file (an RDB snapshot
taken minutes ago, an AOF missing its last second), or a failover to a lagging replica.

That data is consistent but stale: a lease ended since looks live, the agent's current task is
the one before, the label writes of the old lease are queued again. Kept as it is, the sync
trusts it over GitHub: it put the old lease's labels back on an issue already in review and
took them off the issue the agent works on now, whose heartbeat then answered 409. The leader
notices the new redis-server (`Daemon._forget_stale_data`: its run_id differs from the one the
data was last checked on), drops each repository's data and rebuilds it from GitHub, as after
a total loss: the agent keeps the task GitHub says it holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from github_broker.keys import RepoKeys
from github_broker.settings import Settings
from github_broker.simulator import generate_issues
from github_broker.store import Store
from tests.conftest import _redis_exe, free_port
from tests.processes import BrokerProcess, broker_env, post, wait_for
from tests.world import simulated

REPO = "acme/widgets"
KEYS = RepoKeys("gb", "acme", "widgets")


class PersistentRedis:
    """A redis-server of our own that keeps an RDB file in `workdir` (written on SAVE only)
    and can be killed and started again on the same port, loading it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                _redis_exe(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--dbfilename",
                "dump.rdb",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        try:
            wait_for(lambda: _answers(client), 10, "redis-server to start")
        finally:
            client.close()

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.BusyLoadingError):
        return False


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[PersistentRedis]:
    server = PersistentRedis(tmp_path)
    server.start()
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.proc.terminate()
        server.proc.wait(timeout=10)


@pytest.mark.slow
def test_restart_from_an_older_snapshot_rebuilds_from_github_and_keeps_the_agents_task(
    persistent_redis: PersistentRedis, tmp_path: Path
) -> None:
    """a1 claims #1; Redis saves a snapshot; a1 completes #1 (in review on GitHub) and works
    on #2 (labelled for it). Redis is killed and restarts from the snapshot, which says a1
    still holds #1. The leader rebuilds from GitHub: a1's heartbeat on #2 keeps its task,
    #1 stays in review without a1's labels, and a1 holds #2 only."""
    with simulated(generate_issues(6, priorities=("P1",))) as sim:
        env = broker_env(
            persistent_redis.url, sim.base_url, REPO, GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0"
        )
        broker = BrokerProcess(env, tmp_path, "b0").start()
        client = redis.Redis.from_url(persistent_redis.url)
        labels = lambda n: set(sim.state.issue_labels("acme", "widgets", n))  # noqa: E731
        try:
            wait_for(lambda: client.zcard(KEYS.ready) == 6, 20, "the first sync")
            old = post(broker.url, "/request-task", {"agent_id": "a1"}).json()
            wait_for(lambda: {"in-progress", "a1"} <= labels(old["issue_id"]), 15, "old labels")
            client.save()  # the snapshot: a1 holds the old task
            r = post(broker.url, "/request-task", {"agent_id": "a1"})  # done with it, next
            assert r.status_code == 200, r.text
            new = r.json()
            assert new["issue_id"] != old["issue_id"]
            wait_for(
                lambda: (
                    {"in-progress", "a1"} <= labels(new["issue_id"])
                    and "needs-review" in labels(old["issue_id"])
                    and not labels(old["issue_id"]) & {"in-progress", "a1"}
                ),
                15,
                "the completion's and the new claim's labels on GitHub",
            )
            client.close()
            persistent_redis.kill()
            persistent_redis.start()  # loads the snapshot
            client = redis.Redis.from_url(persistent_redis.url)

            heartbeat = {"agent_id": "a1", "token": new["lease"]["token"]}
            path = f"/tasks/acme/widgets/{new['issue_id']}/heartbeat"
            answers: list[int] = []

            def kept() -> bool:
                answer = post(broker.url, path, heartbeat)
                answers.append(answer.status_code)
                assert answer.status_code in (200, 503), answer.text
                return answer.status_code == 200 and client.exists(KEYS.mirror) == 1

            wait_for(kept, 20, "the agent's heartbeat on its current task")
            held = [int(n) for n in client.zrange(KEYS.leases, 0, -1)]
            assert held == [new["issue_id"]], held
            assert client.get(KEYS.agent_task_prefix + "a1") == str(new["issue_id"]).encode()
            # The old lease's labels never come back (the snapshot's queued writes are gone).
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                assert not labels(old["issue_id"]) & {"in-progress", "a1"}, labels(old["issue_id"])
                assert {"in-progress", "a1"} <= labels(new["issue_id"])
                time.sleep(0.2)
            assert "needs-review" in labels(old["issue_id"])
            print(f"\nrestart from an older snapshot: heartbeat answers {answers}")
        finally:
            client.close()
            broker.stop()


@pytest.mark.slow
def test_graceful_restart_under_a_running_leader_keeps_the_data(
    persistent_redis: PersistentRedis, tmp_path: Path
) -> None:
    """SHUTDOWN SAVE, then a restart: the file holds the leader's last mark, so the data is
    current and kept (no rebuild, the lease and its agent's token stay valid)."""
    with simulated(generate_issues(4, priorities=("P1",))) as sim:
        env = broker_env(persistent_redis.url, sim.base_url, REPO)
        broker = BrokerProcess(env, tmp_path, "b0").start()
        client = redis.Redis.from_url(persistent_redis.url)
        try:
            wait_for(lambda: client.zcard(KEYS.ready) == 4, 20, "the first sync")
            task = post(broker.url, "/request-task", {"agent_id": "a1"}).json()
            wait_for(lambda: client.get(KEYS.server) is not None, 10, "the leader's check")
            time.sleep(1)  # a few checks: the mark moves on
            first_event = client.xrange(KEYS.timeline, count=1)[0][0]
            with contextlib.suppress(redis.ConnectionError):
                client.shutdown(save=True)
            assert persistent_redis.proc is not None
            persistent_redis.proc.wait(timeout=10)
            client.close()
            persistent_redis.start()
            client = redis.Redis.from_url(persistent_redis.url)
            heartbeat = {"agent_id": "a1", "token": task["lease"]["token"]}
            path = f"/tasks/acme/widgets/{task['issue_id']}/heartbeat"
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # several of the leader's checks
                assert client.exists(KEYS.mirror) == 1, "the data was dropped"
                answer = post(broker.url, path, heartbeat)
                assert answer.status_code in (200, 503), answer.text
                time.sleep(0.2)
            assert post(broker.url, path, heartbeat).status_code == 200
            assert [int(n) for n in client.zrange(KEYS.leases, 0, -1)] == [task["issue_id"]]
            # The data from before the restart is still there (a rebuild starts anew).
            assert client.xrange(KEYS.timeline, count=1)[0][0] == first_event
            assert "up to date: kept" in broker.log_path.read_text()
        finally:
            client.close()
            broker.stop()


@pytest.mark.anyio
async def test_data_checked_on_another_server_is_dropped_for_that_repository_only(
    redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    """check_server: the first check records the server; the same server keeps everything;
    another one keeps it too when the data holds the checker's last mark (saved after it),
    and otherwise drops every key of the repository (and only of it), then records the new
    server. A repository with nothing recorded yet (data from before this check existed)
    keeps its data."""
    settings = make_settings(redis={"url": redis_url}, repositories=["acme/widgets", "acme/other"])
    store = Store.from_settings(settings)
    try:
        widgets, other = store.repo("acme/widgets"), store.repo("acme/other")
        client = store.client
        await client.set(widgets.keys.mirror, "1")
        await client.set(widgets.keys.issue_prefix + "1", "{}")
        await client.zadd(widgets.keys.leases, {"1": 1})
        await client.set(other.keys.mirror, "1")
        assert await store.server_id() is not None
        assert not await widgets.check_server("aaaa", "m1", None)  # recorded, nothing dropped
        assert not await widgets.check_server("aaaa", "m2", "m1")
        # Another server, but the data holds the last mark: saved after it, kept.
        assert not await widgets.check_server("bbbb", "m3", "m2")
        assert await client.exists(widgets.keys.mirror, widgets.keys.leases) == 2
        # Another server and an older mark (or no memory of one): dropped.
        assert await widgets.check_server("cccc", "m4", "m9")
        left = [k async for k in client.scan_iter(match=widgets.keys.base + "*")]
        assert left == [widgets.keys.server.encode()]
        assert await client.get(widgets.keys.server) == b"cccc m4"
        assert await client.exists(other.keys.mirror) == 1  # another repository's data stays
        assert not await other.check_server("cccc", "m5", None)  # nothing recorded: kept
        assert await client.exists(other.keys.mirror) == 1
        await client.set(other.keys.server, "dddd m5")
        assert await other.check_server("cccc", "m6", None)
    finally:
        await store.close()
