"""Installation tokens limited to some repositories and permissions, as GitHub mints them for
`POST /app/installations/{id}/access_tokens` with `repositories` and `permissions`: such a
token is refused (403 `Resource not accessible by integration`, GitHub's words) on any other
repository, on an endpoint of a permission it lacks or holds only to read, and on endpoints
about users; `DELETE /installation/token` revokes it."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .messages import ApiError

#: Permissions the simulator knows, and the levels GitHub grants.
KNOWN_PERMISSIONS = frozenset({"contents", "issues", "pull_requests", "metadata"})
LEVELS = {"read": 1, "write": 2}
REFUSED = "Resource not accessible by integration"
#: The permission each repository endpoint needs, by its route template (first match).
_NEEDS = (
    (re.compile(r"/pulls"), "pull_requests"),
    (re.compile(r"/issues|/labels"), "issues"),
    (re.compile(r"/git/|/branches|/compare|/commits|/contents"), "contents"),
)


@dataclass(frozen=True)
class TokenScope:
    """What one installation token may touch: repository names (lower case, as GitHub's
    `repositories` names them, without the owner; None: every one of the installation) and
    permission -> read or write (empty: the installation's own)."""

    repositories: frozenset[str] | None
    permissions: dict[str, str]

    def refusal(self, method: str, template: str, repo: str | None) -> ApiError | None:
        """The error GitHub answers this token for `method template` on `repo`, or None."""
        if repo is None:
            # Endpoints about users or the app, not a repository: not an installation's.
            return None if template in _FREE else ApiError(403, REFUSED)
        if self.repositories is not None and repo.lower() not in self.repositories:
            return ApiError(403, REFUSED)
        needed = next((p for rule, p in _NEEDS if rule.search(template)), "metadata")
        if needed == "metadata" or not self.permissions:
            return None  # every installation token reads metadata
        level = LEVELS["read" if method in ("GET", "HEAD") else "write"]
        if LEVELS.get(self.permissions.get(needed, ""), 0) < level:
            return ApiError(403, REFUSED)
        return None


#: Routes without a repository that any installation token may call.
_FREE = frozenset({"/rate_limit", "/", "/installation/token"})


def scope_of(body: object, served: list[str]) -> TokenScope | None:
    """The scope a mint request asks for: None when it names neither repositories nor
    permissions (the installation's own, whole token). ApiError 422 as GitHub refuses,
    also for a repository name none of `served` (full names) has."""
    if not isinstance(body, dict):
        return None
    repositories = body.get("repositories")
    permissions = body.get("permissions") or {}
    if not repositories and not permissions:
        return None
    if not isinstance(permissions, dict) or any(
        p not in KNOWN_PERMISSIONS or v not in LEVELS for p, v in permissions.items()
    ):
        raise ApiError(422, "The permissions requested are not granted to this installation.")
    if repositories is not None and not (
        isinstance(repositories, list) and all(isinstance(r, str) for r in repositories)
    ):
        raise ApiError(422, "Invalid request.\n\nFor 'properties/repositories', not an array.")
    known = {name.split("/", 1)[1].lower() for name in served}
    if repositories and any(r.lower() not in known for r in repositories):
        raise ApiError(
            422,
            "There is at least one repository that does not exist or is not accessible to "
            "the parent installation.",
        )
    names = frozenset(r.lower() for r in repositories) if repositories else None
    return TokenScope(names, {str(p): str(v) for p, v in permissions.items()})
