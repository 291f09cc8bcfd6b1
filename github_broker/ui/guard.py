"""Who may look at the dashboard and act from it: a logged-in session (or an open dashboard),
and the CSRF token every form of that visit carries."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from github_broker.errors import BrokerError
from github_broker.ui import session
from github_broker.ui.pages import render

#: The double-submit cookie of an open dashboard (no tokens configured, so no session): its
#: value is the CSRF token, and a cross-site form can neither read it nor send it
#: (SameSite=Strict).
CSRF_COOKIE = "github_broker_csrf"
_CSRF_VALUE = re.compile(r"^[A-Za-z0-9_-]{32,64}$")


@dataclass
class Visitor:
    """Someone allowed on the dashboard."""

    #: What every form of the visit carries; an action without it is refused.
    csrf: str
    #: The login session (None when the dashboard is open: there is no login).
    session_id: str | None = None
    #: A CSRF cookie to set on the answer (an open dashboard's first visit).
    new_csrf_cookie: str | None = None

    @property
    def logged_in(self) -> bool:
        return self.session_id is not None


def services(request: Request) -> Any:
    return request.app.state.services


def admin_token(request: Request) -> str | None:
    """The admin token when the dashboard needs a login, None when it is open."""
    auth = services(request).auth
    if auth.open:
        return None
    # Agent tokens alone (no admin token): nobody may log in, as for /status.
    return auth.admin_token or ""


async def visitor(request: Request) -> Visitor | None:
    """The visitor when the dashboard is open or the cookie names a session that is still
    open (Redis: a logout anywhere ends it); None means: log in first."""
    token = admin_token(request)
    if token is None:
        cookie = request.cookies.get(CSRF_COOKIE) or ""
        if _CSRF_VALUE.match(cookie):
            return Visitor(csrf=cookie)
        fresh = secrets.token_urlsafe(32)
        return Visitor(csrf=fresh, new_csrf_cookie=fresh)
    session_id = session.session_of(token, request.cookies.get(session.COOKIE)) if token else None
    if session_id is None or not await session_alive(request, session_id):
        return None
    return Visitor(csrf=session.csrf_token(token, session_id), session_id=session_id)


async def session_alive(request: Request, session_id: str) -> bool:
    return bool(await services(request).store.logins.session_alive(session_id))


def csrf_refused(who: Visitor, given: str | None) -> str | None:
    """Why an action must be refused as a possible cross-site request, or None when its form
    carries this visit's CSRF token."""
    if who.new_csrf_cookie is not None:
        return "cross-site request refused: this browser has no dashboard cookie; load /ui first"
    if not session.same_token(who.csrf, given):
        return (
            "cross-site request refused: the form's CSRF token is missing or is not this "
            "session's; reload the dashboard and try again"
        )
    return None


def keep_csrf_cookie(response: Response, who: Visitor, request: Request) -> Response:
    if who.new_csrf_cookie is not None:
        response.set_cookie(
            CSRF_COOKIE,
            who.new_csrf_cookie,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/ui",
        )
    return response


def unavailable(e: BrokerError) -> HTMLResponse:
    return HTMLResponse(render("error.html", message=f"{type(e).__name__}: {e}"), status_code=503)
