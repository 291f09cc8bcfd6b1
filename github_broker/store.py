"""The one module that talks to Redis: connections, Lua scripts, typed reads and writes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import wraps
from importlib import resources
from typing import Any, ParamSpec, TypeVar, cast

import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from github_broker.clock import iso_from_ms, now_ms
from github_broker.errors import Fenced, MirrorRebuilding, StoreUnavailable
from github_broker.keys import GlobalKeys, RepoKeys
from github_broker.models import (
    SCORE_GROUP,
    Claimed,
    Event,
    Issue,
    LeaseInfo,
    LeaseRefusal,
    NoTask,
    Quota,
    SkipReason,
    TaskType,
)
from github_broker.settings import Settings

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: How long the reason a lease ended stays readable for a late heartbeat.
LEASE_END_TTL_S = 86400
#: Ready tasks a claim looks at per index before giving up on held leftovers.
CLAIM_SCAN = 16
#: Approximate cap of each timeline stream (XADD MAXLEN ~): recent events only.
TIMELINE_MAX = 2000
#: An agent's mutex across repositories is held for one call bound (`redis.socket_timeout_s`)
#: per Redis call the request may make under it, plus this many as margin (Store.agent_mutex).
AGENT_MUTEX_MARGIN_CALLS = 1
#: Seconds a release that got no answer (or an acquire that got none) is retried afterwards.
AGENT_MUTEX_RETRY_S = 60.0
#: Pause between those retries (s).
AGENT_MUTEX_RETRY_PAUSE_S = 0.1
#: The background retries in flight (a strong reference, so none is garbage-collected).
_MUTEX_RETRIES: set[asyncio.Task[None]] = set()
_RELEASE_MUTEX = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)
#: Seconds /ready waits for Redis's PONG.
PING_TIMEOUT_S = 0.8
#: Memory URL scheme: an in-process fakeredis (sandbox, quick tests).
MEMORY_URL = "memory://"


async def _aw(result: Awaitable[T] | T) -> T:
    """Await a redis-py call; its asyncio stubs type results as "awaitable or value"."""
    if inspect.isawaitable(result):
        return cast(T, await result)
    return result


def translate_errors(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Turn redis-py connection failures into StoreUnavailable, and bound the whole call by
    the store's `call_timeout_s` (reconnects included: a hung Redis fails fast)."""

    @wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        bound = getattr(args[0], "call_timeout_s", None) if args else None
        try:
            if bound is None:
                return await fn(*args, **kwargs)
            async with asyncio.timeout(bound):
                return await fn(*args, **kwargs)
        except TimeoutError as e:
            raise StoreUnavailable(f"Redis did not answer within {bound:g}s") from e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            raise StoreUnavailable(f"Redis unavailable: {e}") from e
        except redis.exceptions.ResponseError as e:
            message = str(e)
            if message.startswith("FENCED"):
                raise Fenced(f"not the leader any more: {message}") from e
            if message.startswith("REBUILDING"):
                raise MirrorRebuilding(message.removeprefix("REBUILDING ")) from e
            raise StoreUnavailable(f"Redis error: {e}") from e

    return wrapper


#: Redis Cluster: `redis+cluster://host:port[,host:port...]` (any reachable nodes).
CLUSTER_SCHEME = "redis+cluster://"
#: Default bounds of one Redis call (seconds); `Settings.redis` sets them per deployment.
DEFAULT_SOCKET_TIMEOUT_S = 2.0
DEFAULT_CONNECT_TIMEOUT_S = 1.0


def _timeouts(socket_s: float, connect_s: float) -> dict[str, Any]:
    return {"socket_timeout": socket_s, "socket_connect_timeout": connect_s}


def connect(
    url: str,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    bounded_by_caller: bool = False,
) -> Any:
    """A client for `url`: redis://, rediss://, unix://, redis+sentinel://, redis+cluster://,
    or memory:// (an in-process fakeredis). Every call is bounded by the timeouts.
    `bounded_by_caller`: the caller bounds every call itself (`translate_errors`), so a plain
    Redis client gets no per-socket-operation timeout: with one, redis-py runs each socket
    write in a task of its own under `asyncio.wait_for`, about 40 µs of CPU per call."""
    timeouts = _timeouts(socket_timeout_s, connect_timeout_s)
    if url.startswith(MEMORY_URL):
        import fakeredis

        return fakeredis.FakeAsyncRedis(server=_memory_server())
    if url.startswith("redis+sentinel://"):
        return _sentinel(url, socket_timeout_s)
    if url.startswith(CLUSTER_SCHEME):
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = [
            ClusterNode(h, int(p or 6379))
            for h, _, p in (
                n.partition(":") for n in url.removeprefix(CLUSTER_SCHEME).split("/")[0].split(",")
            )
        ]
        return RedisCluster(startup_nodes=nodes, **timeouts)
    if bounded_by_caller:
        timeouts["socket_timeout"] = None
    return aioredis.Redis.from_url(url, retry=_retry(), **timeouts)


def _retry() -> Retry:
    # One immediate retry on a broken pooled connection (Redis restarted); none on a timeout,
    # or a hung Redis would hold each call for several socket timeouts (redis-py's default).
    return Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))


def _pubsub_client(url: str, client: Any, timeouts: dict[str, Any]) -> Any:
    """Who to SUBSCRIBE through: a plain Redis client with the socket timeouts (the main
    client may have none, see `connect`), the client itself for Sentinel and memory://, or
    for a cluster one node (a classic PUBLISH reaches every node of a cluster)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return aioredis.Redis.from_url(url, retry=_retry(), **timeouts)
    if not url.startswith(CLUSTER_SCHEME):
        return client
    host, _, port = url.removeprefix(CLUSTER_SCHEME).split("/")[0].split(",")[0].partition(":")
    return aioredis.Redis(host=host, port=int(port or 6379), retry=_retry(), **timeouts)


_MEMORY: Any = None


def _memory_server() -> Any:
    # One fake server per process, shared by every client, like one real Redis.
    global _MEMORY
    if _MEMORY is None:
        import fakeredis

        _MEMORY = fakeredis.FakeServer()
    return _MEMORY


def flush_memory() -> None:
    """Empty the in-process fake server (tests)."""
    import fakeredis

    fakeredis.FakeRedis(server=_memory_server()).flushall()


def _sentinel(url: str, socket_timeout_s: float) -> aioredis.Redis:
    # redis+sentinel://host1:26379,host2:26379/service_name[/db]
    from redis.asyncio.sentinel import Sentinel

    rest = url.removeprefix("redis+sentinel://")
    hosts, _, path = rest.partition("/")
    service, _, db = path.partition("/")
    nodes = []
    for host in hosts.split(","):
        name, _, port = host.partition(":")
        nodes.append((name, int(port or 26379)))
    sentinel = Sentinel(nodes, socket_timeout=socket_timeout_s)
    return sentinel.master_for(service or "mymaster", db=int(db or 0))


def _load(name: str, with_lib: bool = True) -> str:
    folder = resources.files("github_broker") / "lua"
    text = (folder / f"{name}.lua").read_text(encoding="utf-8")
    if not with_lib:
        return text
    return (folder / "_lib.lua").read_text(encoding="utf-8") + "\n" + text


def _lua_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).encode("utf-8")
    # A decimal escape per byte outside printable ASCII, quotes and backslashes escaped.
    return (
        '"'
        + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}" for b in text)
        + '"'
    )


def context_prelude(context: dict[str, Any]) -> str:
    """Lua source defining `base_context()`: the repository's constant context (key
    prefixes, label names, times), compiled into its scripts instead of sent with each call."""
    fields = ", ".join(f"{name} = {_lua_literal(v)}" for name, v in context.items())
    return f"local function base_context() return {{{fields}}} end\n"


class Scripts:
    """Lua scripts registered once per client (EVALSHA, falling back to EVAL). Repository
    scripts are compiled per repository, with its context (see `context_prelude`)."""

    REPO_SCRIPTS = (
        "claim",
        "task_put",
        "labels_want",
        "heartbeat",
        "finish",
        "reap",
        "sync_upsert",
        "sync_remove",
        "sync_save",
        "outbox_take",
        "outbox_done",
    )

    def __init__(self, client: aioredis.Redis, context: dict[str, Any] | None = None) -> None:
        prelude = context_prelude(context) if context is not None else ""
        self.repo = (
            {name: client.register_script(prelude + _load(name)) for name in self.REPO_SCRIPTS}
            if context is not None
            else {}
        )
        self.leader = client.register_script(_load("leader", with_lib=False))
        self.webhook_enqueue = client.register_script(_load("webhook_enqueue", with_lib=False))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _refusal(value: Any) -> LeaseRefusal:
    reason = _text(value)
    if reason == "rebuilding":
        # Redis lost the lease with everything else; the next sync re-adopts it from GitHub.
        raise MirrorRebuilding("the mirror is being rebuilt from GitHub; retry shortly")
    return LeaseRefusal(reason)


@dataclass
class UpsertResult:
    """What one sync_upsert.lua call did; `suspects` maps an issue to the lease labels that
    vanished from GitHub (the caller asks GitHub who removed them)."""

    written: int = 0
    readied: int = 0
    revoked: int = 0
    adopted: int = 0
    suspects: dict[int, list[str]] = field(default_factory=dict)
    restored: int = 0


class RepoStore:
    """Redis state of one repository."""

    def __init__(
        self, client: aioredis.Redis, scripts: Scripts, keys: RepoKeys, settings: Settings
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.settings = settings
        self.repository = keys.full_name
        #: Longest one store call may take, reconnects included (seconds).
        self.call_timeout_s = settings.redis.socket_timeout_s
        self._fixed = [
            keys.tasks,
            keys.ready,
            keys.work,
            keys.leases,
            keys.intent,
            keys.outbox,
            keys.outbox_data,
            keys.skipped,
            keys.open,
            keys.reviewing,
        ]
        self.context: dict[str, Any] = {
            "issue": keys.issue_prefix,
            "lock": keys.lock_prefix,
            "lease": keys.lease_prefix,
            "agent": keys.agent_task_prefix,
            "cand": keys.candidate_prefix,
            "ready_role": keys.ready_role_prefix,
            "tomb": keys.lease_end_prefix,
            "review": keys.review_detected_prefix,
            "review_state": keys.review_state_prefix,
            "fix": keys.fix_prefix,
            "outbox_attempts": keys.outbox_attempts,
            "events": keys.events,
            "timeline": keys.timeline,
            "timeline_max": TIMELINE_MAX,
            "in_progress": settings.labels.in_progress,
            "needs_review": settings.labels.needs_review,
            "lease_ms": settings.leases.lease_ttl_s * 1000,
            "agent_s": settings.leases.agent_task_ttl_s,
            "cand_s": settings.leases.candidate_ttl_s,
            "tomb_s": LEASE_END_TTL_S,
            "author_fallback_ms": int(settings.review.author_fallback_s * 1000),
            "priority_unit": 4 * SCORE_GROUP,
            "handout": keys.handout_prefix,
            "cooldown": keys.cooldown_prefix,
            "task_failures": keys.task_failures,
            "agent_streaks": keys.agent_streaks,
            "needs_human": settings.labels.needs_human,
            "settle_grace_ms": int(settings.leases.settle_grace_s * 1000),
            "max_failures": settings.failures.max_failures,
            "cooldown_s": settings.failures.cooldown_s,
            "fence": keys.fence,
            "mirror": keys.mirror,
            "orphans": keys.orphans,
            "outbox_taken": keys.outbox_taken,
            "sync": keys.sync,
            "sync_pages": keys.sync_pages,
        }
        # Compiled into the scripts: nothing of it travels with a call (ARGV[1] stays, empty,
        # so every script keeps its argument numbers).
        self.scripts = Scripts(client, self.context)

    async def _run(self, script: str, *args: Any) -> Any:
        return await self.scripts.repo[script](keys=self._fixed, args=["", *args])

    # --- sync ---------------------------------------------------------------------------

    @translate_errors
    async def sync_issues(self, items: list[dict[str, Any]], *, epoch: int = 0) -> UpsertResult:
        """Write issues and their index entries (sync_upsert.lua), fenced by `epoch`."""
        if not items:
            return UpsertResult()
        res = await self._run("sync_upsert", json.dumps(items), iso_from_ms(now_ms()), epoch)
        suspects = json.loads(_text(res[4]))
        return UpsertResult(
            written=int(res[0]),
            readied=int(res[1]),
            revoked=int(res[2]),
            adopted=int(res[3]),
            # cjson writes an empty list as {}.
            suspects={int(s["n"]): list(s["missing"]) for s in (suspects if suspects else [])},
            restored=int(res[5]),
        )

    async def upsert_issues(
        self, items: list[dict[str, Any]], *, epoch: int = 0
    ) -> tuple[int, int, int, int]:
        """Write issues and their index entries; returns (written, readied, revoked, adopted)."""
        r = await self.sync_issues(items, epoch=epoch)
        return r.written, r.readied, r.revoked, r.adopted

    @translate_errors
    async def remove_issues(self, numbers: list[int], *, epoch: int = 0) -> tuple[int, int]:
        if not numbers:
            return 0, 0
        removed, revoked = await self._run("sync_remove", json.dumps(numbers), epoch)
        return int(removed), int(revoked)

    @translate_errors
    async def open_numbers(self) -> set[int]:
        return {int(n) for n in await _aw(self.client.smembers(self.keys.open))}

    @translate_errors
    async def sync_state(self) -> dict[str, str]:
        raw = await _aw(self.client.hgetall(self.keys.sync))
        return {_text(k): _text(v) for k, v in raw.items()}

    @translate_errors
    async def save_sync_state(
        self,
        values: dict[str, str],
        *,
        pages: dict[str, str] | None = None,
        drop_pages: list[str] | None = None,
        rebuilt: str | bool = "",
        epoch: int = 0,
    ) -> None:
        """Cursors (small, read every pass) and full-pass page data (read by full passes).
        `rebuilt`: the `full_started` cursor of the full pass that just finished; the mirror
        is marked complete if it is still there (True: mark it regardless, for tests that
        fill Redis by hand). Fenced by `epoch`."""
        if rebuilt is True:
            rebuilt = "seeded"
            values = {**(values or {}), "full_started": rebuilt}
        await self._run(
            "sync_save",
            json.dumps(values or {}),
            json.dumps(pages or {}),
            json.dumps(drop_pages or []),
            rebuilt or "",
            epoch,
        )

    @translate_errors
    async def mirror_rebuilt(self) -> bool:
        """Whether a complete sync pass has rebuilt the mirror since Redis last lost it."""
        return bool(await _aw(self.client.exists(self.keys.mirror)))

    @translate_errors
    async def sync_pages(self) -> dict[str, str]:
        raw = await _aw(self.client.hgetall(self.keys.sync_pages))
        return {_text(k): _text(v) for k, v in raw.items()}

    @translate_errors
    async def get_issue(self, number: int) -> Issue | None:
        raw = await _aw(self.client.get(self.keys.issue(number)))
        return Issue.model_validate_json(raw) if raw else None

    @translate_errors
    async def get_issues(self, numbers: list[int]) -> list[Issue]:
        if not numbers:
            return []
        raws = await self.client.mget([self.keys.issue(n) for n in numbers])
        return [Issue.model_validate_json(r) for r in raws if r]

    # --- claims and leases --------------------------------------------------------------

    @translate_errors
    async def claim(
        self,
        agent_id: str,
        *,
        previous: str,
        mode: str,
        base_branch: str,
        roles: list[str] | None,
        settle_only: bool = False,
        skip_issue: int | None = None,
        request_id: str | None = None,
    ) -> Claimed | NoTask:
        """Settle the agent's held task with `previous`, then lease the next task (one call).
        A `request_id` seen before gets the same task and lease again (see claim.lua)."""
        token = secrets.token_urlsafe(18)
        res = await self._run(
            "claim",
            agent_id,
            token,
            previous,
            mode,
            base_branch,
            CLAIM_SCAN,
            "1" if settle_only else "0",
            "" if skip_issue is None else str(skip_issue),
            request_id or "",
            *(roles or []),
        )
        if int(res[0]) == 0:
            _, reason, settled, outcome, bucket = res
            return NoTask(
                reason=_text(reason),
                bucket=int(bucket) if int(bucket) >= 0 else None,
                settled_issue=int(settled) if _text(settled) else None,
                settled_outcome=_text(outcome) if _text(settled) else None,
            )
        _, task_id, _n, tok, expires, issue, role, branch, settled, outcome, payload = res
        return Claimed(
            repository=self.repository,
            task_id=_text(task_id),
            task_type=TaskType(_text(task_id).split(":")[0]),
            issue=Issue.model_validate_json(issue),
            role=_text(role),
            branch=_text(branch),
            token=_text(tok),
            expires_ms=int(expires),
            settled_issue=int(settled) if _text(settled) else None,
            settled_outcome=_text(outcome) if _text(settled) else None,
            payload=json.loads(payload) if payload else None,
        )

    @translate_errors
    async def put_task(
        self,
        task_id: str,
        *,
        score: int,
        role: str,
        pr: int,
        author: str,
        branch: str,
        payload: dict[str, Any],
        direct: bool = False,
    ) -> int:
        """Offer a review or fix task (see task_put.lua): 1 added, 2 waiting review refreshed,
        0 when it exists or isn't wanted."""
        res = await self._run(
            "task_put",
            task_id,
            score,
            role,
            pr,
            author,
            branch,
            json.dumps(payload),
            self.settings.review.fix_task_ttl_s,
            "1" if direct else "0",
        )
        return int(res)

    @translate_errors
    async def want_labels(self, number: int, add: list[str], remove: list[str]) -> None:
        """Queue a label change on an issue or pull request."""
        await self._run("labels_want", number, json.dumps(add), json.dumps(remove))

    @translate_errors
    async def reviewing(self) -> list[int]:
        return sorted(int(n) for n in await _aw(self.client.smembers(self.keys.reviewing)))

    @translate_errors
    async def review_states(
        self, numbers: list[int]
    ) -> dict[int, tuple[str | None, dict[str, str]]]:
        """Per issue: (review_issue_detected_timestamp, review_state hash)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for n in numbers:
                pipe.get(self.keys.review_detected(n))
                pipe.hgetall(self.keys.review_state(n))
            rows = await pipe.execute()
        out = {}
        for i, n in enumerate(numbers):
            detected, state = rows[2 * i], rows[2 * i + 1]
            out[n] = (
                _text(detected) if detected else None,
                {_text(k): _text(v) for k, v in state.items()},
            )
        return out

    @translate_errors
    async def mark_review_state(self, number: int, field: str, value: str) -> None:
        await _aw(self.client.hset(self.keys.review_state(number), field, value))

    @translate_errors
    async def fix_task(self, pr: int) -> dict[str, Any] | None:
        raw = await _aw(self.client.get(self.keys.fix_task(pr)))
        return json.loads(raw) if raw else None

    @translate_errors
    async def heartbeat(
        self, number: int, agent_id: str, token: str
    ) -> tuple[bool, int | LeaseRefusal]:
        """(True, expires_ms) or (False, why)."""
        ok, value = await self._run("heartbeat", number, agent_id, token)
        if not int(ok):
            return False, _refusal(value)
        return True, int(value)

    @translate_errors
    async def finish(
        self, number: int, agent_id: str, token: str, outcome: str, *, counted: bool = True
    ) -> tuple[bool, str]:
        """(True, outcome) or (False, why: a LeaseRefusal). `counted=False`: a failure that is
        not the agent's (it never saw the task) spends no failure budget."""
        ok, value = await self._run(
            "finish", number, agent_id, token, outcome, "1" if counted else "0"
        )
        return (True, _text(value)) if int(ok) else (False, _refusal(value))

    @translate_errors
    async def reap(self, limit: int = 100, *, epoch: int = 0) -> int:
        return int(await self._run("reap", limit, epoch))

    @translate_errors
    async def candidate(self, number: int, agent_id: str) -> dict[str, Any] | None:
        raw = await _aw(self.client.get(self.keys.task_candidate(number, agent_id)))
        return json.loads(raw) if raw else None

    @translate_errors
    async def leases(self) -> list[LeaseInfo]:
        numbers = [int(n) for n in await self.client.zrange(self.keys.leases, 0, -1)]
        async with self.client.pipeline(transaction=False) as pipe:
            for n in numbers:
                pipe.hgetall(self.keys.lease(n))
            rows = await pipe.execute()
        out = []
        for n, row in zip(numbers, rows, strict=True):
            if not row:
                continue
            h = {_text(k): _text(v) for k, v in row.items()}
            out.append(
                LeaseInfo(
                    repository=self.repository,
                    issue=n,
                    agent_id=h["agent"],
                    task_type=h["task_type"],
                    claimed_ms=int(h["claimed_ms"]),
                    expires_ms=int(h["expires_ms"]),
                )
            )
        return out

    @translate_errors
    async def ready_tasks(self, role: str | None = None) -> list[tuple[str, float]]:
        key = self.keys.ready_role(role) if role else self.keys.ready
        return [
            (_text(m), float(s)) for m, s in await self.client.zrange(key, 0, -1, withscores=True)
        ]

    @translate_errors
    async def task_index(self) -> dict[str, tuple[float, str, str]]:
        """Every task the rules allow, held or not: id -> (score, role, branch)."""
        out = {}
        for task_id, raw in (await _aw(self.client.hgetall(self.keys.tasks))).items():
            score, role, _pr, _author, _since, branch = _text(raw).split("|", 5)
            out[_text(task_id)] = (float(score), role, branch)
        return out

    @translate_errors
    async def existing_tasks(self, task_ids: list[str]) -> set[str]:
        """Those of `task_ids` that are in the tasks hash (one HMGET, not the whole hash)."""
        if not task_ids:
            return set()
        values = await _aw(self.client.hmget(self.keys.tasks, task_ids))
        return {t for t, v in zip(task_ids, values, strict=True) if v is not None}

    @translate_errors
    async def default_branch(self) -> str | None:
        raw = await _aw(self.client.hget(self.keys.sync, "default_branch"))
        return _text(raw) if raw else None

    @translate_errors
    async def bucket(self) -> int | None:
        top = await self.client.zrange(self.keys.work, 0, 0, withscores=True)
        return int(top[0][1]) if top else None

    @translate_errors
    async def work_priorities(self) -> dict[int, int]:
        return {
            int(m): int(s)
            for m, s in await self.client.zrange(self.keys.work, 0, -1, withscores=True)
        }

    @translate_errors
    async def skipped(self) -> dict[int, SkipReason]:
        raw = await _aw(self.client.hgetall(self.keys.skipped))
        return {int(k): SkipReason.model_validate_json(v) for k, v in raw.items()}

    # --- GitHub write queue -------------------------------------------------------------

    @translate_errors
    async def outbox_take(
        self, limit: int, hide_ms: int, *, epoch: int = 0
    ) -> list[tuple[str, str, int]]:
        flat = await self._run("outbox_take", limit, hide_ms, epoch)
        return [
            (_text(flat[i]), _text(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat), 3)
        ]

    @translate_errors
    async def outbox_done(
        self,
        job: str,
        payload: str,
        retry_in_ms: int = -1,
        *,
        attempted: bool = True,
        epoch: int = 0,
    ) -> bool:
        """Settle a taken job: done (retry_in_ms -1) or due again later; only `attempted`
        failures count toward dropping it. Fenced by `epoch`."""
        res = await self._run(
            "outbox_done", job, payload, retry_in_ms, "1" if attempted else "0", epoch
        )
        return bool(int(res))

    @translate_errors
    async def outbox_size(self) -> int:
        return int(await _aw(self.client.zcard(self.keys.outbox)))

    @translate_errors
    async def outbox_lag_s(self) -> float:
        """Age in seconds of the oldest due write (0 when none is due): how far GitHub lags
        behind the broker's wishes. A job keeps its first due time while wishes merge into it."""
        oldest = await self.outbox_oldest_due_ms()
        return 0.0 if oldest is None else max(0.0, (now_ms() - oldest) / 1000)

    @translate_errors
    async def outbox_due(self, limit: int) -> dict[str, int]:
        """Up to `limit` jobs due now -> since when they are due (ms); read-only."""
        rows = await _aw(
            self.client.zrangebyscore(
                self.keys.outbox, "-inf", now_ms(), start=0, num=limit, withscores=True
            )
        )
        return {_text(job): int(score) for job, score in rows}

    @translate_errors
    async def outbox_oldest_due_ms(self) -> int | None:
        """When the longest-waiting write became due (ms), None when the queue is empty."""
        rows = await _aw(self.client.zrange(self.keys.outbox, 0, 0, withscores=True))
        return int(rows[0][1]) if rows else None

    @translate_errors
    async def intent(self, number: int) -> dict[str, Any] | None:
        """The label writes still to do and the labels written but not yet seen by a sync:
        {"add": [...], "remove": [...], "on": [...], "v": n}."""
        raw = await _aw(self.client.hget(self.keys.intent, str(number)))
        if not raw:
            return None
        data = json.loads(raw)
        # Redis's cjson writes an empty list as {}, fakeredis's as []: both mean none.
        return {
            "add": list(data.get("add") or []),
            "remove": list(data.get("remove") or []),
            "on": list(data.get("on") or []),
            "v": data.get("v"),
        }

    # --- webhook deliveries -------------------------------------------------------------

    @translate_errors
    async def enqueue_webhook(self, delivery_id: str, envelope: str, ttl_s: int) -> bool:
        """Queue a verified delivery; False when this delivery id was queued before."""
        keys = [
            self.keys.webhook_delivery(delivery_id),
            self.keys.webhooks,
            self.keys.webhooks_seen,
        ]
        return bool(int(await self.scripts.webhook_enqueue(keys=keys, args=[envelope, ttl_s])))

    @translate_errors
    async def take_webhook(self, timeout_s: float) -> str | None:
        """The oldest queued delivery, moved to the in-flight list; waits up to `timeout_s`
        (0: does not wait)."""
        src, dst = self.keys.webhooks, self.keys.webhooks_inflight
        if timeout_s <= 0:
            raw = await self.client.lmove(src, dst, "RIGHT", "LEFT")
        else:
            # Redis takes fractional seconds; redis-py's stubs say int.
            raw = await self.client.blmove(src, dst, cast(int, timeout_s), "RIGHT", "LEFT")
        return _text(raw) if raw is not None else None

    @translate_errors
    async def webhook_done(self, envelope: str) -> None:
        await _aw(self.client.lrem(self.keys.webhooks_inflight, 1, envelope))

    @translate_errors
    async def requeue_inflight_webhooks(self) -> int:
        """Put deliveries a crashed worker took back at the head of the queue."""
        moved = 0
        while await self.client.lmove(
            self.keys.webhooks_inflight, self.keys.webhooks, "LEFT", "RIGHT"
        ):
            moved += 1
        return moved

    @translate_errors
    async def webhook_backlog(self) -> int:
        return int(await _aw(self.client.llen(self.keys.webhooks)))

    @translate_errors
    async def mark_webhooks_seen(self) -> None:
        """A verified ping: the webhook is alive even before any change is delivered."""
        await self.client.set(self.keys.webhooks_seen, int(time.time() * 1000))

    @translate_errors
    async def webhooks_seen_ms(self) -> int | None:
        raw = await _aw(self.client.get(self.keys.webhooks_seen))
        return int(raw) if raw else None

    @translate_errors
    async def issue_version(self, number: int) -> str | None:
        raw = await _aw(self.client.get(self.keys.issue_version(number)))
        return _text(raw) if raw else None

    @translate_errors
    async def set_issue_version(self, number: int, version: str, ttl_s: int) -> None:
        await self.client.set(self.keys.issue_version(number), version, ex=ttl_s)

    # --- timeline and write outcomes (the dashboard) ------------------------------------

    @translate_errors
    async def record_event(
        self, kind: str, number: int | None = None, agent: str = "", detail: str = ""
    ) -> None:
        await _xadd(self.client, self.keys.timeline, kind, number, agent, detail)

    @translate_errors
    async def timeline(self, count: int = 50) -> list[Event]:
        """The most recent events, newest first."""
        entries = await self.client.xrevrange(self.keys.timeline, count=count)
        return _events(entries, self.repository)

    @translate_errors
    async def timeline_since(self, after_id: str, count: int = 100) -> list[Event]:
        """Events after `after_id` ("0-0": from the start), oldest first."""
        reply = await self.client.xread({self.keys.timeline: after_id}, count=count)
        entries = reply[0][1] if reply else []
        return _events(entries, self.repository)

    @translate_errors
    async def record_write(self, outcome: str, job: str, detail: str = "") -> None:
        """Count a GitHub write outcome (applied, refused: a 4xx to retry, dropped) and put
        it on the timeline."""
        kind, _, number = job.partition(":")
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(self.keys.outbox_stats, outcome, 1)
            pipe.xadd(
                self.keys.timeline,
                {"kind": f"write_{outcome}", "n": number, "agent": "", "detail": detail or kind},
                maxlen=TIMELINE_MAX,
                approximate=True,
            )
            await pipe.execute()

    @translate_errors
    async def write_queue(self) -> dict[str, Any]:
        """Pending jobs, when the oldest was due, jobs refused at least once, outcome counts."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.outbox)
            pipe.zrange(self.keys.outbox, 0, 0, withscores=True)
            pipe.hlen(self.keys.outbox_attempts)
            pipe.hgetall(self.keys.outbox_stats)
            pending, oldest, refusing, stats = await pipe.execute()
        counts = {_text(k): int(v) for k, v in stats.items()}
        return {
            "pending": int(pending),
            "oldest_due_ms": int(oldest[0][1]) if oldest else None,
            "refusing": int(refusing),
            "applied": counts.get("applied", 0),
            "refused": counts.get("refused", 0),
            "dropped": counts.get("dropped", 0),
        }

    @translate_errors
    async def agent_streaks(self) -> dict[str, int]:
        """Consecutive failures per agent (the failure budget's hash), when it exists."""
        raw = await _aw(self.client.hgetall(self.keys.agent_streaks))
        return {_text(k): int(v) for k, v in raw.items() if int(v) > 0}


async def _xadd(
    client: Any, key: str, kind: str, number: int | None, agent: str, detail: str
) -> None:
    fields = {"kind": kind, "n": "" if number is None else str(number), "agent": agent}
    fields["detail"] = detail
    await client.xadd(key, fields, maxlen=TIMELINE_MAX, approximate=True)


def _events(entries: list[Any], repository: str | None) -> list[Event]:
    out = []
    for entry_id, raw in entries:
        f = {_text(k): _text(v) for k, v in raw.items()}
        out.append(
            Event(
                at_ms=int(_text(entry_id).split("-")[0]),
                kind=f.get("kind", ""),
                id=_text(entry_id),
                repository=repository,
                issue=int(f["n"]) if f.get("n") else None,
                agent=f.get("agent", ""),
                detail=f.get("detail", ""),
            )
        )
    return out


class Store:
    """All repositories' stores plus the deployment-wide keys."""

    def __init__(self, client: Any, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.call_timeout_s = settings.redis.socket_timeout_s
        self.pubsub_client = _pubsub_client(
            settings.redis.url,
            client,
            _timeouts(settings.redis.socket_timeout_s, settings.redis.connect_timeout_s),
        )
        self.scripts = Scripts(client)
        self.global_keys = GlobalKeys(settings.redis.key_prefix)
        self.repos = {
            r.full_name: RepoStore(
                client, self.scripts, RepoKeys(settings.redis.key_prefix, r.owner, r.name), settings
            )
            for r in settings.repositories
        }

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
        await self.client.aclose()

    def repo(self, full_name: str) -> RepoStore:
        return self.repos[full_name]

    async def ping(self, timeout_s: float = PING_TIMEOUT_S) -> bool:
        """Whether Redis answers within `timeout_s` (a hung Redis fails fast: /ready)."""
        try:
            async with asyncio.timeout(timeout_s):
                return bool(await self.client.ping())
        except TimeoutError as e:
            raise StoreUnavailable(f"Redis did not answer within {timeout_s:g}s") from e
        except (redis.exceptions.RedisError, OSError) as e:
            raise StoreUnavailable(f"Redis unavailable: {e}") from e

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

    @asynccontextmanager
    async def agent_mutex(self, agent_id: str) -> AsyncIterator[None]:
        """One request of `agent_id` at a time (deployments with several repositories, whose
        claims are one script per repository and so not atomic across them).

        The hold is proportional to the work: a request runs one settling round (one script per
        repository, concurrently) and, per repository, at most a default-branch lookup and a
        claim, each bounded by `call_timeout_s`; so the key lives that many call bounds plus a
        margin, and another request of the agent waits at most as long. A SET or release that
        got no answer (Redis stalled or unreachable) may still be run by Redis later, leaving a
        mutex nobody would release: its compare-and-delete is retried in the background until
        Redis deletes the token, or answers twice in a row (the second sent after the first
        reply, so after anything Redis had queued) that the key no longer holds it."""
        key, token = self.global_keys.agent_busy(agent_id), secrets.token_hex(8)
        calls = 1 + 2 * len(self.repos) + AGENT_MUTEX_MARGIN_CALLS
        hold_s = self.call_timeout_s * calls

        async def release() -> bool:
            async with asyncio.timeout(self.call_timeout_s):
                return bool(await self.client.eval(_RELEASE_MUTEX, 1, key, token))

        async def retry_release() -> None:
            give_up, answered = time.monotonic() + AGENT_MUTEX_RETRY_S, False
            while time.monotonic() < give_up:
                try:
                    if await release() or answered:
                        return
                    answered = True
                    continue
                except (redis.exceptions.RedisError, OSError, TimeoutError):
                    answered = False
                await asyncio.sleep(AGENT_MUTEX_RETRY_PAUSE_S)

        def release_later() -> None:
            retry = asyncio.get_running_loop().create_task(retry_release())
            _MUTEX_RETRIES.add(retry)
            retry.add_done_callback(_MUTEX_RETRIES.discard)

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
            release_later()
            raise StoreUnavailable(f"Redis did not answer within {self.call_timeout_s:g}s") from e
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as e:
            release_later()
            raise StoreUnavailable(f"Redis unavailable: {e}") from e
        except asyncio.CancelledError:
            release_later()
            raise
        try:
            yield
        finally:
            try:
                await release()
            except (redis.exceptions.RedisError, OSError, TimeoutError):
                release_later()
            except asyncio.CancelledError:
                release_later()
                raise

    @translate_errors
    async def leader_id(self) -> str | None:
        raw = await _aw(self.client.get(self.global_keys.leader))
        return _text(raw) if raw else None

    @translate_errors
    async def save_quota(self, quota: Quota) -> None:
        await self.client.set(self.global_keys.quota, quota.model_dump_json())

    @translate_errors
    async def quota(self) -> Quota | None:
        raw = await _aw(self.client.get(self.global_keys.quota))
        return Quota.model_validate_json(raw) if raw else None

    @translate_errors
    async def record_event(
        self, kind: str, number: int | None = None, agent: str = "", detail: str = ""
    ) -> None:
        """A deployment-wide event (leader changes) on the global timeline."""
        await _xadd(self.client, self.global_keys.timeline, kind, number, agent, detail)

    @translate_errors
    async def timeline(self, count: int = 50) -> list[Event]:
        """Recent events of every repository and the deployment, newest first."""
        events = _events(await self.client.xrevrange(self.global_keys.timeline, count=count), None)
        for rstore in self.repos.values():
            events += await rstore.timeline(count)
        return sorted(events, key=lambda e: e.at_ms, reverse=True)[:count]

    @asynccontextmanager
    async def ready_events(self) -> AsyncIterator[asyncio.Queue[str]]:
        """Subscribe to every repository's "a task became claimable" channel."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        pubsub = self.pubsub_client.pubsub()
        channels = [r.keys.events for r in self.repos.values()]
        try:
            if channels:
                try:
                    await pubsub.subscribe(*channels)
                except (
                    redis.exceptions.ConnectionError,
                    redis.exceptions.TimeoutError,
                    OSError,
                ) as e:
                    raise StoreUnavailable(f"Redis unavailable: {e}") from e
            reader = asyncio.create_task(self._pump(pubsub, queue))
            try:
                yield queue
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        finally:
            await pubsub.aclose()

    async def _pump(self, pubsub: Any, queue: asyncio.Queue[str]) -> None:
        while True:
            try:
                msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                # TimeoutError: a reconnect whose handshake Redis does not answer in time (a
                # stalled Redis, a proxy that accepts while Redis is down). Not caught, it ended
                # this task for good and long-polls were only woken by their re-check.
                await asyncio.sleep(1.0)
                continue
            if msg is not None:
                queue.put_nowait(_text(msg["channel"]))
