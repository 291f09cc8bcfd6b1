"""Collaborators of the simulated repositories and the permission GitHub reports for anyone.

GitHub's `GET /repos/{o}/{r}/collaborators/{user}/permission` answers for every account, not
only collaborators: the owner is `admin`, a listed collaborator has their role (`maintain`
reads as `write`, `triage` as `read` in the legacy `permission` field), anybody else can
read a public repository (`read`) and has `none` on a private one; an account that does not
exist is 404. The caller needs push access: a token whose login is listed with less answers
403. Tokens whose login is not listed act with admin rights, as `GET /repos` shows them.
"""

from __future__ import annotations

import logging
from typing import Any

from . import render
from .issues import IssueStore
from .messages import ApiError, NotFound

logger = logging.getLogger(__name__)

#: Repository roles, weakest first.
ROLES = ("read", "triage", "write", "maintain", "admin")
#: The legacy base permission each role reports.
_BASE = {"read": "read", "triage": "read", "write": "write", "maintain": "write", "admin": "admin"}
#: The names GitHub's collaborator API also takes for roles.
_ALIASES = {"pull": "read", "push": "write"}
_FLAGS = ("pull", "triage", "push", "maintain", "admin")
#: Which permission flags each role turns on (GitHub's `permissions` object).
_GRANTS = {
    "none": (),
    "read": ("pull",),
    "triage": ("pull", "triage"),
    "write": ("pull", "triage", "push"),
    "maintain": ("pull", "triage", "push", "maintain"),
    "admin": _FLAGS,
}


def role_name(role: str) -> str:
    """`role` or one of its aliases as a role; ValueError names the accepted ones."""
    name = _ALIASES.get(role.strip().lower(), role.strip().lower())
    if name not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES} (or pull, push)")
    return name


class CollaboratorStore(IssueStore):
    """Collaborators per repository; the conventions are IssueStore's."""

    def set_collaborator(self, owner: str, repo: str, login: str, role: str) -> dict[str, str]:
        try:
            name = role_name(role)
        except ValueError as exc:
            raise ApiError(422, str(exc)) from exc
        with self.lock:
            r = self.repo(owner, repo)
            r.collaborators[login.lower()] = (self.user(login), name)
            return self.collaborators(owner, repo)

    def remove_collaborator(self, owner: str, repo: str, login: str) -> None:
        with self.lock:
            if self.repo(owner, repo).collaborators.pop(login.lower(), None) is None:
                raise NotFound()

    def collaborators(self, owner: str, repo: str) -> dict[str, str]:
        """login -> role of every listed collaborator."""
        with self.lock:
            return dict(self.repo(owner, repo).collaborators.values())

    def permission(
        self,
        owner: str,
        repo: str,
        login: str,
        *,
        viewer: str | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        """What GitHub answers `viewer` (None: a Python caller, who may ask) about `login`."""
        with self.lock:
            r = self.repo(owner, repo)
            listed = r.collaborators.get((viewer or "").lower())
            if listed is not None and ROLES.index(listed[1]) < ROLES.index("write"):
                raise ApiError(403, "Must have push access to view collaborator permission.")
            account = self._known_login(login)
            if account is None:
                raise NotFound()
            if account.lower() == r.owner.lower():
                role = "admin"
            elif account.lower() in r.collaborators:
                role = r.collaborators[account.lower()][1]
            else:
                role = "none" if r.private else "read"
            # GitHub names no role for someone who has none.
            shown = "" if role == "none" else role
            grants = _GRANTS[role]
            user = self.ctx(base_url).user(account)
            assert user is not None
            user.update(permissions={f: f in grants for f in _FLAGS}, role_name=shown)
            return {"permission": _BASE.get(role, "none"), "role_name": shown, "user": user}

    def _known_login(self, login: str) -> str | None:
        """The account's own spelling (logins are case-insensitive), None if nobody has it."""
        if login in self._user_ids:
            return login
        lower = login.lower()
        return next((known for known in self._user_ids if known.lower() == lower), None)

    def user_repositories(self, login: str, *, base_url: str | None = None) -> list[dict[str, Any]]:
        """`GET /user/repos` for `login`: the repositories they own or collaborate on, by full
        name, each with the permission flags of their role."""
        lower = login.lower()
        with self.lock:
            found = []
            for repo in sorted(self._repos.values(), key=lambda r: r.full_name.lower()):
                if repo.owner.lower() == lower:
                    role = "admin"
                elif lower in repo.collaborators:
                    role = repo.collaborators[lower][1]
                else:
                    continue
                data = render.repository(self.ctx(base_url), repo)
                data["permissions"] = {f: f in _GRANTS[role] for f in _FLAGS}
                found.append(data)
            return found
