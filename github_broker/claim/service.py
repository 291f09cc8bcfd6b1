"""Use cases of agents: request a task, heartbeat, complete, release."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from github_broker.claim.events import ReadyWaker
from github_broker.claim.handout import Handout
from github_broker.claim.prompts import Prompts
from github_broker.claim.rules import Rules
from github_broker.claim.walk import Attempt, ClaimWalk
from github_broker.errors import InvalidRequest, LeaseError, NotFound, StoreUnavailable
from github_broker.logs import log_fields
from github_broker.models import Beat, Outcome, Task
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: Seconds a repository's default branch is cached in a serve process.
BASE_BRANCH_CACHE_S = 60.0
#: Fallback base branch before the first sync has looked it up.
FALLBACK_BASE_BRANCH = "main"
#: Agent ids remembered as checked against the labels before the memory starts again.
KNOWN_AGENTS_MAX = 10_000


def refusal_message(repository: str, number: int, what: str, refusal: str) -> str:
    text = f"lease on {repository}#{number} {what}: {refusal}"
    if refusal == "not_leased":
        text += " (this agent holds no lease on it: ask for a task first)"
    detail = getattr(refusal, "detail", "")
    return text + (f" ({detail})" if detail else "")


class TaskService:
    """Hands out tasks by the assignment rules; all state lives in Redis."""

    def __init__(
        self, settings: Settings, store: Store, prompts: Prompts, waker: ReadyWaker
    ) -> None:
        self.settings = settings
        self.store = store
        self.prompts = prompts
        self.waker = waker
        self.handout = Handout(settings, prompts)
        self.walk = ClaimWalk(settings, store, waker, self.base_branch)
        #: repository -> its configured base branch ("" or absent: the default branch).
        self._configured_base = {r.full_name: r.base_branch for r in settings.repositories}
        self._base_branches: dict[str, tuple[str, float]] = {}
        self._base_branch_locks: dict[str, asyncio.Lock] = {}
        self.rules = Rules(settings)
        #: Agent ids already checked against the labels (see _check_agent).
        self._agents_ok: set[str] = set()

    # --- request-task -------------------------------------------------------------------

    async def request_task(
        self,
        agent_id: str,
        *,
        roles: list[str] | None = None,
        repositories: list[str] | None = None,
        wait_s: float = 0,
        previous: Outcome = Outcome.COMPLETED,
        request_id: str | None = None,
    ) -> Task | None:
        """The next task for `agent_id`, or None after `wait_s` seconds without one.
        A repeated `request_id` gets the task already handed out for it."""
        asked = self._asked(repositories)
        roles = self.check_roles(roles)
        self._check_agent(agent_id)
        with contextlib.suppress(StoreUnavailable):
            await self.store.note_seen(agent_id)
        deadline = time.monotonic() + wait_s
        attempt = Attempt(previous.value, request_id)
        while True:
            claimed = await self.walk.claim(asked, agent_id, roles, attempt)
            if claimed is not None:
                base = await self.base_branch(self.store.repo(claimed.repository))
                return self.handout.task(claimed, base)
            remaining = deadline - time.monotonic()
            if attempt.replayed:
                return None
            if remaining <= 0 or self.waker.closing:
                return None
            await self.waker.wait(remaining)

    @property
    def heartbeat_interval_s(self) -> int:
        return self.handout.heartbeat_interval_s

    async def base_branch(self, rstore: RepoStore) -> str:
        name = rstore.repository
        configured = self._configured_base.get(name)
        if configured:
            return configured
        cached = self._base_branches.get(name)
        if cached and cached[1] > time.monotonic():
            return cached[0]
        lock = self._base_branch_locks.setdefault(name, asyncio.Lock())
        if cached and lock.locked():
            return cached[0]  # another request is refreshing it; a minute-old value is fine
        async with lock:
            cached = self._base_branches.get(name)
            if cached and cached[1] > time.monotonic():
                return cached[0]
            branch = await rstore.default_branch() or FALLBACK_BASE_BRANCH
            self._base_branches[name] = (branch, time.monotonic() + BASE_BRANCH_CACHE_S)
            return branch

    # --- lease operations ---------------------------------------------------------------

    async def heartbeat(
        self,
        repository: str,
        number: int,
        agent_id: str,
        token: str,
        *,
        note: str = "",
        tokens: int | None = None,
        cost: float | None = None,
    ) -> Beat:
        """Extend the lease, record what the agent reports; returns what it must know now
        (new expiry, state, maintainers' notes, a pause)."""
        self._check_agent(agent_id)
        rstore = self._repo(repository)
        if len(self.store.repos) > 1:
            # The agent says it holds a task here: keep this repository among those its next
            # request settles in (`agent_repos` forgets what was not pointed at for its keep
            # time, which a long task, or a lease rebuilt after Redis lost it, outlives).
            # Before the beat, as a claim points before it claims: a pointer too many costs
            # one settling script, one too few a second live lease.
            keep_ms = self.settings.leases.agent_task_ttl_s * 1000
            await self.store.note_agent_repos(agent_id, [repository], keep_ms)
        _, got = await rstore.heartbeat(
            number, agent_id, token, note=note, tokens=tokens, cost=cost
        )
        if not isinstance(got, Beat):
            raise LeaseError(got, refusal_message(repository, number, "not extended", got))
        return got

    async def finish(
        self,
        repository: str,
        number: int,
        agent_id: str,
        token: str,
        outcome: Outcome,
        *,
        counted: bool = True,
    ) -> None:
        """End a lease; `counted=False` when a failure is not the agent's (it never got the
        task), so it spends no failure budget."""
        self._check_agent(agent_id)
        ok, value = await self._repo(repository).finish(
            number, agent_id, token, outcome.value, counted=counted
        )
        if not ok:
            raise LeaseError(
                value, refusal_message(repository, number, f"not {outcome.value}", value)
            )
        # A completion is routine, one per task like a claim (DEBUG); a failure or an
        # abandoned task is what an operator looks for (INFO).
        logger.log(
            logging.DEBUG if outcome == Outcome.COMPLETED else logging.INFO,
            "%s %s#%d by %s",
            outcome.value,
            repository,
            number,
            agent_id,
            extra=log_fields(repository, number, agent_id),
        )

    # --- validation ---------------------------------------------------------------------

    def repo(self, repository: str) -> RepoStore:
        return self._repo(repository)

    def _repo(self, repository: str) -> RepoStore:
        if repository not in self.store.repos:
            raise NotFound(f"repository {repository!r} is not served by this broker")
        return self.store.repo(repository)

    def _asked(self, repositories: list[str] | None) -> list[str] | None:
        """The repositories a request asked for, checked (None: every one served)."""
        if not repositories:
            return None
        unknown = [r for r in repositories if r not in self.store.repos]
        if unknown:
            served = ", ".join(self.store.repos) or "(none)"
            raise InvalidRequest(f"unknown repositories {unknown}; this broker serves: {served}")
        return list(dict.fromkeys(repositories))

    def _check_agent(self, agent_id: str) -> None:
        # The agent id becomes a label that is removed again when the lease ends, and GitHub
        # compares label names case-insensitively. Ids that passed are remembered (bounded).
        if agent_id in self._agents_ok:
            return
        clash = self.settings.label_clash(agent_id)
        if clash is not None:
            raise InvalidRequest(
                f"agent id {agent_id!r} equals the label {clash} when compared "
                "case-insensitively, as GitHub compares labels; pick another id"
            )
        if len(self._agents_ok) >= KNOWN_AGENTS_MAX:
            self._agents_ok.clear()
        self._agents_ok.add(agent_id)

    def check_roles(self, roles: list[str] | None) -> list[str] | None:
        """The roles deduplicated (so at most the configured ones), or refused: every request
        naming roles (`POST /request-task`, `GET /explain?roles=`) before any Redis work."""
        if not roles:
            return None
        unknown = [r for r in roles if r not in self.settings.roles]
        if unknown:
            raise InvalidRequest(
                f"unknown roles {unknown[:10]}; roles from agents.yml: "
                f"{', '.join(self.settings.roles)}"
            )
        return list(dict.fromkeys(roles))
