"""This process's copy of the deployment's index of repositories with work.

Each repository's scripts keep its line in `idx` (`<mirrored>|<bucket>|<any ready>|<roles
with ready tasks>`, _lib.lua `publish_index`) and publish every change on the deployment's
events channel; every serve process applies those messages and reloads all lines now and
then: once subscribed, after every reconnect of the subscription (whose lost messages it
replaces) and every RELOAD_S. A request with several
repositories asks only those the index says have work for its roles, however many are
configured.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from github_broker.store import Store

#: Seconds between two reloads of every repository's line besides those after each
#: (re)subscription (`events.ReadyWaker`): the safety net under pub/sub.
RELOAD_S = 60.0


@dataclass(frozen=True)
class Line:
    """One repository's work, as its scripts last published it."""

    mirrored: bool
    bucket: int | None
    any_ready: bool
    roles: frozenset[str]

    @classmethod
    def parse(cls, text: str) -> Line:
        mirrored, bucket, any_ready, roles = [*text.split("|", 3), "", "", ""][:4]
        return cls(
            mirrored=mirrored == "1",
            bucket=int(bucket) if bucket.isdigit() else None,
            any_ready=any_ready == "1",
            roles=frozenset(r for r in roles.split(",") if r),
        )


class RepoIndex:
    """Which repositories have claimable work, for which roles, at which bucket; kept also
    as sets (any role, per role, mirrored) so a request's lookup costs what has work, not
    what is configured or asked."""

    def __init__(self) -> None:
        self.lines: dict[str, Line] = {}
        self.loaded_at = 0.0
        #: Mirrored repositories with a ready task (any role), and per role.
        self._ready: set[str] = set()
        self._by_role: dict[str, set[str]] = {}
        #: Repositories whose mirror is built.
        self._mirrored: set[str] = set()
        #: Messages applied so far, and the count when each repository's last one was: a
        #: reload keeps a line a message brought while its read was under way.
        self._applied = 0
        self._applied_at: dict[str, int] = {}

    def apply(self, message: str) -> bool:
        """An `idx <repository> <line>` message; True if it was one."""
        kind, _, rest = message.partition("\t")
        if kind != "idx":
            return False
        repository, _, text = rest.partition("\t")
        self._applied += 1
        self._applied_at[repository] = self._applied
        self._put(repository, Line.parse(text))
        return True

    async def reload(self, store: Store) -> None:
        """Every repository's line as Redis holds it now, except those a message changed
        while the read was under way (the message is newer than what the read saw)."""
        started = self._applied
        lines = await store.index_lines()
        newer = {
            n: line
            for n, at in self._applied_at.items()
            if at > started
            if (line := self.lines.get(n)) is not None
        }
        self.lines, self._ready, self._by_role, self._mirrored = {}, set(), {}, set()
        for name, text in lines.items():
            if name not in newer:
                self._put(name, Line.parse(text))
        for name, line in newer.items():
            self._put(name, line)
        self._applied_at = {n: at for n, at in self._applied_at.items() if at > started}
        self.loaded_at = time.monotonic()

    def _put(self, name: str, line: Line) -> None:
        old = self.lines.get(name)
        if old is not None:
            self._ready.discard(name)
            self._mirrored.discard(name)
            for role in old.roles:
                self._by_role.get(role, set()).discard(name)
        self.lines[name] = line
        if not line.mirrored:
            return
        self._mirrored.add(name)
        if line.any_ready:
            self._ready.add(name)
        for role in line.roles:
            self._by_role.setdefault(role, set()).add(name)

    def with_work(
        self, roles: list[str] | None, names: Collection[str] | None
    ) -> dict[str, int | None]:
        """Of `names` (None: all), those with a ready task for `roles` (None: any role), by
        bucket."""
        if roles:
            found: set[str] = set()
            for role in roles:
                found |= self._by_role.get(role, set())
        else:
            found = self._ready
        if names is not None:
            found = found.intersection(names)
        lines = self.lines
        return {name: lines[name].bucket for name in found}

    def unmirrored(self, names: Collection[str]) -> set[str]:
        """Of `names`, those whose mirror is not rebuilt (first sync, Redis lost its data)."""
        return set(names) - self._mirrored
