"""Comment commands' own Redis state for one repository: which comments were taken up, the
poller's cursor over new issue comments, and commenters' permissions as GitHub reported them.

Plain single-key reads and writes (SET NX is the one check-then-write, atomic on its own): no
script, and nothing here touches a key another part writes.
"""

from __future__ import annotations

from github_broker.store.connection import as_text, awaited, translate_errors
from github_broker.store.repo import RepoStore


class CommentLedger:
    """One repository's `comments`, `comment:{id}` and `permission:{login}` keys."""

    def __init__(self, rstore: RepoStore) -> None:
        self.client = rstore.client
        self.keys = rstore.keys
        #: Longest one call may take (translate_errors reads it).
        self.call_timeout_s = rstore.call_timeout_s

    @translate_errors
    async def take_up(self, comment_id: int, ttl_s: int) -> bool:
        """True for the first caller only (the webhook worker or the poller), for `ttl_s`."""
        return bool(await self.client.set(self.keys.comment(comment_id), "1", nx=True, ex=ttl_s))

    @translate_errors
    async def give_back(self, comment_id: int) -> None:
        """Taken up but not acted on (GitHub could not be asked): the next look may."""
        await self.client.delete(self.keys.comment(comment_id))

    @translate_errors
    async def cursor(self) -> tuple[str | None, str | None]:
        """(newest `updated_at` read, ETag of that read's first page); None before any."""
        since, etag = await awaited(self.client.hmget(self.keys.comments, ["since", "etag"]))
        return (as_text(since) if since else None, as_text(etag) if etag else None)

    @translate_errors
    async def save_cursor(self, since: str, etag: str | None) -> None:
        await self.client.hset(self.keys.comments, mapping={"since": since, "etag": etag or ""})

    @translate_errors
    async def permission(self, login: str) -> str | None:
        raw = await awaited(self.client.get(self.keys.permission(login)))
        return as_text(raw) if raw else None

    @translate_errors
    async def remember_permission(self, login: str, permission: str, ttl_s: int) -> None:
        await self.client.set(self.keys.permission(login), permission, ex=ttl_s)
