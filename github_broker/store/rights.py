"""Where GitHub makes a person a maintainer, as last read: per GitHub login, each served
repository's role for them and when it was read (shared by every serve process)."""

from __future__ import annotations

from typing import Any

from github_broker.clock import now_ms
from github_broker.keys import GlobalKeys
from github_broker.store.connection import as_text, awaited, translate_errors


class GitHubRightsCache:
    """login -> {repository: role}, each entry trusted for the caller's `fresh_ms`."""

    def __init__(self, client: Any, keys: GlobalKeys) -> None:
        self.client = client
        self.keys = keys

    @translate_errors
    async def roles(self, login: str, fresh_ms: int) -> dict[str, str]:
        """The roles read less than `fresh_ms` ago."""
        raw = await awaited(self.client.hgetall(self.keys.rights(login)))
        since = now_ms() - fresh_ms
        found: dict[str, str] = {}
        for repo, value in raw.items():
            role, _, at = as_text(value).partition("|")
            if at.isdigit() and int(at) >= since:
                found[as_text(repo)] = role
        return found

    @translate_errors
    async def remember(
        self, login: str, roles: dict[str, str], keep_ms: int, *, whole: bool = False
    ) -> None:
        """Note `roles` read now; `whole`: they are every served repository's (a sign-in's
        listing), so the entries read before are dropped."""
        key = self.keys.rights(login)
        at = now_ms()
        async with self.client.pipeline(transaction=True) as pipe:
            if whole:
                pipe.delete(key)
            if roles:
                pipe.hset(key, mapping={repo: f"{role}|{at}" for repo, role in roles.items()})
            pipe.pexpire(key, keep_ms)
            await pipe.execute()
