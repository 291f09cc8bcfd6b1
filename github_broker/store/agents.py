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
from typing import Any

import redis.exceptions

from github_broker.clock import now_ms
from github_broker.errors import StoreUnavailable
from github_broker.keys import GlobalKeys
from github_broker.models import AgentPause, ControlOutcome
from github_broker.store.connection import as_text, awaited, redis_problem, translate_errors
from github_broker.store.leases import pause_of
from github_broker.store.repo import RepoStore

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
#: The background retries in flight (a strong reference, so none is garbage-collected).
_MUTEX_RETRIES: set[asyncio.Task[None]] = set()


_RELEASE_MUTEX = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class AgentState:
    """The agent-scoped part of `Store` (which sets the client, keys and repositories)."""

    client: Any
    global_keys: GlobalKeys
    repos: dict[str, RepoStore]
    #: Longest one store call may take, reconnects included (seconds).
    call_timeout_s: float

    @asynccontextmanager
    async def agent_mutex(self, agent_id: str, *, repos: int | None = None) -> AsyncIterator[None]:
        """One request of `agent_id` at a time (deployments with several repositories, whose
        claims are one script per repository and so not atomic across them).

        The hold is proportional to the work: a request may check a repeated request id
        (AGENT_MUTEX_REPLAY_CALLS), reads where the agent may hold a task, runs one settling
        round (one script per such repository, concurrently), notes where it will claim and,
        per repository it claims in (`repos` at most), a default-branch lookup and a claim,
        each bounded by `call_timeout_s`; so the key lives that many call bounds plus a margin, and
        another request of the agent waits at most as long. A SET or release that got no answer
        (Redis stalled or unreachable) may still be run by Redis later, leaving a mutex nobody
        would release: its compare-and-delete is retried in the background until
        Redis deletes the token, or answers twice in a row (the second sent after the first
        reply, so after anything Redis had queued) that the key no longer holds it."""
        key, token = self.global_keys.agent_busy(agent_id), secrets.token_hex(8)
        touched = len(self.repos) if repos is None else min(repos, len(self.repos))
        calls = AGENT_MUTEX_REPLAY_CALLS + 2 + 2 * touched + AGENT_MUTEX_MARGIN_CALLS
        hold_s = self.call_timeout_s * calls
        deadline = time.monotonic() + hold_s
        try:
            while True:
                async with asyncio.timeout(self.call_timeout_s):
                    taken = await self.client.set(key, token, nx=True, px=int(hold_s * 1000))
                if taken:
                    break
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"agent {agent_id} has another request in progress")
                await asyncio.sleep(0.02)
        except TimeoutError as e:
            self._release_mutex_later(key, token)
            raise StoreUnavailable(f"Redis did not answer within {self.call_timeout_s:g}s") from e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            self._release_mutex_later(key, token)
            raise StoreUnavailable(redis_problem(e)) from e
        except asyncio.CancelledError:
            self._release_mutex_later(key, token)
            raise
        try:
            yield
        finally:
            try:
                await self._release_mutex(key, token)
            except (redis.exceptions.RedisError, OSError, TimeoutError):
                self._release_mutex_later(key, token)
            except asyncio.CancelledError:
                self._release_mutex_later(key, token)
                raise

    async def _release_mutex(self, key: str, token: str) -> bool:
        """Delete the mutex if it still holds `token`; True when this call deleted it."""
        async with asyncio.timeout(self.call_timeout_s):
            return bool(await self.client.eval(_RELEASE_MUTEX, 1, key, token))

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
    async def agent_repos(self, agent_id: str, keep_ms: int) -> list[str]:
        """The repositories where `agent_id` may hold a task or a remembered request id:
        those it claimed in within `keep_ms` (older entries are dropped here)."""
        key = self.global_keys.agent_repos(agent_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zremrangebyscore(key, "-inf", now_ms() - keep_ms)
            pipe.zrange(key, 0, -1)
            _, names = await pipe.execute()
        return [n for n in (as_text(x) for x in names) if n in self.repos]

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
        self, agent_id: str, actor: str, reason: str, *, stop: bool = False
    ) -> dict[str, ControlOutcome]:
        """Pause `agent_id` everywhere (stop: and revoke its lease); returns what happened in
        each repository where something did."""
        kind = "stop" if stop else "pause"
        record = json.dumps({"kind": kind, "by": actor, "reason": reason, "at_ms": now_ms()})
        await self.client.hset(self.global_keys.agents, agent_id, record)
        action = "stop_agent" if stop else "pause_agent"
        results = await asyncio.gather(
            *(r.control(action, actor, agent_id, reason) for r in self.repos.values())
        )
        return {name: out for name, out in zip(self.repos, results, strict=True)}

    @translate_errors
    async def resume_agent(self, agent_id: str, actor: str) -> bool:
        """Resume `agent_id` everywhere (its streaks start again); False if it was not paused."""
        was = bool(await self.client.hdel(self.global_keys.agents, agent_id))
        await asyncio.gather(
            *(r.control("resume_agent", actor, agent_id) for r in self.repos.values())
        )
        return was

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
