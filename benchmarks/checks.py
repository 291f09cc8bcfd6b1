"""Done means green: counted GitHub requests per PR state change, without and with webhooks.

In one process, on the bench's redis-server: the simulator (its fake CI off, `main`
requiring `ci/test`), the broker's leader (`Daemon`) and its webhook worker. PRS issues are
developed (each a push and a PR that closes it, completed), then every PR goes through
CHANGES state changes, all PRs at once, one round after another: its check starts
(`in_progress`), fails (with an annotation: a fix task), a new head is pushed (the fix task
withdrawn, checks start over), the check passes (the review is offered). Without webhooks the
leader's checks pass runs once after each round; with webhooks the simulator's signed
deliveries go through the broker's receiver and worker. The simulator counts every request
by route; the checks' requests (the GraphQL read, the branch's required checks, a failing
check's annotations) are divided by the state changes made. The review upkeep that PR
deliveries and a green PR run is counted apart. Also one PR alone, where a polling pass reads
just it. Every request of the checks is charged (GraphQL, annotations); a required-checks
read in the window would be a conditional GET.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.service import TaskService
from github_broker.gateway import GitHubGateway
from github_broker.leader.checks import MERGEABLE_SETTLE_S
from github_broker.leader.poller import Daemon
from github_broker.models import Outcome
from github_broker.settings import DEFAULTS_DIR, Settings, load_settings
from github_broker.simulator import Simulator, generate_issues
from github_broker.store import Store
from github_broker.webhooks.receiver import WebhookReceiver

logger = logging.getLogger(__name__)

OWNER, NAME = "acme", "checks"
REPO = f"{OWNER}/{NAME}"
#: PRs in the many-PR rows.
PRS = 10
#: State changes each PR goes through in the window.
CHANGES = ("check running", "check failed", "new head pushed", "check passed")
SECRET = "bench-checks-secret"
GRAPHQL = "POST /graphql"
BRANCH = "GET /repos/{owner}/{repo}/branches/{branch}"
ANNOTATIONS = "GET /repos/{owner}/{repo}/check-runs/{check_run_id}/annotations"
#: The requests the checks make (the rest in the window: the review upkeep's, run by PR
#: deliveries and by the review offered once green).
CHECK_ROUTES = frozenset({GRAPHQL, BRANCH, ANNOTATIONS})
#: How long the webhook worker may take to apply a round's deliveries.
APPLY_TIMEOUT_S = 30.0


def figures(bench: Any) -> None:
    for mode in ("polling (no webhooks)", "webhooks"):
        for prs in (PRS, 1):
            bench.redis.flush()
            row = asyncio.run(_measure(bench.redis.url, prs, webhooks=mode == "webhooks"))
            bench.add(
                "checks_calls",
                {"mode": mode, **row, "reproduce": bench.options.reproduce("checks")},
            )


def _settings(redis_url: str, github_url: str, webhooks: bool) -> Settings:
    extra: dict[str, Any] = {"webhooks": {"secret": SECRET}} if webhooks else {}
    return load_settings(
        DEFAULTS_DIR,
        repositories=[REPO],
        github={"base_url": github_url, "token": "bench", "seconds_between_writes": 0},
        redis={"url": redis_url, "key_prefix": "gb-bench-checks"},
        review={"delay_s": 0, "timeout_s": 3600},
        leases={"settle_grace_s": 0},
        checks={"author_first_s": 0},
        **extra,
    )


async def _measure(redis_url: str, prs: int, *, webhooks: bool) -> dict[str, Any]:
    seed = {
        "repositories": [
            {
                "owner": OWNER,
                "name": NAME,
                "issues": generate_issues(prs, priorities=("P1",)),
                "protection": {"main": ["ci/test"]},
            }
        ]
    }
    with Simulator(seed) as sim:
        settings = _settings(redis_url, sim.base_url, webhooks)
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        daemon = Daemon(settings, store, gateway)
        tasks = TaskService(settings, store, Prompts.load(None), ReadyWaker(1.0))
        try:
            return await _run(sim, settings, daemon, tasks, prs, webhooks)
        finally:
            await daemon.stop()
            await store.close()
            gateway.close()


async def _tick(daemon: Daemon) -> None:
    await daemon.hold_leadership()
    await daemon.drain_all()
    await daemon.sync_all()
    await daemon.drain_all()


async def _run(
    sim: Simulator, settings: Settings, daemon: Daemon, tasks: TaskService, prs: int, webhooks: bool
) -> dict[str, Any]:
    await _developed(sim, daemon, tasks, prs)
    repo = settings.repositories[0]
    feed = _Feed(sim, settings, daemon) if webhooks else None
    if feed is not None:
        daemon.webhooks.start(lambda: True)
    try:
        return await _window(sim, daemon, repo, feed, prs)
    finally:
        if feed is not None:
            feed.close()


async def _window(
    sim: Simulator, daemon: Daemon, repo: Any, feed: _Feed | None, prs: int
) -> dict[str, Any]:
    before = sim.stats.snapshot()
    fixes = 0
    for change in CHANGES:
        for n in range(1, prs + 1):
            _change(sim, n, change)
        if feed is not None:
            await feed.deliver()
        else:
            await daemon.checks.run(repo)
        if change == "check failed":
            fixes = len(
                [t for t, _ in await daemon.store.repo(REPO).ready_tasks() if t.startswith("fix:")]
            )
    if feed is not None:
        # The read a pushed head's mergeability gets once GitHub has worked it out.
        await asyncio.sleep(MERGEABLE_SETTLE_S + 1.0)
    after = sim.stats.snapshot()
    routes = {
        k: after["by_route"].get(k, 0) - before["by_route"].get(k, 0) for k in after["by_route"]
    }
    routes = {k: v for k, v in routes.items() if v}
    changes = prs * len(CHANGES)
    ours = {k: v for k, v in routes.items() if k in CHECK_ROUTES}
    reads = ours.get(GRAPHQL, 0) + ours.get(BRANCH, 0)
    annotations = ours.get(ANNOTATIONS, 0)
    return {
        "prs": prs,
        "state_changes": changes,
        "fix_tasks": fixes,
        "checks_calls": sum(ours.values()),
        "by_route": routes,
        "reads_per_change": reads / changes,
        "annotation_reads": annotations,
        "per_change": (reads + annotations) / changes,
        "other_calls": sum(v for k, v in routes.items() if k not in CHECK_ROUTES),
        "calls_304": after["by_status"].get("304", 0) - before["by_status"].get("304", 0),
    }


async def _developed(sim: Simulator, daemon: Daemon, tasks: TaskService, prs: int) -> None:
    """Each issue claimed, pushed, its PR opened, completed; then in review, its PR read."""
    await _tick(daemon)
    held = []
    for n in range(1, prs + 1):
        task = await tasks.request_task(f"dev-{n}")
        assert task is not None, "an issue was not handed out"
        held.append((task, f"dev-{n}"))
    await _tick(daemon)  # the branches
    for task, agent in held:
        n = task.issue_id
        sim.state.push(OWNER, NAME, task.branch_name, files={f"src/f{n}.py": "x\n"})
        sim.state.create_pull(
            OWNER,
            NAME,
            title=task.title,
            head=task.branch_name,
            body=f"Closes #{n}",
            user="dev-bot",
        )
        await tasks.finish(REPO, n, agent, task.lease.token, Outcome.COMPLETED)
    await _tick(daemon)
    await _tick(daemon)


def _change(sim: Simulator, n: int, change: str) -> None:
    sha = sim.state.get_ref(OWNER, NAME, f"heads/feature/issue-{n}")["object"]["sha"]
    if change == "new head pushed":
        sim.state.push(OWNER, NAME, f"feature/issue-{n}", files={f"src/f{n}.py": "fixed\n"})
        return
    body: dict[str, Any] = {"name": "ci/test", "head_sha": sha}
    if change == "check running":
        body["status"] = "in_progress"
    elif change == "check failed":
        body.update(
            conclusion="failure",
            output={
                "title": "1 test failed",
                "summary": "test_export failed",
                "annotations": [
                    {
                        "path": f"src/f{n}.py",
                        "start_line": 1,
                        "annotation_level": "failure",
                        "message": "boom",
                    }
                ],
            },
        )
    else:
        body["conclusion"] = "success"
    sim.state.create_check_run(OWNER, NAME, body, app="ci-bot")


class _Feed:
    """The simulator's signed deliveries, caught by a local endpoint and handed to the
    broker's receiver; the worker (running) applies them."""

    def __init__(self, sim: Simulator, settings: Settings, daemon: Daemon) -> None:
        self.sim = sim
        self.daemon = daemon
        self.receiver = WebhookReceiver(settings, daemon.store)
        self.caught: list[tuple[dict[str, str], bytes]] = []
        caught = self.caught

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                caught.append(({k.lower(): v for k, v in self.headers.items()}, data))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        sim.webhooks.add_hook(sim.state, {"url": url, "secret": SECRET, "repository": REPO})
        sim.webhooks.wait_idle()
        self.caught.clear()

    async def deliver(self) -> None:
        assert self.sim.webhooks.wait_idle(), "the simulator did not send its deliveries"
        items, self.caught[:] = list(self.caught), []
        for headers, data in items:
            event = headers["x-github-event"]
            if event != "ping":
                await self.receiver.accept(event, headers["x-github-delivery"], data)
        rstore = self.daemon.store.repo(REPO)
        deadline = time.monotonic() + APPLY_TIMEOUT_S
        while await rstore.webhook_backlog() or await rstore.webhook_inflight():
            assert time.monotonic() < deadline, "the webhook worker did not apply a round"
            await asyncio.sleep(0.01)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
