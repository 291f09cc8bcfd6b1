"""The CI and mergeability of the tracked PRs (`checks`), and the upkeep script that turns
them into waits on a person, withdrawn fix tasks and notes (checks_upkeep.lua)."""

from __future__ import annotations

import json
from typing import Any

from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors


class ChecksStore(RepoBase):
    """What the leader last read of each tracked PR's checks and mergeability."""

    @translate_errors
    async def checks_records(self, numbers: list[int] | None = None) -> dict[int, dict[str, Any]]:
        """Per issue, the record leader/checks.py keeps (all of them when `numbers` is None)."""
        if numbers is None:
            raw = await awaited(self.client.hgetall(self.keys.checks))
            return {int(as_text(k)): json.loads(v) for k, v in raw.items()}
        if not numbers:
            return {}
        values = await awaited(self.client.hmget(self.keys.checks, [str(n) for n in numbers]))
        return {n: json.loads(v) for n, v in zip(numbers, values, strict=True) if v}

    @translate_errors
    async def save_checks(self, number: int, record: dict[str, Any]) -> None:
        await awaited(self.client.hset(self.keys.checks, str(number), json.dumps(record)))

    @translate_errors
    async def drop_checks(self, numbers: list[int]) -> None:
        if numbers:
            await awaited(self.client.hdel(self.keys.checks, *[str(n) for n in numbers]))

    @translate_errors
    async def checks_upkeep(self, action: str, number: int, *args: str) -> bool:
        """withdraw | wait | unwait | note (see checks_upkeep.lua); True when it changed
        something."""
        return int(await self._run("checks_upkeep", action, number, *args)) == 1
