"""The people who steer the broker: the maintainers file (named tokens, an authority, the
repositories each maintains) and signing in to the dashboard with a GitHub identity."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from github_broker.settings.base import Section

#: A person's name: shown in the audit log, the dashboard header and comment replies.
PERSON_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,38}$")
#: Names the broker uses for itself; nobody may take them.
RESERVED_NAMES = frozenset({"broker", "dashboard", "cli"})
#: The name the single `server.admin_token` acts as.
ADMIN_NAME = "admin"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_LOGIN_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})$")
#: An example line, for the messages that refuse a file.
EXAMPLE = (
    "`alice: {token_sha256: <sha256 hex of her token>, authority: maintainer, "
    "repositories: [acme/widgets]}` (the digest: `printf %s \"$TOKEN\" | sha256sum`)"
)


class MaintainerEntry(BaseModel):
    """One person in the maintainers file (the key above it is their name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: SHA-256 (hex) of the person's token: the file never holds the token itself.
    token_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    authority: Literal["admin", "maintainer"] = "maintainer"
    #: Repositories (owner/name) a maintainer steers.
    repositories: list[str] = []
    #: Their GitHub login: comment commands and GitHub sign-in by that login are this person.
    github: str | None = Field(None, pattern=_LOGIN_RE.pattern)
    #: Also a maintainer of every served repository where GitHub grants `github` the
    #: permission `signin.github_grants` names (checked per repository, cached).
    github_rights: bool = False

    @model_validator(mode="after")
    def _rights_somewhere(self) -> MaintainerEntry:
        bad = [r for r in self.repositories if not _REPO_RE.match(r)]
        if bad:
            raise ValueError(f"repositories {bad}: write each as owner/name")
        if self.github_rights and self.github is None:
            raise ValueError("github_rights needs the person's GitHub login in `github`")
        if self.authority == "maintainer" and not self.repositories and not self.github_rights:
            raise ValueError(
                "a maintainer needs `repositories: [owner/name, ...]` or `github_rights: true`"
            )
        return self


def read_maintainers(path: Path, served: set[str] | None = None) -> dict[str, MaintainerEntry]:
    """The maintainers file as name -> entry; ValueError naming the file, the person and the
    fix for anything wrong (a repository not served, two people with one token, ...)."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"maintainers_file {path}: cannot be read ({e})") from e
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ValueError(f"maintainers_file {path}: maps each person's name to {EXAMPLE}")
    people = {str(name): _entry(path, str(name), raw, served) for name, raw in loaded.items()}
    digests = [e.token_sha256.lower() for e in people.values()]
    if len(set(digests)) != len(digests):
        raise ValueError(f"maintainers_file {path}: two people share one token; give each theirs")
    return people


def _entry(path: Path, name: str, raw: object, served: set[str] | None) -> MaintainerEntry:
    """One person of the file, or ValueError naming the file, the person and the fix."""
    if not PERSON_NAME_RE.match(name) or name in RESERVED_NAMES:
        raise ValueError(
            f"maintainers_file {path}: {name!r} is not a usable name (1-39 characters from "
            f"A-Z a-z 0-9 . _ @ -; not {', '.join(sorted(RESERVED_NAMES))})"
        )
    try:
        entry = MaintainerEntry.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'entry'}: {err['msg']}"
            for err in e.errors()
        )
        why = f"maintainers_file {path}: {name}: {problems}. Each person: {EXAMPLE}"
        raise ValueError(why) from e
    unserved = sorted(set(entry.repositories) - served) if served is not None else []
    if unserved:
        raise ValueError(
            f"maintainers_file {path}: {name} maintains {unserved}, which this broker does "
            "not serve; list them in `repositories` or remove them there"
        )
    return entry


class SignInSettings(Section):
    """Signing in to the dashboard with a GitHub identity (docs/dashboard.md)."""

    #: Offer "sign in with GitHub" on the login page: a GitHub token pasted in (read once for
    #: who the person is and where they may act, never kept).
    github: bool = False
    #: The client id of an OAuth App (or GitHub App) with the device flow enabled: offers
    #: signing in with a code shown on the page instead of pasting a token.
    github_client_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    #: The lowest GitHub permission on a repository that makes a person its maintainer here:
    #: `maintain` (maintain or admin) or `write` (also plain write access).
    github_grants: Literal["maintain", "write"] = "maintain"
    #: Seconds the rights read from GitHub hold: a GitHub sign-in's session ends then, and a
    #: maintainer named in the file with `github_rights` is looked up again after it.
    github_rights_s: int = Field(3600, ge=60, le=86400)
    #: Pages of 100 repositories read of a person's GitHub repositories at sign-in at most.
    github_max_pages: int = Field(30, ge=1, le=1000)
    #: The dashboard login's throttle, per client (an IPv6 client: its /64): wrong
    #: credentials free of any delay, then a delay of `login_first_delay_s` that doubles with
    #: each further one up to `login_max_delay_s`; forgotten `login_forget_s` after the last.
    #: Only the client's own failures count: nobody else's guesses delay a correct login.
    login_free_attempts: int = Field(5, ge=1, le=100)
    login_first_delay_s: float = Field(1.0, gt=0, le=3600)
    login_max_delay_s: float = Field(60.0, gt=0, le=86400)
    login_forget_s: float = Field(900.0, gt=0, le=7 * 86400)
    #: The OAuth scope the device flow asks for (an OAuth App: `repo` lists private
    #: repositories with the person's permissions; a GitHub App ignores it).
    github_scope: str = Field("repo", pattern=r"^[a-z:_ ,]{0,100}$")

    @model_validator(mode="after")
    def _delays_fit(self) -> SignInSettings:
        if self.login_first_delay_s > self.login_max_delay_s:
            raise ValueError("login_first_delay_s must be <= login_max_delay_s")
        if self.login_max_delay_s > self.login_forget_s:
            raise ValueError(
                "login_max_delay_s must be <= login_forget_s, or a client would be forgotten "
                "while it waits"
            )
        return self
