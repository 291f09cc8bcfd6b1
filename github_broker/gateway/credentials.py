"""Short-lived GitHub tokens for agents, minted from the App's installation: one repository,
the permissions an agent needs (`POST /app/installations/{id}/access_tokens` with
`repositories` and `permissions`), revoked with `DELETE /installation/token`.

Blocking (requests): async callers run these in a worker thread.
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from github import Auth

from github_broker.errors import GitHubError
from github_broker.gateway.people import plain_call
from github_broker.settings import GitHubSettings

logger = logging.getLogger(__name__)


class AppTokens:
    """Mints and revokes installation tokens limited to one repository."""

    def __init__(self, settings: GitHubSettings) -> None:
        key = settings.app_key()
        if settings.app_id is None or settings.app_installation_id is None or not key:
            raise GitHubError("agent credentials need a GitHub App (settings.github.app_*)")
        self.app = Auth.AppAuth(settings.app_id, key)
        self.installation = settings.app_installation_id
        self.api = settings.base_url.rstrip("/")
        self.permissions = dict(settings.agent_permissions)
        self.timeout_s = settings.timeout_s
        self.http = requests.Session()
        self.http.headers.update(
            {"User-Agent": "github-broker", "Accept": "application/vnd.github+json"}
        )

    def close(self) -> None:
        self.http.close()

    def mint(self, repository: str) -> dict[str, Any]:
        """A token for `repository` (owner/name) alone: GitHub's answer (`token`,
        `expires_at`, `permissions`, ...)."""
        body = {"repositories": [repository.split("/", 1)[1]], "permissions": self.permissions}
        url = f"{self.api}/app/installations/{self.installation}/access_tokens"
        headers = {"Authorization": f"Bearer {self.app.create_jwt()}"}
        status, data = self._call("POST", url, headers, body)
        if status != 201 or not isinstance(data, dict) or "token" not in data:
            message = data.get("message") if isinstance(data, dict) else None
            raise GitHubError(f"minting an agent token: {status} {message or ''}", status=status)
        return data

    def revoke(self, token: str) -> None:
        """End `token` now (GitHub answers 204; 401 when it had already ended)."""
        status, _ = self._call(
            "DELETE", f"{self.api}/installation/token", {"Authorization": f"Bearer {token}"}
        )
        if status not in (204, 401):
            raise GitHubError(f"revoking an agent token: {status}", status=status)

    def _call(
        self, verb: str, url: str, headers: dict[str, str], body: Any = None
    ) -> tuple[int, Any]:
        status, data, _ = plain_call(
            self.http, verb, url, self.timeout_s, headers=headers, json=body
        )
        return status, data
