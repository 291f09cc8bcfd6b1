"""GitHub as a person signing in sees it: who their token names and where they may write
(`GET /user`, `GET /user/repos` in pages of 100, their token used once and never kept), and
GitHub's OAuth device flow (`POST /login/device/code`, `POST /login/oauth/access_token`).

Blocking (requests): async callers run these in a worker thread.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests

from github_broker.errors import GitHubError, GitHubUnavailable
from github_broker.gateway.transport import network_problem
from github_broker.settings import GitHubSettings

logger = logging.getLogger(__name__)

#: Repositories one page of `GET /user/repos` lists (GitHub's most).
PER_PAGE = 100
#: GitHub's device-flow grant type.
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
#: Roles by the permission flags GitHub lists for the person, strongest first.
_ROLES = (("admin", "admin"), ("maintain", "maintain"), ("push", "write"), ("triage", "triage"))


def oauth_base(api_url: str) -> str:
    """Where GitHub's web endpoints (`/login/...`) live for an API base URL:
    `https://api.github.com` -> `https://github.com`, `https://ghe.example/api/v3` ->
    `https://ghe.example`; anything else (the simulator) serves both."""
    parts = urlsplit(api_url.rstrip("/"))
    host, path = parts.netloc, parts.path
    if host.lower() == "api.github.com":
        host = "github.com"
    if path.endswith("/api/v3"):
        path = path[: -len("/api/v3")]
    return urlunsplit((parts.scheme, host, path, "", ""))


def role_of(permissions: dict[str, Any] | None) -> str:
    """admin, maintain, write, triage or read, from GitHub's `permissions` flags."""
    flags = permissions or {}
    return next((role for flag, role in _ROLES if flags.get(flag)), "read")


def plain_call(
    http: requests.Session, verb: str, url: str, timeout_s: float, **kwargs: Any
) -> tuple[int, Any, requests.Response]:
    """One request outside PyGithub's requester: (status, JSON or None, response);
    GitHubUnavailable when GitHub cannot be reached or answers 5xx (its address only logged)."""
    try:
        response = http.request(verb, url, timeout=timeout_s, **kwargs)
    except requests.exceptions.RequestException as e:
        logger.warning("GitHub %s %s failed: %s", verb, url, e)
        raise GitHubUnavailable(network_problem(e)) from e
    if response.status_code >= 500:
        raise GitHubUnavailable(f"GitHub answered {response.status_code}")
    try:
        data = response.json() if response.content else None
    except ValueError:
        data = None
    return response.status_code, data, response


class PersonalGitHub:
    """Calls made with a person's own GitHub token (or for it, the device flow)."""

    def __init__(self, settings: GitHubSettings) -> None:
        self.api = settings.base_url.rstrip("/")
        self.web = oauth_base(self.api)
        self.timeout_s = settings.timeout_s
        self.http = requests.Session()
        self.http.headers["User-Agent"] = "github-broker"

    def close(self) -> None:
        self.http.close()

    def _call(self, verb: str, url: str, **kwargs: Any) -> tuple[int, Any, requests.Response]:
        return plain_call(self.http, verb, url, self.timeout_s, **kwargs)

    def _get(self, token: str, path: str, **params: Any) -> tuple[Any, requests.Response]:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json"}
        status, data, response = self._call("GET", self.api + path, headers=headers, params=params)
        if status >= 400:
            message = (data or {}).get("message") if isinstance(data, dict) else None
            why = f"GitHub refused the token: {status} {message or ''}".strip()
            raise GitHubError(why, status=status)
        return data, response

    def login(self, token: str) -> str:
        """The login `token` belongs to (`GET /user`)."""
        data, _ = self._get(token, "/user")
        login = data.get("login") if isinstance(data, dict) else None
        if not isinstance(login, str) or not login:
            raise GitHubError("GitHub's /user named no login")
        return login

    def roles(self, token: str, served: dict[str, str], max_pages: int) -> dict[str, str]:
        """The person's role on each served repository GitHub lists for them (`GET /user/
        repos`, pages of 100, at most `max_pages`, ending early once every served one was
        seen). `served`: lower-cased full name -> the configured spelling."""
        found: dict[str, str] = {}
        for page in range(1, max_pages + 1):
            data, response = self._get(token, "/user/repos", per_page=PER_PAGE, page=page)
            for repo in data if isinstance(data, list) else []:
                name = served.get(str(repo.get("full_name", "")).lower())
                if name is not None:
                    found[name] = role_of(repo.get("permissions"))
            if len(found) == len(served) or "next" not in response.links:
                break
        return found

    def device_code(self, client_id: str, scope: str) -> dict[str, Any]:
        """Start a device-flow sign-in: `device_code`, `user_code`, `verification_uri`,
        `expires_in`, `interval`."""
        data = self._form("/login/device/code", {"client_id": client_id, "scope": scope})
        if "device_code" not in data:
            raise GitHubError(f"GitHub refused the device flow: {data.get('error', data)}")
        return data

    def device_token(self, client_id: str, device_code: str) -> dict[str, Any]:
        """Ask whether the person entered the code: `access_token`, or `error`
        (`authorization_pending`, `slow_down`, `expired_token`, `access_denied`, ...)."""
        form = {"client_id": client_id, "device_code": device_code, "grant_type": DEVICE_GRANT}
        return self._form("/login/oauth/access_token", form)

    def _form(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        status, data, _ = self._call(
            "POST", self.web + path, data=form, headers={"Accept": "application/json"}
        )
        if not isinstance(data, dict):
            raise GitHubError(f"GitHub answered {status} without JSON on {path}", status=status)
        return data
