"""What a deployment keeps per agent across its repositories: one request of an agent at a
time (the agent mutex), where an agent may hold a task, and paused agents (the deployment's
record, and the copy in each repository that the claim reads)."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import redis.exceptions

from github_broker.clock import now_ms
from github_broker.errors import CallUnanswered, StoreUnavailable
from github_broker.keys import GlobalKeys
from github_broker.models import AgentPause, ControlOutcome
from github_broker.store.connection import as_text, awaited, redis_problem, translate_errors
from github_broker.store.leases import pause_of
from github_broker.store.repos import RepoStores
from github_broker.store.scripts import Scripts

#: An agent's mutex across repositories is held for one call bound (`redis.socket_timeout_s`)
#: per Redis call the request may make under it, plus this many as margin (`agent_mutex`).
AGENT_MUTEX_MARGIN_CALLS = 1
#: Redis calls, one after another, of a repeated request id's check across repositories
#: (`ClaimWalk._replayed_elsewhere`): who knows the id, their answers, then GET and EXISTS.
AGENT_MUTEX_REPLAY_CALLS = 4
#: Seconds a release that got no answer (or an acquire that got none) is retried afterwards.
AGENT_MUTEX_RETRY_S = 60.0
#: Pause between those retries (s).
AGENT_MUTEX_RETRY_PAUSE_S = 0.1
#: Seconds between two notes that an agent asked for work (per agent, per process).
SEEN_NOTE_S = 60.0
#: Days an agent that asked for work stays known (a name maintainers may reassign to).
SEEN_KEEP_DAYS = 30
#: Most agents that stay known (the oldest forgotten first).
SEEN_MAX = 10_000
#: The background retries in flight (a strong reference, so none is garbage-collected).
_MUTEX_RETRIES: set[asyncio.Task[None]] = set()


@dataclass(frozen=True)
class MutexHold:
    """What `AgentState.agent_mutex` yields."""

    #: Repositories where the agent may hold a task or a remembered request id.
    pointed: list[str]
    #: Redis time (ms) until which the mutex is this request's at least: pass it to every
    #: settling or claim script run under it (`RepoStore.claim(fence_ms=)`).
    fence_ms: int


class AgentState:
    """The agent-scoped part of `Store` (which sets the client, keys and repositories)."""

    client: Any
    scripts: Scripts
    global_keys: GlobalKeys
    repos: RepoStores
    #: Longest one store call may take, reconnects included (seconds).
    call_timeout_s: float
    #: agent -> when this process last noted it asked for work (time.monotonic()).
    _seen_noted: dict[str, float]

    @translate_errors
    async def note_seen(self, agent_id: str) -> None:
        """The agent asked for work: it is known (reassignments name known agents only). One
        write per agent a minute per process, off the claim's own round trips."""
        now = time.monotonic()
        if now - self._seen_noted.get(agent_id, -SEEN_NOTE_S) < SEEN_NOTE_S:
            return
        self._seen_noted[agent_id] = now
        stamp = now_ms()
        key = self.global_keys.agents_seen
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {agent_id: stamp})
            pipe.zremrangebyscore(key, "-inf", stamp - SEEN_KEEP_DAYS * 86_400_000)
            pipe.zremrangebyrank(key, 0, -SEEN_MAX - 1)
            await pipe.execute()

    @translate_errors
    async def seen_agents(self) -> list[str]:
        """Agents that asked for work in the last SEEN_KEEP_DAYS days, newest first."""
        raw = await self.client.zrevrange(self.global_keys.agents_seen, 0, -1)
        return [as_text(a) for a in raw]

    @asynccontextmanager
    async def agent_mutex(
        self,
        agent_id: str,
        *,
        repos: int | None = None,
        keep_ms: int = 0,
        first: str | None = None,
        lookups: int = 0,
    ) -> AsyncIterator[MutexHold]:
        """One request of `agent_id` at a time (deployments with several repositories, whose
        claims are one script per repository and so not atomic across them). With `keep_ms`
        it yields where the agent may hold a task or a remembered request id (`agent_repos`,
        pointers older than `keep_ms` dropped), read in the same round trip as the mutex is
        taken, and then points at `first` (the repository the request claims in first).
        It also yields the fence: Redis's time, read just before the SET, plus the hold. The
        mutex is the request's until then at least; a settling or claim script run later
        (the process was paused: SIGSTOP, a VM freeze) refuses to (claim.lua), since another
        request of the agent may hold the mutex by then.

        The hold is proportional to the work: a request may check a repeated request id
        (AGENT_MUTEX_REPLAY_CALLS), runs one settling round (one script per such repository,
        concurrently), per repository it claims in (`repos` at most) a pointer, a
        default-branch lookup, a claim and, should the mirror be rebuilding, a look at its sync,
        and with nothing handed out up to `lookups` more such looks, each bounded by
        `call_timeout_s`; so the key lives
        that many call bounds plus a margin, and another request of the agent waits at most
        as long. A SET or release that got no answer (Redis stalled or unreachable) may still
        be run by Redis later, leaving a mutex nobody would release: its compare-and-delete is
        retried in the background until Redis deletes the token, or answers twice in a row
        (the second sent after the first reply, so after anything Redis had queued) that the
        key no longer holds it. The release is not waited for where the pipelined client
        writes it: this process's next request of the agent is written after it."""
        key, token = self.global_keys.agent_busy(agent_id), secrets.token_hex(8)
        touched = len(self.repos) if repos is None else min(repos, len(self.repos))
        calls = AGENT_MUTEX_REPLAY_CALLS + 1 + 4 * touched + lookups + AGENT_MUTEX_MARGIN_CALLS
        hold_s = self.call_timeout_s * calls
        commands = _mutex_commands(
            key, token, hold_s, self.global_keys.agent_repos(agent_id), keep_ms, first
        )
        replies = await self._taken(agent_id, key, token, commands, hold_s)
        seconds, micros = replies[0]
        fence_ms = int(seconds) * 1000 + int(micros) // 1000 + int(hold_s * 1000)
        noted = (as_text(x) for x in replies[3]) if keep_ms else ()
        unanswered = False
        try:
            yield MutexHold([n for n in noted if n in self.repos], fence_ms)
        except CallUnanswered:
            # A script under the mutex got no answer and may still reach Redis, until the
            # fence (it refuses to run past it). Released now, the mutex could go to another
            # request of the agent while that script can still land: it lapses at the fence.
            unanswered = True
            raise
        finally:
            if not unanswered:
                self._release_mutex_soon(key, token)

    async def _taken(
        self, agent_id: str, key: str, token: str, commands: list[tuple[Any, ...]], hold_s: float
    ) -> list[Any]:
        """`_take_mutex`'s replies; a SET that got no answer is released in the background."""
        try:
            return await self._take_mutex(agent_id, commands, time.monotonic() + hold_s)
        except TimeoutError as e:
            self._release_mutex_later(key, token)
            raise StoreUnavailable(f"Redis did not answer within {self.call_timeout_s:g}s") from e
        except (redis.exceptions.RedisError, OSError) as e:
            self._release_mutex_later(key, token)
            raise StoreUnavailable(redis_problem(e)) from e
        except asyncio.CancelledError:
            self._release_mutex_later(key, token)
            raise

    async def _take_mutex(
        self, agent_id: str, commands: list[tuple[Any, ...]], deadline: float
    ) -> list[Any]:
        """Send the mutex's batch (`_mutex_commands`) until its SET takes the mutex, or
        StoreUnavailable once `deadline` (monotonic) passed; the replies of the one that did."""
        while True:
            async with asyncio.timeout(self.call_timeout_s):
                replies = await self._batch(commands)
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            if failed is not None:
                raise failed
            if replies[1]:
                return replies
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"agent {agent_id} has another request in progress")
            await asyncio.sleep(0.02)

    async def _batch(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """`commands` in one round trip, their replies (an error reply in its place)."""
        pipelined = self.scripts.pipelined
        if pipelined is not None:
            return await pipelined.execute_many(*commands)
        async with self.client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    def _release_mutex_soon(self, key: str, token: str) -> None:
        """Release the mutex without waiting for Redis's answer; one that fails (NOSCRIPT
        after a restart too) is retried in the background (`_retry_release`)."""
        pipelined = self.scripts.pipelined
        sent = None
        if pipelined is not None:
            sha = self.scripts.mutex_release.sha
            sent = pipelined.send_nowait("EVALSHA", sha, 1, key, token)
        if sent is None:
            self._release_mutex_later(key, token)
            return

        def check(reply: asyncio.Future[Any]) -> None:
            if reply.cancelled() or reply.exception() is not None:
                self._release_mutex_later(key, token)

        sent.add_done_callback(check)

    async def _release_mutex(self, key: str, token: str) -> bool:
        """Delete the mutex if it still holds `token`; True when this call deleted it."""
        async with asyncio.timeout(self.call_timeout_s):
            return bool(await self.scripts.mutex_release(keys=[key], args=[token]))

    def _release_mutex_later(self, key: str, token: str) -> None:
        retry = asyncio.get_running_loop().create_task(self._retry_release(key, token))
        _MUTEX_RETRIES.add(retry)
        retry.add_done_callback(_MUTEX_RETRIES.discard)

    async def _retry_release(self, key: str, token: str) -> None:
        """Until Redis deletes the token, or answers twice in a row that the key no longer
        holds it, or AGENT_MUTEX_RETRY_S passed."""
        give_up, answered = time.monotonic() + AGENT_MUTEX_RETRY_S, False
        while time.monotonic() < give_up:
            try:
                if await self._release_mutex(key, token) or answered:
                    return
                answered = True
                continue
            except (redis.exceptions.RedisError, OSError, TimeoutError):
                answered = False
            await asyncio.sleep(AGENT_MUTEX_RETRY_PAUSE_S)

    @translate_errors
    async def note_agent_repos(self, agent_id: str, names: list[str], keep_ms: int) -> None:
        """Before claiming in `names`: the agent may hold a task there from now on."""
        if not names:
            return
        key = self.global_keys.agent_repos(agent_id)
        stamp = now_ms()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {n: stamp for n in names})
            pipe.pexpire(key, keep_ms)
            await pipe.execute()

    @translate_errors
    async def pause_agent(
        self,
        agent_id: str,
        by: str,
        reason: str,
        *,
        stop: bool = False,
        scope: list[str] | None = None,
    ) -> dict[str, ControlOutcome]:
        """Pause `agent_id` (stop: and revoke its lease) in `scope`'s repositories, or
        everywhere with None (then also in the deployment's record, which an agent that is
        new to a repository is checked against). `by` is the actor (`<rank>:<name>`); a pause
        of a higher authority stays as it is (control.lua, agent_record.lua). Returns what
        happened in each repository."""
        kind = "stop" if stop else "pause"
        where = "deployment" if scope is None else "repo"
        if scope is None:
            refused = await self._agent_record("set", agent_id, by, where, kind, reason)
            if refused:
                return {name: ControlOutcome(outcome=refused) for name in self.repos}
        action = "stop_agent" if stop else "pause_agent"
        names = list(self.repos) if scope is None else scope
        results = await asyncio.gather(
            *(self.repos[n].control(action, by, agent_id, reason, where) for n in names)
        )
        return dict(zip(names, results, strict=True))

    @translate_errors
    async def resume_agent(self, agent_id: str, by: str, *, scope: list[str] | None = None) -> str:
        """Lift `agent_id`'s pause in `scope`'s repositories (None: everywhere), unless a
        higher authority paused it, or paused it for the whole deployment while the lift
        covers only some repositories: then the refusal says who may lift it."""
        where = "deployment" if scope is None else "repo"
        if scope is None:
            refused = await self._agent_record("lift", agent_id, by, where)
            if refused:
                return refused
        names = list(self.repos) if scope is None else scope
        results = await asyncio.gather(
            *(self.repos[n].control("resume_agent", by, agent_id, "", where) for n in names)
        )
        refusals = [r.outcome for r in results if r.outcome.startswith("refused")]
        if refusals:
            return refusals[0]
        if all(r.outcome.startswith("not paused") for r in results):
            return "resumed (it was not paused)"
        return "resumed" if scope is None else "resumed in " + ", ".join(names)

    async def _agent_record(self, op: str, agent_id: str, by: str, where: str, *rest: str) -> str:
        """The deployment's record of a paused agent, set or lifted by agent_record.lua under
        the same rule as each repository's copy; '' when done, else the refusal."""
        reply = await self.scripts.agent_record(
            keys=[self.global_keys.agents], args=[op, agent_id, by, where, *rest, str(now_ms())]
        )
        return as_text(reply)

    @translate_errors
    async def spread_trips(self, repository: str, agents: list[str]) -> list[str]:
        """The circuit breaker paused these agents in `repository`: pause them in every
        other one too (a maintainer's pause already there is kept). Returns those it newly
        recorded for the deployment."""
        source = self.repos[repository]
        newly = []
        for agent in agents:
            raw = await awaited(self.client.hget(source.keys.paused_agents, agent))
            if raw is None:
                continue  # resumed meanwhile
            if await self.client.hsetnx(self.global_keys.agents, agent, raw):
                newly.append(agent)
            async with self.client.pipeline(transaction=False) as pipe:
                for rstore in self.repos.values():
                    pipe.hsetnx(rstore.keys.paused_agents, agent, raw)
                await pipe.execute()
        return newly

    @translate_errors
    async def paused_agents(self) -> dict[str, AgentPause]:
        """Every paused agent of the deployment, with who paused it and why."""
        raw = await awaited(self.client.hgetall(self.global_keys.agents))
        return {as_text(k): pause_of(json.loads(v)) for k, v in raw.items()}


def _mutex_commands(
    key: str, token: str, hold_s: float, pointers: str, keep_ms: int, first: str | None
) -> list[tuple[Any, ...]]:
    """What taking an agent's mutex writes in one round trip: Redis's time (the fence is
    counted from it), the SET (its reply decides), then, with `keep_ms`, the agent's pointers
    pruned and read, and `first` pointed at after the read (also when the SET found the mutex
    taken: a pointer too many only costs a later request one settling script there)."""
    commands: list[tuple[Any, ...]] = [
        ("TIME",),
        ("SET", key, token, "NX", "PX", int(hold_s * 1000)),
    ]
    if keep_ms:
        stamp = now_ms()
        commands += [
            ("ZREMRANGEBYSCORE", pointers, "-inf", stamp - keep_ms),
            ("ZRANGE", pointers, 0, -1),
        ]
        if first is not None:
            commands += [("ZADD", pointers, stamp, first), ("PEXPIRE", pointers, keep_ms)]
    return commands
