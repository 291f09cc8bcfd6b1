"""The claim's walk: which repositories one request claims in, in which order, and how.

With one repository a request is one claim script. With several it settles the agent's held
task where it may hold one (its own key, `agent_repos`), then claims in the repositories the
index says have work for its roles (repo_index.py), in `claim_order`, under the agent's mutex
(each repository's claim is atomic on its own). `judge` is the same walk, read-only, for
`explain`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from github_broker.claim.events import ReadyWaker
from github_broker.claim.share import FairShare
from github_broker.clock import now_ms
from github_broker.errors import AgentPaused, MirrorRebuilding
from github_broker.logs import log_fields
from github_broker.models import Claimed, Judgement, NoTask, Outcome
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: Where a repository with nothing to say comes in the claim order.
LAST = (1, 1 << 30)
#: Most repositories one request claims in (in the claim's order), when several have work
#: for the agent's roles; the mutex that serialises an agent's requests is held for as many.
MAX_CLAIM_REPOS = 16
#: Repositories not mirrored yet whose sync failure a request with no task looks up.
MAX_FAILING_LOOKUPS = 10


def claim_order(settled: NoTask) -> tuple[int, int]:
    """Where a repository comes in a multi-repository claim, from its settle pass: a task a
    maintainer reassigned to the agent there first, then by the most urgent bucket; those
    tied take turns (`share.FairShare`), then go by the configured order."""
    bucket = settled.bucket if settled.bucket is not None else 1 << 30
    return (0 if settled.detail == "1" else 1, bucket)


#: The agent id explain judges for when none is given: a fresh agent (no id matches it).
FRESH_AGENT = " "


async def judge(
    stores: list[RepoStore],
    settings: Settings,
    agent_id: str | None,
    roles: list[str] | None,
    shown: int,
    share: FairShare | None = None,
) -> list[Judgement]:
    """What a request-task of `agent_id` (None: a fresh agent) would decide in each of
    `stores`, in the order the claim tries them; the first with a `next_id` hands it out.
    `share`: the serving process's turns (None: ties go by the configured order)."""
    agent = agent_id or FRESH_AGENT
    results: list[Any] = await asyncio.gather(
        *(s.judge(agent, mode=settings.priority_mode, roles=roles, shown=shown) for s in stores),
        return_exceptions=True,
    )
    out: list[Judgement] = []
    for s, result in zip(stores, results, strict=True):
        if isinstance(result, MirrorRebuilding) and len(stores) > 1:
            reason = await s.sync_failing()
            if reason is not None:
                out.append(Judgement(repository=s.repository, agent=agent, out_of_service=reason))
                continue
        if isinstance(result, BaseException):
            raise result
        out.append(result)
    if len(stores) > 1:
        _in_claim_order(out, settings, share)
    return out


def _in_claim_order(out: list[Judgement], settings: Settings, share: FairShare | None) -> None:
    """Sort judgements as the claim tries their repositories; each names its fair share
    among the repositories with work tied with it."""
    position = {r.full_name: i for i, r in enumerate(settings.repositories)}
    turns = share or FairShare({r.full_name: r.weight for r in settings.repositories})
    order = {j.repository: LAST if j.out_of_service else claim_order(_as_settled(j)) for j in out}
    out.sort(
        key=lambda j: (order[j.repository], turns.key(j.repository), position.get(j.repository, 0))
    )
    tied: dict[tuple[int, int], list[str]] = {}
    for j in out:
        if j.next_id:
            tied.setdefault(order[j.repository], []).append(j.repository)
    for j in out:
        peers = tied.get(order[j.repository], [])
        if j.repository in peers:
            j.share = turns.words(j.repository, peers, j.bucket)


def _as_settled(j: Judgement) -> NoTask:
    return NoTask(reason="settled", bucket=j.bucket, detail="1" if j.reserved else "")


def scoped(detail: str) -> bool:
    """Whether a pause (its record as JSON) covers some repositories only (`scope: repo`)."""
    try:
        return bool(json.loads(detail).get("scope") == "repo")
    except (ValueError, AttributeError):
        return False


def agent_paused(agent_id: str, detail: str) -> AgentPaused:
    """The refusal a paused agent's request-task gets: who paused it, why, how to resume."""
    try:
        pause = json.loads(detail)
    except ValueError:
        pause = {}
    who = "the circuit breaker" if pause.get("kind") == "breaker" else pause.get("by", "?")
    why = f": {pause['reason']}" if pause.get("reason") else ""
    return AgentPaused(
        f"agent {agent_id} is paused by {who}{why}. A maintainer resumes it with "
        f"`github-broker resume {agent_id}` or POST /admin/agents/{agent_id}/resume"
    )


class Attempt:
    """What one request-task carries from one claim attempt to the next (long-poll)."""

    def __init__(self, previous: str, request_id: str | None) -> None:
        self.previous = previous
        self.request_id = request_id
        #: The request id's earlier hand-out has ended: answer "no task", settle nothing.
        self.replayed = False
        #: repository -> the issue the agent just gave up; not handed back to it in this request
        self.skip: dict[str, int] = {}
        #: A repeated request id's answer found by `ClaimWalk._replayed_elsewhere`.
        self.granted: Claimed | None = None
        #: While the agent's mutex is held: Redis time (ms) after which no script of this
        #: attempt may run (`MutexHold.fence_ms`); None with one repository.
        self.fence_ms: int | None = None
        #: The repository whose claim handed this attempt a task (not a replay's answer).
        self.handed_in: str | None = None
        #: The repository this attempt took its fair-share turn for (share.py), if any.
        self.turn: str | None = None

    def note(self, repository: str, result: NoTask) -> None:
        if result.reason == "replayed":
            self.replayed = True
        if result.settled_issue is not None:
            if result.settled_outcome != Outcome.COMPLETED:
                self.skip[repository] = result.settled_issue
            # The held task is settled once; later attempts must not touch the next one.
            self.previous = Outcome.COMPLETED.value


@dataclass
class _Settled:
    """What the settle pass of a request across repositories learnt."""

    #: Repositories out of service (their sync keeps failing) -> why.
    out: dict[str, str]
    #: Repository -> where it comes in the claim order (`claim_order`).
    order: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Repositories where a task a maintainer reassigned to the agent waits for it.
    waits: set[str] = field(default_factory=set)


class ClaimWalk:
    """Claims for one request, across the repositories it may claim in."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        waker: ReadyWaker,
        base_branch: Callable[[RepoStore], Awaitable[str]],
    ) -> None:
        self.settings = settings
        self.store = store
        self.waker = waker
        #: The branch a repository's new work starts from (TaskService.base_branch).
        self.base_branch = base_branch
        #: This process's turns of repositories tied in claim order.
        self.share = FairShare({r.full_name: r.weight for r in settings.repositories})

    async def claim(
        self,
        asked: list[str] | None,
        agent_id: str,
        roles: list[str] | None,
        attempt: Attempt,
    ) -> Claimed | None:
        """Claim for one request in the repositories `asked` (None: every one served)."""
        if len(self.store.repos) == 1:
            only = list(self.store.repos.values())
            return await self._claim_each(only, agent_id, roles, attempt, pointed=set())
        # Several repositories: settling and claiming span one script per repository, so two
        # concurrent requests of one agent could each claim in a different one. Serialise
        # them; the mutex's round trip also reads where the agent may hold a task and points
        # at the repository the index puts first.
        tries = await self._tries(asked, roles, _Settled(out={}))
        # The turn is taken now, before any await: concurrent requests start elsewhere.
        self._take_turn(attempt, tries)
        try:
            return await self._claim_across(asked, agent_id, roles, attempt, tries)
        finally:
            self.share.moved(attempt.turn, attempt.handed_in)
            attempt.turn = None

    def _take_turn(self, attempt: Attempt, tries: list[str]) -> None:
        """The request's turn moves to the first repository of `tries` (none: none)."""
        if attempt.turn is not None:
            self.share.give_back(attempt.turn)
        attempt.turn = tries[0] if tries else None
        if attempt.turn is not None:
            self.share.take(attempt.turn)

    async def _claim_across(
        self,
        asked: list[str] | None,
        agent_id: str,
        roles: list[str] | None,
        attempt: Attempt,
        tries: list[str],
    ) -> Claimed | None:
        """A claim across repositories under the agent's mutex, starting with `tries`."""
        keep_ms = self.settings.leases.agent_task_ttl_s * 1000
        first = tries[0] if tries else None
        async with self.store.agent_mutex(
            agent_id,
            repos=MAX_CLAIM_REPOS,
            keep_ms=keep_ms,
            first=first,
            lookups=MAX_FAILING_LOOKUPS,
        ) as hold:
            attempt.fence_ms, pointed = hold.fence_ms, hold.pointed
            noted = {first} if first is not None else set()
            out: dict[str, str] = {}
            if not set(pointed) <= noted:
                # The agent may hold a task elsewhere than where it claims first: settle it
                # there first. Otherwise (the fast path) that first claim settles it, as with
                # one repository.
                settled = await self._settle_elsewhere(pointed, agent_id, roles, attempt)
                if not isinstance(settled, _Settled):
                    return settled  # the hand-out this request already got, or a replay's
                out = settled.out
                # Ordered again without this request's own turn, which then goes to the new first.
                self._take_turn(attempt, [])
                tries = [] if attempt.replayed else await self._tries(asked, roles, settled)
                self._take_turn(attempt, tries)
            got = await self._claim_each(
                [self.store.repo(n) for n in tries],
                agent_id,
                roles,
                attempt,
                pointed=set(pointed),
                noted=noted,
            )
            if got is None and not attempt.replayed:
                await self._unless_unmirrored(asked, out)
            return got

    async def _settle_elsewhere(
        self, holds: list[str], agent_id: str, roles: list[str] | None, attempt: Attempt
    ) -> Claimed | _Settled | None:
        """The agent may hold a task in repositories other than the first it would claim in
        (`holds`, from `agent_repos`): a repeated request id is answered by the repository
        that remembers it (its hand-out, or None); otherwise the held task is settled there
        (also outside those asked), learning the order to claim in."""
        pointed = [self.store.repo(n) for n in holds]
        if attempt.request_id is not None and await self._replayed_elsewhere(
            pointed, agent_id, roles, attempt
        ):
            return attempt.granted
        return await self._settle_held(pointed, agent_id, roles, attempt)

    async def _settle_held(
        self, pointed: list[RepoStore], agent_id: str, roles: list[str] | None, attempt: Attempt
    ) -> Claimed | _Settled:
        """One live task per agent across repositories: settle it wherever it may be held
        (`pointed`, also outside the repositories asked for), learning their buckets; or the
        hand-out a repository already gave this request."""
        settled: list[Any] = await asyncio.gather(
            *(
                s.claim(
                    agent_id,
                    previous=attempt.previous,
                    mode=self.settings.priority_mode,
                    base_branch="",
                    roles=roles,
                    settle_only=True,
                    request_id=attempt.request_id,
                    fence_ms=attempt.fence_ms,
                )
                for s in pointed
            ),
            return_exceptions=True,
        )
        found = _Settled(out=await self._out_of_service(pointed, settled))
        for s, result in zip(pointed, settled, strict=True):
            if isinstance(result, BaseException):
                continue  # out of service (above)
            log_settled(s.repository, agent_id, result)
            if isinstance(result, Claimed):
                return result
            if isinstance(result, NoTask):
                attempt.note(s.repository, result)
                found.order[s.repository] = claim_order(result)
                if result.detail == "1":
                    found.waits.add(s.repository)  # a reassigned task waits for the agent there
        return found

    async def _tries(
        self, asked: list[str] | None, roles: list[str] | None, found: _Settled
    ) -> list[str]:
        """The repositories to claim in, in claim order, at most MAX_CLAIM_REPOS: of those
        asked (None: all), the ones the index says have work for `roles` and the ones where a
        reassigned task waits for the agent, none out of service. Its cost grows with the
        repositories that have work, not with those asked or configured."""
        index = self.waker.index
        if not self.waker.listening or index.loaded_at == 0:
            await index.reload(self.store)
        with_work = index.with_work(roles, asked)
        waits = found.waits if asked is None else found.waits.intersection(asked)
        names = (with_work.keys() | waits) - found.out.keys()
        order = found.order
        for name in names:
            bucket = with_work.get(name)
            order.setdefault(name, (1, bucket if bucket is not None else 1 << 30))
        # Ties take turns (share.py), then go by the configured order (as `judge` does).
        position, turn = self.store.position, self.share.key
        return sorted(names, key=lambda n: (order[n], turn(n), position[n]))[:MAX_CLAIM_REPOS]

    async def _unless_unmirrored(self, asked: list[str] | None, out: dict[str, str]) -> None:
        """Nothing was handed out: a request that asked for repositories whose mirror is being
        built (a first sync, a rebuild) is told to retry (503) rather than that there is no
        work. Repositories whose sync keeps failing count only when nothing else was asked."""
        names = self.store.repos.keys() if asked is None else asked
        missing = self.waker.index.unmirrored(names)
        if not missing:
            return
        failing = dict(out)
        for name in sorted(missing - set(failing))[:MAX_FAILING_LOOKUPS]:
            reason = await self.store.repo(name).sync_failing()
            if reason is not None:
                failing[name] = reason
        building = missing - set(failing)
        if building:
            shown = ", ".join(sorted(building)[:5])
            more = f" and {len(building) - 5} more" if len(building) > 5 else ""
            raise MirrorRebuilding(
                f"the mirror of {shown}{more} is being built from GitHub; retry shortly"
            )
        if missing.issuperset(names):
            raise MirrorRebuilding(
                "the mirror of "
                + ", ".join(f"{n} ({failing[n]})" for n in sorted(missing))
                + " is not rebuilt: its sync keeps failing; retry later"
            )

    async def _claim_each(
        self,
        stores: list[RepoStore],
        agent_id: str,
        roles: list[str] | None,
        attempt: Attempt,
        *,
        pointed: set[str],
        noted: set[str] | None = None,
    ) -> Claimed | None:
        """Claim in `stores`, in order, until one hands out a task. With several
        repositories, each is pointed at first (`agent_repos`) unless this request did
        already (`noted`), and one whose mirror is being rebuilt is passed over where the
        agent holds nothing (not in `pointed`) or its sync keeps failing: only what is
        mirrored is served."""
        proving = 0
        paused_here, paused_in = "", 0
        for rstore in stores:
            got = await self._claim_one(rstore, agent_id, roles, attempt, pointed, noted)
            if got is None:
                continue
            log_settled(rstore.repository, agent_id, got)
            if isinstance(got, Claimed):
                attempt.handed_in = rstore.repository
                # DEBUG: a line per claim is noise at an agent fleet's pace; the repository's
                # timeline (dashboard, /status) records every claim and settlement.
                logger.debug(
                    "claimed %s#%d for %s (%s)",
                    got.repository,
                    got.issue.number,
                    agent_id,
                    got.task_type,
                    extra=log_fields(got.repository, got.issue.number, agent_id, got.task_id),
                )
                return got
            attempt.note(rstore.repository, got)
            if got.reason == "agent_paused":
                if not scoped(got.detail):
                    raise agent_paused(agent_id, got.detail)
                # Paused in this repository alone (a maintainer or a comment there): the
                # others may still hand it work.
                paused_here, paused_in = paused_here or got.detail, paused_in + 1
                continue
            if got.reason == "quarantine":
                proving = max(proving, int(got.detail or 0))
            if attempt.replayed:
                return None
        if paused_here and paused_in == len(stores):
            raise agent_paused(agent_id, paused_here)
        if proving:
            wait_s = max(1, (proving - now_ms()) // 1000)
            raise MirrorRebuilding(
                "Redis lost its data and the mirror was rebuilt: leases are being proven by "
                f"their agents; nothing new is handed out for {wait_s}s more, retry then"
            )
        return None

    async def _claim_one(
        self,
        rstore: RepoStore,
        agent_id: str,
        roles: list[str] | None,
        attempt: Attempt,
        pointed: set[str],
        noted: set[str] | None,
    ) -> Claimed | NoTask | None:
        """One repository's claim; None when it is passed over (see `_claim_each`)."""
        name = rstore.repository
        several = len(self.store.repos) > 1
        if several and noted is not None and name not in noted:
            # Before claiming there: from now on the agent may hold a task in it.
            keep_ms = self.settings.leases.agent_task_ttl_s * 1000
            await self.store.note_agent_repos(agent_id, [name], keep_ms)
            noted.add(name)
        base = await self.base_branch(rstore)
        try:
            return await rstore.claim(
                agent_id,
                previous=attempt.previous,
                mode=self.settings.priority_mode,
                base_branch=base,
                roles=roles,
                skip_issue=attempt.skip.get(name),
                request_id=attempt.request_id,
                fence_ms=attempt.fence_ms,
            )
        except MirrorRebuilding:
            if several and (name not in pointed or await rstore.sync_failing() is not None):
                return None
            raise

    @staticmethod
    async def _out_of_service(stores: list[RepoStore], settled: list[Any]) -> dict[str, str]:
        """Repositories whose mirror is not rebuilt while the leader's sync of them keeps
        failing (sync:failing: renamed, removed, no access, GitHub failing for it): left out
        of this request, so one broken repository does not stop claims in the others. Any
        other error of the settle pass is raised, as is a mirror being rebuilt (Redis lost its
        data): the agent's task there is unknown until then, and the agent must retry."""
        out: dict[str, str] = {}
        for s, result in zip(stores, settled, strict=True):
            if not isinstance(result, BaseException):
                continue
            if isinstance(result, MirrorRebuilding):
                reason = await s.sync_failing()
                if reason is not None:
                    out[s.repository] = reason
                    continue
            raise result
        return out

    async def _replayed_elsewhere(
        self,
        everywhere: list[RepoStore],
        agent_id: str,
        roles: list[str] | None,
        attempt: Attempt,
    ) -> bool:
        """A repeated request id, with several repositories: True when the request is answered
        by the repository that remembers its hand-out (`attempt.granted`: that hand-out, or
        None). A repeat settles nothing; the settle pass would, in every repository that does
        not know the id, settle the agent's current task as if it were a new request."""
        rid = attempt.request_id
        assert rid is not None
        known = await asyncio.gather(*(s.knows_request(agent_id, rid) for s in everywhere))
        origins = [s for s, k in zip(everywhere, known, strict=True) if k]
        if not origins:
            return False
        # Each repository that remembers a hand-out for the id answers as with one repository:
        # the same task while its lease lives, 'replayed' while the agent holds another task
        # there. A retried id can be remembered by several (its first hand-out ended, a retry
        # then claimed elsewhere): the live one wins.
        answers = await asyncio.gather(
            *(
                s.claim(
                    agent_id,
                    previous=attempt.previous,
                    mode=self.settings.priority_mode,
                    base_branch="",
                    roles=roles,
                    settle_only=True,
                    request_id=rid,
                    fence_ms=attempt.fence_ms,
                )
                for s in origins
            )
        )
        live = next((got for got in answers if isinstance(got, Claimed)), None)
        if live is not None:
            attempt.granted = live
            return True
        for s, got in zip(origins, answers, strict=True):
            if isinstance(got, NoTask):
                attempt.note(s.repository, got)
        others = [s for s in everywhere if s not in origins]
        if attempt.replayed or any(
            await asyncio.gather(*(s.holds_lease(agent_id) for s in others))
        ):
            attempt.replayed = True
            attempt.granted = None
            return True
        return False  # the agent holds nothing: the repeat may claim, settling nothing


def log_settled(repository: str, agent_id: str, result: Claimed | NoTask) -> None:
    """The implicit completion: a new request settled the task the agent still held."""
    if result.settled_issue is not None and logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s %s#%d by %s (settled by its next request)",
            result.settled_outcome,
            repository,
            result.settled_issue,
            agent_id,
            extra=log_fields(repository, result.settled_issue, agent_id),
        )
