"""What every part of a repository's store shares."""

from __future__ import annotations

import hashlib
from typing import Any

import redis.exceptions

from github_broker.errors import NotDurable
from github_broker.keys import RepoKeys
from github_broker.settings import Settings
from github_broker.store.ended import EndedLeases
from github_broker.store.scripts import Scripts
from github_broker.store.tokens import Signer


class RepoBase:
    """The client, keys and the deployment's compiled scripts of one repository (set by
    `RepoStore`)."""

    client: Any
    scripts: Scripts
    signer: Signer
    ended: EndedLeases
    keys: RepoKeys
    settings: Settings
    repository: str
    #: Longest one store call may take, reconnects included (seconds).
    call_timeout_s: float
    _fixed: list[bytes]
    #: ARGV[1] of every repository script: the repository's full name.
    _name_arg: bytes
    #: The command that makes a write durable before it is answered (WAIT or WAITAOF with
    #: its arguments), empty when `redis.durability` is none or the server's own fsync does.
    durable_wait: tuple[Any, ...] = ()

    async def _run(self, script: str, *args: Any) -> Any:
        return await self.scripts.repo[script](keys=self._fixed, args=[self._name_arg, *args])

    async def _run_durable(self, script: str, *args: Any) -> Any:
        """`_run`, answered only once Redis has the write durably (`redis.durability`): the
        script and a WAIT (or WAITAOF) sent together on one pooled connection, since WAIT
        covers the writes of its own connection. Raises NotDurable when the bound is missed:
        the write is done in Redis, not yet safe from its loss (the caller's retry is)."""
        redis_settings = self.settings.redis
        wait = self.durable_wait
        if not wait:
            return await self._run(script, *args)
        source = self.scripts.sources[script]
        sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
        for _ in range(2):
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.execute_command(
                    "EVALSHA", sha, len(self._fixed), *self._fixed, self._name_arg, *args
                )
                pipe.execute_command(*wait)
                res, acked = await pipe.execute(raise_on_error=False)
            if isinstance(res, redis.exceptions.NoScriptError):
                await self.client.script_load(source)
                continue
            if isinstance(res, Exception):
                raise res
            got = int(acked[0] if isinstance(acked, list) else acked)
            needed = redis_settings.durable_replicas if wait[0] == "WAIT" else 1
            if got < needed:
                raise NotDurable(
                    f"the write was acknowledged by {got} of {needed} "
                    f"{'replicas' if wait[0] == 'WAIT' else 'append-only files'} within "
                    f"{redis_settings.durable_timeout_ms} ms: not durable yet; retry"
                )
            return res
        raise NotDurable("Redis forgot the script twice in a row; retry")
