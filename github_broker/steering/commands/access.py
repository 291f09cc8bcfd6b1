"""Who may steer from a comment: people with write access to the repository, as GitHub's
permission API reports it (`GET /repos/{o}/{r}/collaborators/{user}/permission`).

An answer is kept in Redis per (repository, login) for `commands.permission_cache_s`, shared
by the webhook worker and the poller and kept across a change of leader, so a flood of
comments by one account costs at most one call per that time; asking again after it is a
conditional request (a free 304 while the permission did not change). Lookups of accounts
not in the cache are paced as well (`commands.lookups_per_hour`), so a flood from many
accounts cannot spend more either: past it, comments wait for the next look.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from github_broker.errors import GitHubError, RateLimited
from github_broker.gateway import GitHubGateway
from github_broker.gateway.pacing import TokenBucket
from github_broker.settings import Settings
from github_broker.store import Store
from github_broker.store.comments import CommentLedger

logger = logging.getLogger(__name__)

#: GitHub roles that may steer (`role`: read from the permission flags, so maintain counts).
ALLOWED = frozenset({"admin", "maintain", "write"})
#: Recorded when GitHub would not say (the broker's token lacks push access): refused.
UNKNOWN = "unknown"


def is_bot(user: dict[str, Any]) -> bool:
    """Bots (Apps, Dependabot, CI) never steer: no call is spent on them."""
    return user.get("type") == "Bot" or str(user.get("login", "")).endswith("[bot]")


class Access:
    """Write access of commenters, cached in Redis; the broker's own login."""

    def __init__(self, settings: Settings, store: Store, gateway: GitHubGateway) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        per_hour = settings.commands.lookups_per_hour
        self.lookups = TokenBucket(per_hour / 3600, max(1, per_hour // 4))

    async def own_login(self) -> str:
        """The login the broker comments as ('' for a GitHub App, whose comments are a bot's);
        read once per process."""
        return await asyncio.to_thread(self.gateway.login)

    async def permission(self, repository: str, login: str) -> str:
        """`login`'s permission on `repository`: from the cache, else from GitHub.

        RateLimited when the lookup budget is spent (the comment waits for the next look);
        GitHubUnavailable and RateLimited from GitHub pass through the same way."""
        ledger = CommentLedger(self.store.repo(repository))
        cached = await ledger.permission(login)
        if cached is not None:
            return cached
        wait = self.lookups.wait_s()
        if wait > 0:
            raise RateLimited(
                "permission lookups for comment commands spent "
                f"({self.settings.commands.lookups_per_hour} an hour)",
                retry_at_s=time.time() + wait,
            )
        self.lookups.take()
        try:
            permission = await asyncio.to_thread(self.gateway.role, repository, login)
        except RateLimited:
            raise
        except GitHubError as e:
            # 403: the broker's token may not read permissions (it needs push access itself).
            logger.warning(
                "%s: cannot read the permission of %s (%s): their commands are refused",
                repository,
                login,
                e,
            )
            permission = UNKNOWN
        await ledger.remember_permission(
            login, permission, self.settings.commands.permission_cache_s
        )
        return permission
