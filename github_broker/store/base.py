"""What every part of a repository's store shares."""

from __future__ import annotations

from typing import Any

from github_broker.keys import RepoKeys
from github_broker.settings import Settings
from github_broker.store.scripts import Scripts


class RepoBase:
    """The client, keys and compiled scripts of one repository (set by `RepoStore`)."""

    client: Any
    scripts: Scripts
    keys: RepoKeys
    settings: Settings
    repository: str
    #: Longest one store call may take, reconnects included (seconds).
    call_timeout_s: float
    _fixed: list[bytes]

    async def _run(self, script: str, *args: Any) -> Any:
        return await self.scripts.repo[script](keys=self._fixed, args=["", *args])
