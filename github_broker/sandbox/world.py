"""The sandbox's world: a simulated GitHub with the demo backlog, the broker (API, poller,
store) on offline settings, the demo agents, the simulated maintainer and the event log."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from github_broker.agent.client import BrokerClient, BrokerClientError
from github_broker.agent.runner import Runner, RunnerConfig, RunnerError
from github_broker.errors import ConfigError
from github_broker.sandbox import state as sandbox_state
from github_broker.sandbox.maintainer import Maintainer
from github_broker.sandbox.servers import START_TIMEOUT_S, ApiServer, SandboxError, SharedStore
from github_broker.sandbox.watch import BrokerWatcher, GitHubWatcher
from github_broker.settings import DEFAULTS_DIR, ENV_PREFIX, Settings, load_settings
from github_broker.simulator import DEMO_SEED_PATH, Simulator
from github_broker.store import MEMORY_URL, Store

logger = logging.getLogger(__name__)

SANDBOX_OWNER, SANDBOX_NAME = "demo", "sandbox"
SANDBOX_REPO = f"{SANDBOX_OWNER}/{SANDBOX_NAME}"
#: Long-poll (seconds) of the demo agents; also how long Ctrl-C may wait for an idle one.
AGENT_WAIT_S = 5.0
#: Seconds a demo agent's task may run before the runner stops it.
AGENT_TIMEOUT_S = 60.0
#: Seconds between two looks at whether the first sync has built the mirror.
MIRROR_POLL_S = 0.05
#: Seconds each runner thread gets to release its task and return on Ctrl-C.
AGENT_STOP_TIMEOUT_S = 30.0
#: Short intervals so a demo shows a whole task cycle in seconds (the defaults are minutes);
#: an environment variable (GITHUB_BROKER_REVIEW__DELAY_S=1) makes one shorter still.
SANDBOX_OVERRIDES: dict[str, Any] = {
    "repositories": [SANDBOX_REPO],
    "poll": {
        "interval_s": 2,
        "outbox_interval_s": 0.5,
        "leader_ttl_s": 6,
        "full_sync_interval_s": 60,
    },
    "leases": {"lease_ttl_s": 120},
    # An agent alone in the sandbox gets the review of its own work 10 s after it is offered.
    "review": {"delay_s": 10, "timeout_s": 60, "author_fallback_s": 10, "fix_debounce_s": 3},
    # A task completed without a PR comes back in 30 s, and its agent may retry it a minute on.
    "progress": {"no_pr_grace_s": 30, "branch_check_interval_s": 5},
    "failures": {"cooldown_s": 60},
    # A fix of a failing check goes to the PR's author alone for 10 s; pending checks are
    # flagged after two minutes.
    "checks": {"author_first_s": 10, "pending_stale_s": 120},
}
#: On every Nth issue the demo agents' development push makes the fake CI fail (red -> fix
#: task -> green); 0: never.
RED_EVERY = 3


@dataclass(frozen=True)
class Options:
    """What `github-broker sandbox` was asked for."""

    port: int
    redis_url: str = "memory://"
    agents: int = 3
    #: Seconds a demo agent "works" on each task.
    work_s: float = 2.0
    #: The simulated maintainer merges reviewed PRs; off, the event log says what to do.
    maintainer: bool = True
    #: The maintainer asks for changes once on every Nth reviewed PR (0: never).
    changes_every: int = 3
    #: On every Nth issue the development push makes CI fail (0: never).
    red_every: int = RED_EVERY


def _short_intervals() -> dict[str, Any]:
    """SANDBOX_OVERRIDES less the intervals the environment sets (those win; what keeps the
    sandbox offline is not in here, and sandbox_settings refuses an environment changing it)."""
    env = {k.upper() for k in os.environ}
    out: dict[str, Any] = {}
    for section, values in SANDBOX_OVERRIDES.items():
        if not isinstance(values, dict):
            out[section] = values
            continue
        prefix = f"{ENV_PREFIX}{section}__".upper()
        out[section] = {k: v for k, v in values.items() if prefix + k.upper() not in env}
    return out


def sandbox_settings(github_url: str, redis_url: str, port: int) -> Settings:
    """Settings of the offline sandbox; refuses environment overrides that would unmake that."""
    intervals = _short_intervals()
    # Signed lease tokens, as a real deployment's: a key for this run only.
    leases = {**intervals.pop("leases", {}), "signing_keys": {"sandbox": secrets.token_hex(16)}}
    settings = load_settings(
        DEFAULTS_DIR,
        **intervals,
        leases=leases,
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


def person_hints(api_url: str, github_url: str) -> list[str]:
    """How a person does, on this sandbox, what the summary asks of one."""
    pulls = f"{github_url}/repos/{SANDBOX_REPO}/pulls"
    fix = (
        f'{{"repository": "{SANDBOX_REPO}", "issue": N, "pr": PR, '
        '"comments": [{"author": "me", "body": "what to change"}]}'
    )
    return [
        "  what a person does here (the maintainer is off: --no-maintainer):",
        f"    merge:            curl -s -X PUT {pulls}/PR/merge -H 'Authorization: token me'",
        f"    ask for changes:  curl -s -X POST {api_url}/tasks/fix "
        f"-H 'Content-Type: application/json' -d '{fix}'",
        "                      (a comment through this simulated GitHub comes from the "
        "broker's own login, which never counts as feedback)",
        f"    retry:            curl -s -X POST {api_url}/admin/tasks/{SANDBOX_REPO}/N/retry",
    ]


def wait_for_mirror(settings: Settings, repository: str, api: ApiServer) -> None:
    """Until the poller's first sync pass has built the mirror of `repository` (SandboxError
    after START_TIMEOUT_S, or when the API thread died)."""

    async def built() -> None:
        store = Store.from_settings(settings)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while not await store.repo(repository).mirror_rebuilt():
                if time.monotonic() > deadline or not api.thread.is_alive():
                    raise SandboxError(
                        "the broker's first sync of the demo backlog did not finish; its log "
                        "lines above say why"
                    )
                await asyncio.sleep(MIRROR_POLL_S)
        finally:
            await store.close()

    asyncio.run(built())


class Sandbox:
    """The simulator, the broker API with its poller, the event log, the demo agents and the
    simulated maintainer."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.url = f"http://127.0.0.1:{options.port}"
        self.agent_ids = [f"demo-agent-{i}" for i in range(1, options.agents + 1)]
        self.stop = threading.Event()
        self.sim = Simulator(DEMO_SEED_PATH)
        self.logs = Path(tempfile.mkdtemp(prefix="gb-sandbox-"))
        self.settings: Settings | None = None
        self.api: ApiServer | None = None
        self.shared: SharedStore | None = None
        self.loops: list[GitHubWatcher | BrokerWatcher | Maintainer] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        """Everything but the demo agents (start_agents)."""
        self.sim.start()
        settings = sandbox_settings(self.sim.base_url, self.options.redis_url, self.options.port)
        self.settings = settings
        self.api = ApiServer(settings, "127.0.0.1", self.options.port)
        self.api.start()
        # Until the poller's first pass has built the mirror, every request-task answers 503:
        # nobody (the demo agents, the user's own) is told where the API is before that.
        wait_for_mirror(settings, SANDBOX_REPO, self.api)
        hints = [] if self.options.maintainer else person_hints(self.url, self.sim.base_url)
        self.loops = [
            GitHubWatcher(self.sim, SANDBOX_REPO),
            BrokerWatcher(settings, SANDBOX_REPO, self.agent_ids, hints, self.options.maintainer),
            Maintainer(
                self.sim,
                settings,
                SANDBOX_REPO,
                acting=self.options.maintainer,
                changes_every=self.options.changes_every,
            ),
        ]
        for loop in self.loops:
            loop.start()
        self._share_store()
        self._wait_mirrored(settings)

    def _wait_mirrored(self, settings: Settings, timeout_s: float = 60.0) -> None:
        """Until the first sync has mirrored the demo backlog (and read its links): a request
        before that would be answered 503 (the mirror is rebuilding)."""

        async def mirrored() -> None:
            store = Store.from_settings(settings)
            try:
                deadline = time.monotonic() + timeout_s
                while not await store.repo(SANDBOX_REPO).mirror_rebuilt():
                    if time.monotonic() > deadline:
                        raise SandboxError("the first sync did not finish; the log says why")
                    await asyncio.sleep(0.05)
            finally:
                await store.close()

        asyncio.run(mirrored())

    def start_agents(self) -> None:
        for agent_id in self.agent_ids:
            thread = threading.Thread(
                target=self._agent, args=(agent_id,), name=agent_id, daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def _share_store(self) -> None:
        redis_url = self.options.redis_url
        if redis_url.startswith(MEMORY_URL):
            self.shared = SharedStore()
            self.shared.start()
            redis_url = self.shared.url
        sandbox_state.write(
            sandbox_state.RunningSandbox(
                os.getpid(), self.url, self.sim.base_url, redis_url, self.options.port
            )
        )

    def _agent(self, agent_id: str) -> None:
        command = [
            sys.executable,
            "-m",
            "github_broker.agent.demo",
            "--github-url",
            self.sim.base_url,
            "--seconds",
            str(self.options.work_s),
            "--red-every",
            str(self.options.red_every),
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
        for loop in self.loops:
            loop.stop()
        if self.api is not None:
            self.api.stop()
        sandbox_state.remove(os.getpid())
        if self.shared is not None:
            self.shared.stop()
        self.sim.stop()
