"""This process's copy of the deployment's index of repositories with work.

Each repository's scripts keep its line in `idx` (`<mirrored>|<bucket>|<any ready>|<roles
with ready tasks>`, _lib.lua `publish_index`) and publish every change on the deployment's
events channel; every serve process applies those messages and reloads all lines now and
then (a message lost while Redis reconnected costs at most RELOAD_S). A request with several
repositories asks only those the index says have work for its roles, however many are
configured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from github_broker.store import Store

#: Seconds between two reloads of every repository's line (the safety net under pub/sub).
RELOAD_S = 5.0


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
    """Which repositories have claimable work, for which roles, at which bucket."""

    def __init__(self) -> None:
        self.lines: dict[str, Line] = {}
        self.loaded_at = 0.0

    def apply(self, message: str) -> bool:
        """An `idx <repository> <line>` message; True if it was one."""
        kind, _, rest = message.partition("\t")
        if kind != "idx":
            return False
        repository, _, text = rest.partition("\t")
        self.lines[repository] = Line.parse(text)
        return True

    async def reload(self, store: Store) -> None:
        lines = await store.index_lines()
        self.lines = {name: Line.parse(text) for name, text in lines.items()}
        self.loaded_at = time.monotonic()

    def stale(self) -> bool:
        return time.monotonic() - self.loaded_at > RELOAD_S

    def with_work(self, roles: list[str] | None, names: set[str]) -> dict[str, int | None]:
        """Of `names`, those with a ready task for `roles` (None: any role), by bucket."""
        out = {}
        for name in names:
            line = self.lines.get(name)
            if line is None or not line.mirrored:
                continue
            if (line.roles & set(roles)) if roles else line.any_ready:
                out[name] = line.bucket
        return out

    def unmirrored(self, names: set[str]) -> set[str]:
        """Of `names`, those whose mirror is not rebuilt (first sync, Redis lost its data)."""
        return {n for n in names if not ((line := self.lines.get(n)) and line.mirrored)}
