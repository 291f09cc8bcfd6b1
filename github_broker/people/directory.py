"""Who a credential names: the administrator of `server.admin_token` (named `admin`) and the
people of `server.maintainers_file` (re-read when it changes), found by their token's SHA-256
and compared in constant time; the file keeps only digests, never a token."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from github_broker.models import Actor, Authority
from github_broker.people.watched import WatchedFile
from github_broker.settings import MaintainerEntry, ServerSettings
from github_broker.settings.people import ADMIN_NAME


@dataclass(frozen=True)
class Person:
    """Someone who steers: their name, authority, the repositories they maintain (None: an
    administrator, every repository), their GitHub login and whether GitHub's permissions add
    repositories (`github_rights`)."""

    name: str
    authority: Authority
    repositories: frozenset[str] | None = None
    github: str | None = None
    github_rights: bool = False
    #: A short digest of the credential the person holds: a dashboard session keeps it, so a
    #: token changed in the file ends the sessions it opened.
    stamp: str = ""

    def actor(self, granted: Iterable[str] = ()) -> Actor:
        """The person acting, with the repositories GitHub granted them (`granted`) added."""
        if self.repositories is None:
            return Actor(self.name, self.authority)
        return Actor(self.name, self.authority, self.repositories | frozenset(granted))


def token_digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()


def _stamp(digest: bytes) -> str:
    return hashlib.sha256(b"github-broker person stamp:" + digest).hexdigest()[:16]


def _person(name: str, entry: MaintainerEntry) -> tuple[bytes, Person]:
    digest = bytes.fromhex(entry.token_sha256)
    admin = entry.authority == "admin"
    return digest, Person(
        name,
        Authority.ADMIN if admin else Authority.MAINTAINER,
        None if admin else frozenset(entry.repositories),
        entry.github,
        entry.github_rights and not admin,
        _stamp(digest),
    )


class People:
    """Everyone a token may name; the maintainers file is re-read when it changes (a person
    removed there is refused from then on)."""

    def __init__(self, server: ServerSettings, served: Collection[str] = ()) -> None:
        self.server = server
        served_set = set(served) or None
        admin = server.admin_token.get_secret_value() if server.admin_token else None
        self._admin: tuple[bytes, Person] | None = None
        if admin is not None:
            digest = token_digest(admin.encode("utf-8", "surrogateescape"))
            self._admin = (digest, Person(ADMIN_NAME, Authority.ADMIN, stamp=_stamp(digest)))
        self._file = WatchedFile(
            server.maintainers_file,
            lambda: self._index(server.resolved_maintainers(served_set)),
            "maintainers file",
        )

    def _index(self, entries: dict[str, MaintainerEntry]) -> dict[bytes, tuple[bytes, Person]]:
        """digest -> (digest, person): the stored digest is what the presented one is
        compared with."""
        pairs = [_person(name, entry) for name, entry in entries.items()]
        if self._admin is not None:
            pairs.append(self._admin)
        return {digest: (digest, person) for digest, person in pairs}

    @property
    def configured(self) -> bool:
        """Whether anyone can be named (an admin token or a maintainers file)."""
        return self._admin is not None or self.server.maintainers_file is not None

    def by_token(self, raw: bytes) -> Person | None:
        """The person whose token this is: one dict lookup by digest, then the digest compared
        in constant time."""
        digest = token_digest(raw)
        found = self._file.current().get(digest)
        if found is None:
            return None
        return found[1] if hmac.compare_digest(found[0], digest) else None

    def named(self, name: str) -> Person | None:
        return next((p for _, p in self._file.current().values() if p.name == name), None)

    def by_github(self, login: str) -> Person | None:
        """The person of the file whose GitHub login this is (case-insensitive, as GitHub)."""
        wanted = login.lower()
        return next(
            (p for _, p in self._file.current().values() if (p.github or "").lower() == wanted),
            None,
        )
