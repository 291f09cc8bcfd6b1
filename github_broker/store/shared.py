"""The deployment-wide store: every repository's store plus the keys they share (leader,
quota, global timeline, broker pause, audit, ready events; per agent: agents.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

import redis.exceptions

from github_broker.background import stop_task
from github_broker.clock import now_ms
from github_broker.errors import ConfigError, StoreUnavailable
from github_broker.keys import GlobalKeys, RepoKeys
from github_broker.models import AuditEntry, Event, Quota
from github_broker.settings import Settings
from github_broker.store.agents import AgentState
from github_broker.store.connection import (
    as_text,
    awaited,
    call_timeouts,
    connect,
    pubsub_client_for,
    redis_problem,
    translate_errors,
)
from github_broker.store.control import audit_entries, split_actor, xadd_audit
from github_broker.store.ended import EndedLeases
from github_broker.store.history import HistorySamples
from github_broker.store.logins import DashboardLogins
from github_broker.store.repo import RepoStore, durability_command, shared_context
from github_broker.store.repos import RepoStores
from github_broker.store.resp import close_pipelined, pipelined_for
from github_broker.store.rights import GitHubRightsCache
from github_broker.store.scripts import Scripts
from github_broker.store.timeline import events_of, xadd_event

logger = logging.getLogger(__name__)

#: Audit entries appended to the audit file per stream and pass.
AUDIT_EXPORT_BATCH = 1000

#: What `ready_events` queues each time Redis confirms its subscription (again).
RESUBSCRIBED = "\tresubscribed"

#: Seconds /ready waits for Redis's PONG.
PING_TIMEOUT_S = 0.8


class Store(AgentState):
    """All repositories' stores plus the deployment-wide keys; what it keeps per agent
    (the agent mutex, where an agent may hold a task, paused agents) is in agents.py."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.call_timeout_s = settings.redis.socket_timeout_s
        self.pubsub_client = pubsub_client_for(
            settings.redis.url,
            client,
            call_timeouts(settings.redis.socket_timeout_s, settings.redis.connect_timeout_s),
        )
        # Before any Scripts: the pipelined client gives up a connection that owed replies and
        # got none for one call bound (see resp.py).
        pipelined_for(client, stall_s=settings.redis.socket_timeout_s)
        # One compiled set for every repository: a call names its repository (repo.py).
        self.scripts = Scripts(client, shared_context(settings))
        self.global_keys = GlobalKeys(settings.redis.key_prefix)
        self.logins = DashboardLogins(client, self.scripts, self.global_keys, self.call_timeout_s)
        self.samples = HistorySamples(client, self.global_keys, self.call_timeout_s)
        self.rights = GitHubRightsCache(client, self.global_keys)
        self._seen_noted = {}
        #: The lease ends this process heard on the events channel (claim/events.py), shared
        #: by every repository's store.
        self.ended = EndedLeases()
        #: What makes a write durable (repo.py `durability_command`; `check_durability` may
        #: find the server needs none).
        self.durable_wait = durability_command(settings)
        #: Each repository's store, built when first used (repos.py).
        self.repos = RepoStores([r.full_name for r in settings.repositories], self._repo_store)
        #: Each repository's `idx` key, in configuration order (index_lines).
        self._idx_keys: list[str] | None = None
        #: Each repository's place in the configuration: how ties in the claim order break.
        self.position = {name: i for i, name in enumerate(self.repos)}

    @classmethod
    def from_settings(cls, settings: Settings) -> Store:
        return cls(
            connect(
                settings.redis.url,
                socket_timeout_s=settings.redis.socket_timeout_s,
                connect_timeout_s=settings.redis.connect_timeout_s,
                # Every Store and RepoStore call is bounded by call_timeout_s (translate_errors,
                # ping and agent_mutex their own way); subscriptions use pubsub_client.
                bounded_by_caller=True,
            ),
            settings,
        )

    async def close(self) -> None:
        if self.pubsub_client is not self.client:
            await self.pubsub_client.aclose()
        await close_pipelined(self.client)
        await self.client.aclose()

    def repo(self, full_name: str) -> RepoStore:
        return self.repos[full_name]

    def _repo_store(self, full_name: str) -> RepoStore:
        keys = RepoKeys(self.settings.redis.key_prefix, *full_name.split("/", 1))
        rstore = RepoStore(self.client, self.scripts, keys, self.settings)
        rstore.ended = self.ended
        rstore.durable_wait = self.durable_wait
        return rstore

    async def ping(self, timeout_s: float = PING_TIMEOUT_S) -> bool:
        """Whether Redis answers within `timeout_s` (a hung Redis fails fast: /ready)."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self.client.ping())
        except TimeoutError as e:
            raise StoreUnavailable(f"Redis did not answer within {timeout_s:g}s") from e
        except (redis.exceptions.RedisError, OSError) as e:
            raise StoreUnavailable(redis_problem(e)) from e

    @translate_errors
    async def server_id(self) -> str | None:
        """The run_id of the redis-server answering (a new one after every restart), or None
        where INFO does not tell one (fakeredis; Redis Cluster, whose nodes each have one)."""
        try:
            info = await self.client.info("server")
        except redis.exceptions.ResponseError:
            return None
        run_id = info.get("run_id") if isinstance(info, dict) else None
        return str(run_id) if isinstance(run_id, str) and run_id else None

    @translate_errors
    async def check_durability(self) -> str:
        """Check `redis.durability` against the server before serving; returns what it
        promises, in words. `aof` uses WAITAOF (Redis >= 7.2), or nothing more on a server
        that fsyncs every write before it answers (`appendfsync always`); anything else is
        refused with what to do. `replica` with fewer replicas connected than it needs is
        only logged: every write then answers 503 until they are back."""
        mode = self.settings.redis.durability
        if mode == "none":
            return "none: answered as soon as Redis ran it"
        info = await self.client.info()
        if mode == "replica":
            needed = self.settings.redis.durable_replicas
            connected = int(info.get("connected_slaves", 0))
            if connected < needed:
                logger.warning(
                    "redis.durability replica needs %d replica(s), %d connected: claims, "
                    "completions and releases answer 503 until enough are",
                    needed,
                    connected,
                )
            return f"replica: answered once {needed} replica(s) have it"
        version = tuple(int(x) for x in str(info.get("redis_version", "0")).split(".")[:2])
        if version >= (7, 2):
            return "aof: answered once written to the append-only file (WAITAOF)"
        try:
            config = await self.client.config_get("appendfsync")
            aof = await self.client.config_get("appendonly")
        except redis.exceptions.ResponseError as e:
            raise ConfigError(
                "redis.durability aof: the server answers no CONFIG GET and has no WAITAOF "
                f"(Redis {info.get('redis_version')}, WAITAOF needs 7.2): {e}; use replica "
                "or none"
            ) from e
        if aof.get("appendonly") == "yes" and config.get("appendfsync") == "always":
            self.durable_wait = ()  # every reply already follows its fsync
            for rstore in self.repos.built():
                rstore.durable_wait = ()
            return "aof: the server fsyncs every write before it answers (appendfsync always)"
        raise ConfigError(
            f"redis.durability aof: Redis {info.get('redis_version')} has no WAITAOF (7.2) and "
            "does not fsync every write (set appendonly yes and appendfsync always), so an "
            "acknowledged claim could still be lost; upgrade Redis, change its settings, or use "
            "redis.durability replica or none"
        )

    @translate_errors
    async def leader(self, candidate: str, ttl_ms: int, *, release: bool = False) -> int:
        """acquire: the caller's leader epoch (> 0) while it leads, else 0; release: 1 when
        the caller held the lease and gave it up."""
        action = "release" if release else "acquire"
        res = await self.scripts.leader(
            keys=[self.global_keys.leader, self.global_keys.leader_epoch],
            args=[candidate, ttl_ms, action],
        )
        return int(res)

    @translate_errors
    async def leader_id(self) -> str | None:
        raw = await awaited(self.client.get(self.global_keys.leader))
        return as_text(raw) if raw else None

    @translate_errors
    async def save_quota(self, quota: Quota) -> None:
        await self.client.set(self.global_keys.quota, quota.model_dump_json())

    @translate_errors
    async def quota(self) -> Quota | None:
        raw = await awaited(self.client.get(self.global_keys.quota))
        return Quota.model_validate_json(raw) if raw else None

    @translate_errors
    async def record_event(
        self, kind: str, number: int | None = None, agent: str = "", detail: str = ""
    ) -> None:
        """A deployment-wide event (leader changes) on the global timeline."""
        await xadd_event(self.client, self.global_keys.timeline, kind, number, agent, detail)

    @translate_errors
    async def timeline(
        self, count: int = 50, repositories: Collection[str] | None = None
    ) -> list[Event]:
        """Recent events of every repository (or of `repositories` alone) and the
        deployment, newest first."""
        events = events_of(
            await self.client.xrevrange(self.global_keys.timeline, count=count), None
        )
        for name, rstore in self.repos.items():
            if repositories is None or name in repositories:
                events += await rstore.timeline(count)
        return sorted(events, key=lambda e: e.at_ms, reverse=True)[:count]

    # --- steering across repositories (each repository keeps a copy the claim reads) -------

    @translate_errors
    async def pause_broker(self, actor: str, reason: str, *, resume: bool = False) -> None:
        """Maintenance: nothing new is handed out in any repository (leases keep running).
        `actor` is `<rank>:<name>`; only an administrator gets here (steering/authority.py)."""
        if resume:
            await self.client.hdel(self.global_keys.control, "broker")
        else:
            rank, name = split_actor(actor)
            record = json.dumps(
                {
                    "scope": "broker",
                    "by": name,
                    "rank": rank,
                    "what": "paused",
                    "reason": reason,
                    "at_ms": now_ms(),
                }
            )
            await self.client.hset(self.global_keys.control, "broker", record)
        action = "resume_repo" if resume else "pause_repo"
        await asyncio.gather(
            *(r.control(action, actor, "", reason, "broker") for r in self.repos.values())
        )

    @translate_errors
    async def note_kept_away(self, repository: str, number: int, agent: str, until_ms: int) -> None:
        """The deployment's copy of a keep-away (a person took issue `number` from `agent`),
        which the leader writes back after a loss; entries past `until_ms` are dropped."""
        key = self.global_keys.kept_away
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key, f"{repository}#{number}#{agent}", until_ms)
            await pipe.execute()

    @translate_errors
    async def forget_kept_away(self, repository: str, number: int) -> None:
        """A retry let the agents issue `number` was taken from back (control.lua did it in
        the repository): the deployment's copies go too."""
        key = self.global_keys.kept_away
        fields = [f async for f, _ in self.client.hscan_iter(key, match=f"{repository}#{number}#*")]
        if fields:
            await self.client.hdel(key, *fields)

    @translate_errors
    async def decisions(self) -> dict[str, dict[str, str]]:
        """The deployment's standing decisions as stored: paused agents (agent -> record),
        the broker pause (`control`) and keep-aways (`repo#n#agent` -> until ms), for the
        leader to write back after a loss."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.global_keys.agents)
            pipe.hgetall(self.global_keys.control)
            pipe.hgetall(self.global_keys.kept_away)
            agents, control, kept = await pipe.execute()
        now = now_ms()
        expired = [k for k, v in kept.items() if int(v) <= now]
        if expired:
            await self.client.hdel(self.global_keys.kept_away, *expired)
        return {
            "agents": {as_text(k): as_text(v) for k, v in agents.items()},
            "control": {as_text(k): as_text(v) for k, v in control.items()},
            "kept_away": {as_text(k): as_text(v) for k, v in kept.items() if int(v) > now},
        }

    @translate_errors
    async def restore_decisions(self, decisions: dict[str, dict[str, str]]) -> int:
        """Write `decisions` back where nothing stands (HSETNX: a decision taken since the
        loss is kept), in the deployment's record and every repository's copy. Returns how
        many the deployment's record lacked."""
        restored = 0
        async with self.client.pipeline(transaction=False) as pipe:
            for agent, record in decisions.get("agents", {}).items():
                pipe.hsetnx(self.global_keys.agents, agent, record)
            for scope, record in decisions.get("control", {}).items():
                pipe.hsetnx(self.global_keys.control, scope, record)
            restored = sum(int(bool(x)) for x in await pipe.execute())
        for rstore in self.repos.values():
            async with self.client.pipeline(transaction=False) as pipe:
                for agent, record in decisions.get("agents", {}).items():
                    pipe.hsetnx(rstore.keys.paused_agents, agent, record)
                if "broker" in decisions.get("control", {}):
                    pipe.hsetnx(rstore.keys.control, "broker", decisions["control"]["broker"])
                await pipe.execute()
        restored += await self._restore_kept_away(decisions.get("kept_away", {}))
        return restored

    async def _restore_kept_away(self, kept: dict[str, str]) -> int:
        """Keep-aways written back: each agent's cool-down on its issue, and the issue's
        `kept_away` list (a retry lets them back)."""
        now, restored = now_ms(), 0
        for field, until in kept.items():
            repository, _, rest = field.partition("#")
            number, _, agent = rest.partition("#")
            rstore = self.repos.get(repository)
            if rstore is None or int(until) <= now:
                continue
            key = rstore.keys.cooldowns(agent)
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.zadd(key, {number: int(until)})
                pipe.pexpire(key, int(until) - now)
                await pipe.execute()
            raw = await awaited(self.client.hget(rstore.keys.kept_away, number))
            agents = json.loads(raw) if raw else []
            if agent not in agents:
                agents.append(agent)
                await self.client.hset(rstore.keys.kept_away, number, json.dumps(agents))
                restored += 1
        return restored

    @translate_errors
    async def broker_pause(self) -> dict[str, Any] | None:
        raw = await awaited(self.client.hget(self.global_keys.control, "broker"))
        return json.loads(raw) if raw else None

    @translate_errors
    async def record_audit(
        self,
        actor: str,
        action: str,
        *,
        agent: str = "",
        reason: str = "",
        outcome: str = "",
        repository: str = "",
    ) -> None:
        """A deployment-wide action in the audit log (pausing an agent or the broker); `actor`
        is `<rank>:<name>` (a bare name: the broker's own)."""
        rank, name = split_actor(actor)
        entry = {
            "actor": name,
            "authority": str(rank),
            "action": action,
            "n": "",
            "agent": agent,
            "reason": reason,
            "outcome": outcome,
            "repository": repository,
        }
        await xadd_audit(
            self.client, self.global_keys.audit, self.settings.audit.max_entries, entry
        )

    @translate_errors
    async def audit_log(
        self,
        count: int = 50,
        before_ms: int | None = None,
        *,
        repositories: Collection[str] | None = None,
        also_by: str | None = None,
    ) -> list[AuditEntry]:
        """The newest entries of every repository and the deployment, newest first; `before_ms`
        pages back (entries strictly older). `repositories`: only those repositories' entries,
        and the deployment's that name one of them or were made by `also_by`."""
        if before_ms == 0:
            return []  # nothing is older than the epoch (and `(0-0` is no stream id)
        before = "+" if before_ms is None else f"{before_ms}-0"
        end = before if before == "+" else f"({before}"
        found = audit_entries(
            await self.client.xrevrange(self.global_keys.audit, max=end, count=count), None
        )
        names = self.repos if repositories is None else [r for r in repositories if r in self.repos]
        if repositories is not None:
            found = [e for e in found if e.repository in names or e.actor == also_by]
        for name in names:
            found += await self.repos[name].audit_log(count, before)
        return sorted(found, key=lambda e: (e.at_ms, e.id), reverse=True)[:count]

    @translate_errors
    async def audit_export(self) -> list[tuple[str, str, list[AuditEntry]]]:
        """For the audit file: per audit stream (the deployment's, then each repository's),
        its key, the last id exported and the entries after it (oldest first, bounded)."""
        cursors = await awaited(self.client.hgetall(self.global_keys.audit_exported))
        done = {as_text(k): as_text(v) for k, v in cursors.items()}
        streams = [(self.global_keys.audit, None)] + [
            (r.keys.audit, r.repository) for r in self.repos.values()
        ]
        out = []
        for key, repository in streams:
            after = done.get(key, "0-0")
            reply = await self.client.xread({key: after}, count=AUDIT_EXPORT_BATCH)
            entries = audit_entries(reply[0][1] if reply else [], repository)
            if entries:
                out.append((key, after, entries))
        return out

    @translate_errors
    async def audit_exported(self, key: str, last_id: str) -> None:
        await self.client.hset(self.global_keys.audit_exported, key, last_id)

    @translate_errors
    async def graph_repos(self) -> set[str]:
        """The repositories some of whose issues have blockers (leader/graph.py pushes the
        states of blockers to these alone)."""
        members = await awaited(self.client.smembers(self.global_keys.graph_repos))
        return {as_text(v) for v in members}

    @translate_errors
    async def note_graph_repo(self, full_name: str) -> None:
        await self.client.sadd(self.global_keys.graph_repos, full_name)

    @translate_errors
    async def index_lines(self) -> dict[str, str]:
        """Every repository's line in the index of repositories with work (one pipeline)."""
        if self._idx_keys is None:
            # Only the key names, not a store per repository (repos.py builds those on use).
            self._idx_keys = [
                RepoKeys(self.settings.redis.key_prefix, *name.split("/", 1)).idx
                for name in self.repos
            ]
        async with self.client.pipeline(transaction=False) as pipe:
            for key in self._idx_keys:
                pipe.get(key)
            raw = await pipe.execute()
        return {name: as_text(v) for name, v in zip(self.repos, raw, strict=True) if v}

    # --- the leader's idle passes: one round trip for every repository ----------------------

    async def _each(self, names: list[str], command: str, key: str, *args: Any) -> list[Any]:
        """`command` on each repository's `key` (a RepoKeys attribute), in one round trip
        (agents.py `_batch`: the scripts' pipelined client where there is one)."""
        return await self._all([(command, getattr(self.repos[n].keys, key), *args) for n in names])

    async def _all(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        replies = await self._batch(commands)
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        if failed is not None:
            raise failed
        return replies

    @translate_errors
    async def recorded_servers(self, names: list[str]) -> dict[str, tuple[str, str] | None]:
        """Each repository's record of the redis-server its data lives on, with the mark last
        written (mirror.py `check_server`), or None."""
        out: dict[str, tuple[str, str] | None] = {}
        for name, raw in zip(names, await self._each(names, "GET", "server"), strict=True):
            run_id, _, mark = as_text(raw).partition(" ") if raw is not None else ("", "", "")
            out[name] = (run_id, mark) if raw is not None else None
        return out

    @translate_errors
    async def record_servers(self, run_id: str, marks: dict[str, str]) -> None:
        """`check_server`'s record for repositories whose data is not stale, in one pipeline."""
        await self._all(
            [("SET", self.repos[n].keys.server, f"{run_id} {m}") for n, m in marks.items()]
        )

    @translate_errors
    async def mirrors_built(self, names: list[str]) -> set[str]:
        """The repositories whose mirror a complete sync pass has rebuilt (`mirror_rebuilt`)."""
        found = await self._each(names, "EXISTS", "mirror")
        return {name for name, built in zip(names, found, strict=True) if built}

    @translate_errors
    async def holding(self, names: list[str]) -> set[str]:
        """The repositories with a held task, or a lost one being recovered (`recovering`)."""
        held = await self._each(names, "ZCARD", "leases")
        lost = await self._each(names, "EXISTS", "recovering")
        return {name for name, h, r in zip(names, held, lost, strict=True) if h or r}

    @translate_errors
    async def writes_due(self, names: list[str]) -> set[str]:
        """The repositories with a GitHub write due now (`outbox_due`)."""
        found = await self._each(names, "ZRANGEBYSCORE", "outbox", "-inf", now_ms(), "LIMIT", 0, 1)
        return {name for name, due in zip(names, found, strict=True) if due}

    @translate_errors
    async def record_webhook_refused(self, reason: str, count: int = 1) -> None:
        """`count` deliveries refused before they were trusted (bad signature, no secret), the
        last for `reason`: for health."""
        key = self.global_keys.webhooks_refused
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hset(key, mapping={"at_ms": now_ms(), "reason": reason[:200]})
            pipe.hincrby(key, "count", count)
            await pipe.execute()

    @translate_errors
    async def webhook_refused(self) -> tuple[int, str, int] | None:
        """(when, why, how many so far) of refused deliveries, or None."""
        raw = await awaited(self.client.hgetall(self.global_keys.webhooks_refused))
        if not raw:
            return None
        h = {as_text(k): as_text(v) for k, v in raw.items()}
        return int(h.get("at_ms", 0)), h.get("reason", ""), int(h.get("count", 0))

    @asynccontextmanager
    async def ready_events(self) -> AsyncIterator[asyncio.Queue[str]]:
        """Subscribe to the deployment's events channel: `ready` whenever a task becomes
        claimable anywhere, `idx <repository> <line>` whenever a repository's line in the
        index of repositories with work changes (messages are queued as sent), and
        RESUBSCRIBED each time Redis confirms the subscription: once subscribed, and after
        each reconnect (redis-py subscribes again by itself; what was sent meanwhile is
        lost). Everything published after it is delivered."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        pubsub = self.pubsub_client.pubsub()
        channels = [self.global_keys.events] if self.repos else []
        try:
            if channels:
                try:
                    await pubsub.subscribe(*channels)
                except (
                    redis.exceptions.ConnectionError,
                    redis.exceptions.TimeoutError,
                    OSError,
                ) as e:
                    raise StoreUnavailable(redis_problem(e)) from e
            reader = asyncio.create_task(self._pump(pubsub, queue))
            try:
                yield queue
            finally:
                await stop_task(reader)
        finally:
            await pubsub.aclose()

    async def _pump(self, pubsub: Any, queue: asyncio.Queue[str]) -> None:
        while True:
            try:
                msg = await pubsub.get_message(timeout=1.0)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                # TimeoutError: a reconnect whose handshake Redis does not answer in time (a
                # stalled Redis, a proxy that accepts while Redis is down). Not caught, it ended
                # this task for good and long-polls were only woken by their re-check.
                await asyncio.sleep(1.0)
                continue
            if msg is None:
                continue
            kind = as_text(msg["type"])
            if kind == "message":
                queue.put_nowait(as_text(msg["data"]))
            elif kind == "subscribe":
                queue.put_nowait(RESUBSCRIBED)
