"""Where GitHub makes a person a maintainer of a served repository, without one GitHub call per
repository per page view.

Two ways in, both cached in Redis per GitHub login (`store/rights.py`) for
`signin.github_rights_s`:

- **Signing in with GitHub** (a token pasted in, or the device flow): the person's own token
  reads who they are (`GET /user`) and lists their repositories with their permissions
  (`GET /user/repos`, 100 a page, at most `signin.github_max_pages` pages, on the person's
  quota): every served repository is settled at once, and the token is dropped.
- **A maintainer of the file with `github_rights: true`** (no GitHub token of theirs): when
  they act on a repository the file does not name, the broker asks GitHub once for their role
  there (`GET /repos/{o}/{r}/collaborators/{login}/permission`, with its own token, paced by
  `commands.lookups_per_hour`). Listings show them the repositories named in the file and
  those GitHub granted them so far.

A role grants what `signin.github_grants` says: `maintain` (maintain or admin) or `write`.
"""

from __future__ import annotations

import asyncio
import logging
import time

from github_broker.errors import GitHubError, RateLimited
from github_broker.gateway import GitHubGateway
from github_broker.gateway.pacing import TokenBucket
from github_broker.gateway.people import PersonalGitHub
from github_broker.models import Actor, Authority
from github_broker.people.directory import People, Person
from github_broker.settings import Settings
from github_broker.store import Store

logger = logging.getLogger(__name__)

#: Roles that make a person a maintainer, per `signin.github_grants`.
GRANTING = {
    "maintain": frozenset({"maintain", "admin"}),
    "write": frozenset({"write", "maintain", "admin"}),
}


class GitHubRights:
    """Maintainer rights from GitHub permissions, cached per login."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        people: People,
        personal: PersonalGitHub | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.people = people
        self.personal = personal or PersonalGitHub(settings.github)
        self.keep_ms = settings.signin.github_rights_s * 1000
        self.grants = GRANTING[settings.signin.github_grants]
        per_hour = settings.commands.lookups_per_hour
        self.lookups = TokenBucket(per_hour / 3600, max(1, per_hour // 4))

    def close(self) -> None:
        self.personal.close()

    async def actor(self, person: Person, repository: str | None = None) -> Actor:
        """`person` acting; with `github_rights`, also where GitHub made them a maintainer
        (`repository`, the one the request names, looked up when not known yet)."""
        if person.repositories is None or not person.github_rights or person.github is None:
            return person.actor()
        roles = await self.store.rights.roles(person.github, self.keep_ms)
        wanted = repository is not None and repository in self.store.repos
        if wanted and repository not in roles and repository not in person.repositories:
            assert repository is not None
            roles[repository] = await self._lookup(repository, person.github)
        return person.actor(r for r, role in roles.items() if role in self.grants)

    async def _lookup(self, repository: str, login: str) -> str:
        wait = self.lookups.wait_s()
        if wait > 0:
            raise RateLimited(
                f"GitHub permission lookups spent ({self.settings.commands.lookups_per_hour} an "
                "hour); try again shortly",
                retry_at_s=time.time() + wait,
            )
        self.lookups.take()
        try:
            role = await asyncio.to_thread(self.gateway.role, repository, login)
        except GitHubError as e:
            # 403: the broker's token may not read permissions (it needs push access itself).
            logger.warning(
                "%s: cannot read the role of %s (%s): not a maintainer", repository, login, e
            )
            role = "unknown"
        await self.store.rights.remember(login, {repository: role}, self.keep_ms)
        return role

    async def sign_in(self, token: str) -> Actor:
        """The person a GitHub token names, with their rights on every served repository read
        now (their own token, `GET /user` + `GET /user/repos` pages); the token is not kept.
        GitHubError when GitHub refuses the token."""
        login = await asyncio.to_thread(self.personal.login, token)
        served = {name.lower(): name for name in self.store.repos}
        roles = await asyncio.to_thread(
            self.personal.roles, token, served, self.settings.signin.github_max_pages
        )
        await self.store.rights.remember(login, roles, self.keep_ms, whole=True)
        logger.info("%s signed in with GitHub: roles on %d served repositories", login, len(roles))
        return await self.github_actor(login)

    async def github_actor(self, login: str) -> Actor:
        """Who a GitHub identity is here: the file's person with that `github` login (their
        own rights and authority, plus GitHub's), else `github:<login>`, a maintainer of the
        served repositories where GitHub grants them enough (as read at sign-in)."""
        roles = await self.store.rights.roles(login, self.keep_ms)
        granted = [r for r, role in roles.items() if role in self.grants]
        person = self.people.by_github(login)
        if person is not None:
            return person.actor(granted if person.github_rights else ())
        return Actor(f"github:{login}", Authority.MAINTAINER, frozenset(granted))
