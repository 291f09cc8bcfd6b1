"""What the dashboard's ways in share: the login form, counting a client's attempts (its
delay, nobody else's), opening a session naming a person (routes.py: a token;
github_signin.py: GitHub)."""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from github_broker.store.logins import Verdict
from github_broker.ui import guard, session
from github_broker.ui.guard import services
from github_broker.ui.pages import render

#: Longest login form body read (bytes): a token, not an upload.
LOGIN_BODY_MAX = 4096

HTML: dict[str, Any] = {"content": {"text/html": {}}}


def form_body(field: str) -> dict[str, Any]:
    """The OpenAPI of a login form with one required text `field`."""
    schema = {"type": "object", "properties": {field: {"type": "string"}}, "required": [field]}
    content = {"application/x-www-form-urlencoded": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}


async def attempt(request: Request, correct: bool | None) -> Verdict:
    """Count a login attempt of this client (`correct`: its credential checked; None: only
    ask whether it is waiting out a delay)."""
    # uvicorn's address, or the forwarded one when server.trusted_proxies names the proxy.
    address = request.client.host if request.client else "unknown"
    verdict: Verdict = await services(request).store.logins.attempt(
        address, correct, guard.throttle(request)
    )
    return verdict


def refused_login(request: Request, verdict: Verdict, wrong: str) -> HTMLResponse:
    """The form again: 429 while the client waits out a delay, else 401 saying `wrong` (and
    how long to wait when this failure started a delay)."""
    retry_s = max(1, math.ceil(verdict.wait_s))
    retry = {"Retry-After": str(retry_s)} if verdict.wait_s > 0 else None
    if verdict.waiting:
        why = f"too many wrong attempts from here; try again in {retry_s} s"
        return login_page(request, why, 429, retry)
    if retry is not None:
        wrong += f"; wait {retry_s} s before the next try"
    return login_page(request, wrong, 401, retry)


async def signed_in(request: Request, record: dict[str, Any], ttl_s: int) -> Response:
    """Open a session naming `record`'s person and go to the dashboard."""
    session_id = await services(request).store.logins.open_session(ttl_s, record)
    key = await guard.secret(request)
    response = RedirectResponse("/ui", status_code=303)
    cookie = session.issue(key, session_id, ttl_s)
    return guard.strict_cookie(response, request, session.COOKIE, cookie, "/ui", ttl_s)


def login_page(
    request: Request, error: str | None, status: int = 200, headers: dict[str, str] | None = None
) -> HTMLResponse:
    """The login form (token, and GitHub's ways in where configured), with `error`."""
    signin = services(request).settings.signin
    page = render(
        "login.html", error=error, github=signin.github, device=signin.github_client_id is not None
    )
    return HTMLResponse(page, status_code=status, headers=headers)
