"""`github-broker sandbox` (simulated GitHub, broker and demo agents, offline) and `labels init`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from github_broker import sandbox_state
from github_broker.agent.client import BrokerClient, BrokerClientError
from github_broker.agent.runner import Runner, RunnerConfig, RunnerError, stop_on_signals
from github_broker.clock import age, now_ms
from github_broker.errors import BrokerError, ConfigError
from github_broker.explain import Verdict, explain_repo
from github_broker.models import Event
from github_broker.overview import RepoOverview, repo_overview
from github_broker.settings import DEFAULTS_DIR, ENV_PREFIX, Settings, load_settings
from github_broker.simulator import DEMO_SEED_PATH, Simulator
from github_broker.store import MEMORY_URL, RepoStore, Store

logger = logging.getLogger(__name__)

SANDBOX_OWNER, SANDBOX_NAME = "demo", "sandbox"
SANDBOX_REPO = f"{SANDBOX_OWNER}/{SANDBOX_NAME}"
DEFAULT_PORT = 8080
DEFAULT_AGENTS = 3
#: Seconds a demo agent "works" on each task.
DEFAULT_WORK_S = 2.0
#: Long-poll (seconds) of the demo agents; also how long Ctrl-C may wait for an idle one.
AGENT_WAIT_S = 5.0
#: Seconds a demo agent's task may run before the runner stops it.
AGENT_TIMEOUT_S = 60.0
#: Seconds between two looks at the simulated GitHub for the event log.
WATCH_INTERVAL_S = 0.25
#: Seconds the API may take to come up (first sync included in the lifespan).
START_TIMEOUT_S = 20.0
#: Seconds each runner thread gets to release its task and return on Ctrl-C.
AGENT_STOP_TIMEOUT_S = 30.0
#: Short intervals so a demo shows a whole task cycle in seconds (the defaults are minutes).
SANDBOX_OVERRIDES: dict[str, Any] = {
    "repositories": [SANDBOX_REPO],
    "poll": {
        "interval_s": 2,
        "outbox_interval_s": 0.5,
        "leader_ttl_s": 6,
        "full_sync_interval_s": 60,
    },
    "leases": {"lease_ttl_s": 120},
    "review": {"delay_s": 10, "timeout_s": 60},
}


class SandboxError(BrokerError):
    """The sandbox cannot start: port taken, API not up."""


def sandbox_settings(github_url: str, redis_url: str, port: int) -> Settings:
    """Settings of the offline sandbox; refuses environment overrides that would unmake that."""
    settings = load_settings(
        DEFAULTS_DIR,
        **SANDBOX_OVERRIDES,
        github={
            "base_url": github_url,
            "token": "sandbox",
            "seconds_between_writes": 0,
            "timeout_s": 5,
        },
        # A prefix of its own: a real Redis given with --redis-url may hold a real broker's keys.
        redis={"url": redis_url, "key_prefix": "gb-sandbox"},
        server={"host": "127.0.0.1", "port": port, "long_poll_recheck_s": 2},
    )
    offline = (
        settings.github.base_url == github_url
        and settings.redis.url == redis_url
        and [r.full_name for r in settings.repositories] == [SANDBOX_REPO]
        and not settings.server.resolved_agent_tokens()
        and settings.server.admin_token is None
    )
    if not offline:
        names = sorted(
            k for k in os.environ if k.startswith(ENV_PREFIX) and k != f"{ENV_PREFIX}CONFIG_DIR"
        )
        raise ConfigError(
            "the sandbox runs offline on its own settings, but environment variables override "
            f"them ({', '.join(names)}); unset them to run the sandbox"
        )
    return settings


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # As uvicorn binds: a port whose last server left it in TIME-WAIT is free to reuse.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ApiServer:
    """The broker's API (and poller) under uvicorn in a thread, so the main thread keeps signals."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        import uvicorn

        from github_broker.api.app import create_app

        config = uvicorn.Config(
            create_app(settings, config_dir=DEFAULTS_DIR),
            host=host,
            port=port,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            proxy_headers=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="sandbox-api", daemon=True)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SandboxError("the broker API did not start; its log lines above say why")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.ident is not None:  # never started when start-up failed before it
            self.thread.join(timeout=15)


@dataclass(frozen=True)
class Item:
    """One issue or pull request as the event log last saw it."""

    kind: str
    state: str
    labels: frozenset[str]
    title: str


class GitHubWatcher:
    """Logs what changes on the simulated GitHub: labels, new pull requests, closed issues."""

    def __init__(self, sim: Simulator, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.sim = sim
        self.interval_s = interval_s
        self.seen: dict[int, Item] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-watch", daemon=True)

    def start(self) -> None:
        self.seen = self.snapshot()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> dict[int, Item]:
        items: dict[int, Item] = {}
        page = 1
        while True:
            batch, total = self.sim.state.list_issues(
                SANDBOX_OWNER, SANDBOX_NAME, state="all", per_page=100, page=page
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

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            current = self.snapshot()
            for number, item in sorted(current.items()):
                self._report(number, self.seen.get(number), item)
            self.seen = current

    def _report(self, number: int, before: Item | None, item: Item) -> None:
        if before is None:
            if item.kind == "PR":
                pull = self.sim.state.get_pull(SANDBOX_OWNER, SANDBOX_NAME, number)
                first_line = (pull.get("body") or "").splitlines()[:1]
                logger.info(
                    "github: PR #%d opened: %s -> %s, %r",
                    number,
                    pull["head"]["ref"],
                    pull["base"]["ref"],
                    first_line[0] if first_line else "",
                )
            else:
                logger.info("github: issue #%d opened: %s", number, item.title)
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
}


def agent_event_line(event: Event) -> str:
    what = AGENT_EVENTS[event.kind]
    task = f" ({event.detail.split(':')[0]})" if event.kind == "claim" and event.detail else ""
    return f"broker: {event.agent} {what} {event.repository}#{event.issue}{task}"


def backlog_summary(repo: RepoOverview, done: dict[int, str], waiting: list[Verdict]) -> list[str]:
    """What is left once no task is ready and none is held: done, skipped and why, waiting."""
    out = [f"backlog of {repo.repository} ran out: nothing to hand out now"]
    if done:
        items = ", ".join(f"#{n} by {agent}" for n, agent in sorted(done.items()))
        out.append(f"  done ({len(done)}): {items}")
    out.append(f"  skipped ({repo.skipped_total}):")
    out += [f"    #{s.issue.number} {s.issue.title}: {s.reason}" for s in repo.skipped]
    reviews = {r.issue.number: r for r in repo.reviews}
    out.append(f"  waiting ({len(waiting)}):")
    for v in waiting:
        review = reviews.get(v.issue)
        if review is None:
            out.append(f"    #{v.issue}: {v.detail}")
            continue
        due = f", review due {age(review.due_ms, now_ms())}" if review.due_ms else ""
        out.append(f"    #{v.issue} {review.issue.title}: in review, {review.state}{due}")
    return out


class BrokerWatcher:
    """Logs what other agents do (from the broker's timeline) and, each time the backlog
    runs out, a summary of what is done, skipped and waiting."""

    def __init__(
        self, settings: Settings, demo_agents: list[str], interval_s: float = WATCH_INTERVAL_S
    ) -> None:
        self.settings = settings
        self.demo_agents = set(demo_agents)
        self.interval_s = interval_s
        self.done: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandbox-broker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.run(self._watch())

    async def _watch(self) -> None:
        store = Store.from_settings(self.settings)
        rstore = store.repo(SANDBOX_REPO)
        last, reported = "0-0", False
        try:
            while not self._stop.is_set():
                try:
                    for event in await rstore.timeline_since(last):
                        last = event.id
                        self._note(event)
                    idle = await self._idle(rstore)
                    if idle and not reported:
                        repo = await repo_overview(rstore, self.settings)
                        verdicts = await explain_repo(rstore, self.settings, None)
                        waiting = [v for v in verdicts if v.verdict == "waiting"]
                        for line in backlog_summary(repo, self.done, waiting):
                            logger.info("%s", line)
                    reported = idle
                except BrokerError as e:
                    logger.warning("broker state unreadable: %s", e)
                await asyncio.sleep(self.interval_s)
        finally:
            await store.close()

    def _note(self, event: Event) -> None:
        if event.kind == "completed" and event.issue is not None and event.detail == "development":
            self.done[event.issue] = event.agent
        if event.kind in AGENT_EVENTS and event.agent and event.agent not in self.demo_agents:
            logger.info("%s", agent_event_line(event))

    async def _idle(self, rstore: RepoStore) -> bool:
        return not await rstore.ready_tasks() and not await rstore.leases()


@contextlib.contextmanager
def event_log() -> Iterator[None]:
    """Print runner and watcher events as short timestamped lines; quiet the rest."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", datefmt="%H:%M:%S"))
    loud = [logging.getLogger(n) for n in ("github_broker.agent.runner", __name__)]
    quiet = [logging.getLogger(n) for n in ("github_broker", "uvicorn", "apscheduler")]
    saved = [(lg, lg.level, lg.propagate) for lg in loud + quiet]
    verbose = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    for lg in loud:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    if not verbose:  # broker internals only when asked for with --log-level DEBUG
        for lg in quiet:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level, propagate in saved:
            lg.setLevel(level)
            lg.propagate = propagate
        for lg in loud:
            lg.removeHandler(handler)


def banner(url: str, sim: Simulator, redis_url: str, agents: list[str], logs: Path) -> str:
    """What is running, and how to point your own agent at it."""
    open_issues = sim.state.list_issues(SANDBOX_OWNER, SANDBOX_NAME, per_page=1)[1]
    agent_line = ", ".join(agents) if agents else "none (--agents 0)"
    return f"""\
github-broker sandbox: everything runs in this process, offline, no GitHub token
  simulated GitHub  {sim.base_url}  ({SANDBOX_REPO}, {open_issues} open issues and PRs)
  dashboard         {url}/ui
  broker API        {url}  (OpenAPI: {url}/docs, queues: {url}/status)
  redis             {redis_url}
  demo agents       {agent_line}
  agent output      {logs} (kept after exit)

Point your own agent at it (start with --agents 0 to leave all the work to it):
  curl -s -X POST {url}/request-task -H 'Content-Type: application/json' \\
       -d '{{"agent_id": "my-agent", "wait_seconds": 30}}'

  from github_broker.agent.client import BrokerClient, BrokerClientError
  client = BrokerClient("{url}", "my-agent")
  task = client.request_task(wait_seconds=30)  # None when there is no task
  if task:
      print(task.branch_name, task.prompt)
      client.complete(task)

  github-broker agent --broker-url {url} --agent-id my-agent -- your-agent-command

Look at it from another terminal: github-broker status, github-broker explain

--- event log (Ctrl-C stops the sandbox) ---"""


def _replying_errors() -> type[Any]:
    """fakeredis's TCP handler, except that an error reply (NOSCRIPT, a script's error) is sent
    and the connection kept: its own closes the connection after any error, and the store's
    pipelined client answers NOSCRIPT by loading the script on that same connection."""
    import redis
    from fakeredis._clients._tcp_server import TCPFakeRequestHandler  # no public name

    class Handler(TCPFakeRequestHandler):
        def setup(self) -> None:
            super().setup()
            read = self.current_client.read_response

            def read_response(*args: Any, **kwargs: Any) -> Any:
                try:
                    return read(*args, **kwargs)
                except redis.exceptions.ResponseError as e:
                    return e  # written as an error reply, like Redis does

            self.current_client.read_response = read_response  # type: ignore[method-assign]

    return Handler


class SharedStore:
    """The sandbox's in-process store (memory://) served on a loopback port, so that
    `github-broker status` and `explain` in another terminal read the same data."""

    def __init__(self) -> None:
        from fakeredis import TcpFakeServer

        from github_broker.store.connection import memory_server

        self.server = TcpFakeServer(("127.0.0.1", 0))
        self.server.fake_server = memory_server()
        self.server.RequestHandlerClass = _replying_errors()
        self.server.daemon_threads = True  # a reader left connected must not hold the exit
        self.url = f"redis://127.0.0.1:{self.server.server_address[1]}/0"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.2,), name="sandbox-redis", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.ident is not None:
            self.server.shutdown()
        self.server.server_close()


class Sandbox:
    """The simulator, the broker API with its poller, the event log and the demo agents."""

    def __init__(self, port: int, redis_url: str, agents: int, work_s: float) -> None:
        self.port = port
        self.redis_url = redis_url
        self.url = f"http://127.0.0.1:{port}"
        self.agent_ids = [f"demo-agent-{i}" for i in range(1, agents + 1)]
        self.work_s = work_s
        self.stop = threading.Event()
        self.sim = Simulator(DEMO_SEED_PATH)
        self.logs = Path(tempfile.mkdtemp(prefix="gb-sandbox-"))
        self.api: ApiServer | None = None
        self.watcher = GitHubWatcher(self.sim)
        self.broker_watcher: BrokerWatcher | None = None
        self.shared: SharedStore | None = None
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.sim.start()
        settings = sandbox_settings(self.sim.base_url, self.redis_url, self.port)
        self.api = ApiServer(settings, "127.0.0.1", self.port)
        self.api.start()
        self.watcher.start()
        self.broker_watcher = BrokerWatcher(settings, self.agent_ids)
        self.broker_watcher.start()
        redis_url = self.redis_url
        if redis_url.startswith(MEMORY_URL):
            self.shared = SharedStore()
            self.shared.start()
            redis_url = self.shared.url
        sandbox_state.write(
            sandbox_state.RunningSandbox(
                os.getpid(), self.url, self.sim.base_url, redis_url, self.port
            )
        )
        print(banner(self.url, self.sim, self.redis_url, self.agent_ids, self.logs), flush=True)
        for agent_id in self.agent_ids:
            thread = threading.Thread(
                target=self._agent, args=(agent_id,), name=agent_id, daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def _agent(self, agent_id: str) -> None:
        command = [
            sys.executable,
            "-m",
            "github_broker.agent.demo",
            "--github-url",
            self.sim.base_url,
            "--seconds",
            str(self.work_s),
        ]
        config = RunnerConfig(
            command=command,
            workdir=self.logs,
            timeout_s=AGENT_TIMEOUT_S,
            wait_s=AGENT_WAIT_S,
            kill_grace_s=5,
            output_dir=self.logs,
        )
        with BrokerClient(self.url, agent_id) as client:
            try:
                Runner(client, config, self.stop).run()
            except (RunnerError, BrokerClientError) as e:  # the other agents carry on
                logger.error("%s stopped: %s", agent_id, e)

    def run(self) -> None:
        """Start, run until stopped, close (also when starting fails half-way)."""
        try:
            self.start()
            self.wait()
            logger.info("stopping: demo agents release their tasks")
        finally:
            self.close()

    def wait(self) -> None:
        """Until Ctrl-C (or SIGTERM), or the API thread dies."""
        api = self.api
        while not self.stop.wait(0.5):
            if api is not None and not api.thread.is_alive():
                logger.error("the broker API stopped; shutting the sandbox down")
                self.stop.set()

    def close(self) -> None:
        """Agents release their tasks first, while the API still answers; then the rest."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=AGENT_STOP_TIMEOUT_S)
        if self.api is not None:
            self.api.stop()
        self.watcher.stop()
        if self.broker_watcher is not None:
            self.broker_watcher.stop()
        sandbox_state.remove(os.getpid())
        if self.shared is not None:
            self.shared.stop()
        self.sim.stop()


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Simulated GitHub, broker and demo agents in one offline process."""
    if not port_free("127.0.0.1", args.port):
        raise SandboxError(f"port {args.port} on 127.0.0.1 is in use; pick another with --port")
    with event_log():
        sandbox = Sandbox(args.port, args.redis_url, args.agents, args.work_seconds)
        with stop_on_signals(sandbox.stop):
            sandbox.run()
    print("sandbox stopped", flush=True)
    return 0


def add_sandbox_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `sandbox` on a parser's subcommands."""
    p = subparsers.add_parser(
        "sandbox",
        help="try the broker offline: simulated GitHub, broker and demo agents",
        description="Start a simulated GitHub seeded with a demo backlog, the broker API and "
        "its poller, and demo agents that open PRs; all in one offline process.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port (default %(default)s)")
    p.add_argument(
        "--redis-url", default="memory://", help="Redis to use (default: in-process memory://)"
    )
    p.add_argument(
        "--agents",
        type=int,
        default=DEFAULT_AGENTS,
        choices=range(0, 11),
        metavar="N",
        help="demo agents to run, 0-10 (default %(default)s)",
    )
    p.add_argument(
        "--work-seconds",
        type=float,
        default=DEFAULT_WORK_S,
        metavar="SECONDS",
        help="how long a demo agent works on a task (default %(default)s)",
    )
    p.set_defaults(func=cmd_sandbox)
    return p


# --- labels init --------------------------------------------------------------------------

#: Colours (hex, no #) and descriptions of the labels `labels init` creates.
PRIORITY_LABELS = [
    ("P0", "b60205", "Priority 0: most urgent"),
    ("P1", "d93f0b", "Priority 1"),
    ("P2", "fbca04", "Priority 2"),
    ("P3", "0e8a16", "Priority 3"),
    ("P4", "c2e0c6", "Priority 4: least urgent"),
]
ROLE_COLOR = "1d76db"
#: GitHub refuses label descriptions longer than this.
MAX_LABEL_DESCRIPTION = 100


def label_set(settings: Settings) -> list[tuple[str, str, str]]:
    """(name, colour, description) of every label the broker reads or writes."""
    pattern = re.compile(settings.labels.priority_pattern)
    if not all(pattern.match(name) for name, _, _ in PRIORITY_LABELS):
        raise ConfigError(
            f"labels.priority_pattern {settings.labels.priority_pattern!r} does not accept "
            "P0-P4, the priority labels `labels init` creates; create yours by hand"
        )
    names = settings.labels
    broker = [
        (names.in_progress, "0052cc", "An agent holds this issue (written by github-broker)"),
        (names.needs_review, "5319e7", "The work is done and a PR is open"),
        (names.review_done, "c2e0c6", "The reviewing window of this PR is over"),
        (names.needs_human, "d73a4a", "github-broker gave up on it: a person must look"),
        (names.story, "c5def5", "Groups issues; never handed out"),
        (names.epic, "3e4b9e", "Groups stories; never handed out"),
    ]
    roles = [
        (a.role, ROLE_COLOR, a.description or f"Work for a {a.role} agent") for a in settings.agents
    ]
    return [(n, c, d[:MAX_LABEL_DESCRIPTION]) for n, c, d in PRIORITY_LABELS + roles + broker]


def cmd_labels_init(args: argparse.Namespace) -> int:
    """Create the broker's labels on GitHub (idempotent)."""
    from github_broker.gateway import GitHubGateway

    settings = load_settings(getattr(args, "config", None))
    repos = [args.repo] if args.repo else [r.full_name for r in settings.repositories]
    if not repos:
        raise ConfigError(
            "no repository: pass --repo owner/name or set `repositories` "
            "in broker.yaml (or GITHUB_BROKER_REPOSITORIES)"
        )
    labels = label_set(settings)
    gateway = GitHubGateway(settings.github)
    try:
        for repo in repos:
            # One listing, then only the missing labels: creating is a paced write (~1 s).
            existing = {name.lower() for name in gateway.label_names(repo)}
            created = 0
            for name, color, description in labels:
                made = name.lower() not in existing and gateway.ensure_label(
                    repo, name, color, description
                )
                created += made
                print(f"{'created' if made else 'exists ':<8} {repo}  {name}")
            print(f"{repo}: {created} created, {len(labels) - created} already there")
    finally:
        gateway.close()
    return 0


def _repo_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not of the form owner/name")
    return value


def add_labels_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `labels init` on a parser's subcommands."""
    p = subparsers.add_parser("labels", help="manage the labels the broker uses on GitHub")
    sub = p.add_subparsers(dest="labels_command", required=True)
    init = sub.add_parser(
        "init",
        help="create priorities P0-P4, the roles of agents.yml and the broker's labels",
        description="Create the label set (priorities P0-P4, roles from agents.yml, "
        "in-progress, needs-review, review-done, needs-human, story, epic). "
        "Labels that exist are left as they are.",
    )
    init.add_argument(
        "--repo",
        type=_repo_name,
        metavar="OWNER/NAME",
        help="only this repository (default: every configured one)",
    )
    init.set_defaults(func=cmd_labels_init)
    return p


def main(argv: list[str] | None = None) -> int:
    """`python -m github_broker.sandbox sandbox|labels ...` without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m github_broker.sandbox")
    parser.add_argument("--config", type=Path, default=None, help="config directory")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_sandbox_command(sub)
    add_labels_command(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except BrokerError as e:
        print(f"github-broker: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
