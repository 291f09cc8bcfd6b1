"""Who may look at the dashboard and act from it: a logged-in person (or, on an open
dashboard, the administrator), what they may see and steer, and the CSRF token every form of
that visit carries."""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from github_broker.errors import BrokerError, in_words
from github_broker.models import Actor
from github_broker.steering.authority import described
from github_broker.store.logins import Throttle
from github_broker.ui import session
from github_broker.ui.pages import render

#: The browser cookie of an open dashboard (no tokens configured, so no session): a random
#: value the CSRF token is derived from with the server's secret (a cross-site form can
#: neither read it nor send it, SameSite=Strict, and a value the client picks gives it no
#: token).
CSRF_COOKIE = "github_broker_csrf"
_CSRF_VALUE = re.compile(r"^[A-Za-z0-9_-]{32,64}$")
#: Seconds a process trusts the dashboard's secret it read from Redis.
SECRET_FRESH_S = 60.0
#: Who acts on an open dashboard (no tokens configured: loopback only).
OPEN_ACTOR = Actor.admin("admin")


@dataclass
class Visitor:
    """Someone allowed on the dashboard."""

    #: What every form of the visit carries; an action without it is refused.
    csrf: str
    #: Who they are, and where they may act.
    actor: Actor
    #: The login session (None when the dashboard is open: there is no login).
    session_id: str | None = None
    #: A CSRF cookie to set on the answer (an open dashboard's first visit).
    new_csrf_cookie: str | None = None

    @property
    def logged_in(self) -> bool:
        return self.session_id is not None

    @property
    def named(self) -> str:
        """`alice (a maintainer of acme/widgets)`: the page's header."""
        return described(self.actor)


def services(request: Request) -> Any:
    return request.app.state.services


def needs_login(request: Request) -> bool:
    """Whether the dashboard needs a login (anything configured that names someone)."""
    return not services(request).auth.open


def throttle(request: Request) -> Throttle:
    s = services(request).settings.signin
    return Throttle(
        free=s.login_free_attempts,
        first_delay_ms=int(s.login_first_delay_s * 1000),
        max_delay_ms=int(s.login_max_delay_s * 1000),
        forget_ms=int(s.login_forget_s * 1000),
    )


async def secret(request: Request) -> bytes:
    """The dashboard's secret (shared by every serve process through Redis), re-read every
    SECRET_FRESH_S."""
    state = request.app.state
    cached: tuple[bytes, float] | None = getattr(state, "ui_secret", None)
    if cached is not None and time.monotonic() - cached[1] < SECRET_FRESH_S:
        return cached[0]
    key: bytes = await services(request).store.logins.secret()
    state.ui_secret = (key, time.monotonic())
    return key


async def visitor(request: Request) -> Visitor | None:
    """The visitor when the dashboard is open or the cookie names a session that is still
    open (Redis: a logout anywhere ends it) of someone still allowed in; None means: log in
    first."""
    key = await secret(request)
    if not needs_login(request):
        cookie = request.cookies.get(CSRF_COOKIE) or ""
        fresh = None if _CSRF_VALUE.match(cookie) else secrets.token_urlsafe(32)
        visit = f"open:{fresh or cookie}"
        return Visitor(session.csrf_token(key, visit), OPEN_ACTOR, new_csrf_cookie=fresh)
    session_id = session.session_of(key, request.cookies.get(session.COOKIE))
    if session_id is None:
        return None
    record = await services(request).store.logins.session(session_id)
    actor = await actor_of(request, record) if record is not None else None
    if actor is None:
        return None
    return Visitor(session.csrf_token(key, session_id), actor, session_id)


async def actor_of(request: Request, record: dict[str, Any]) -> Actor | None:
    """Who a session names now: a person of the token login (gone once the file drops them or
    changes their token), or a GitHub identity with the rights read at sign-in."""
    svc = services(request)
    if record.get("via") == "github" and isinstance(record.get("login"), str):
        actor: Actor = await svc.rights.github_actor(record["login"])
        return actor
    person = svc.auth.people.named(str(record.get("name", "")))
    if person is None or person.stamp != record.get("stamp"):
        return None
    found: Actor = await svc.rights.actor(person)
    return found


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
        strict_cookie(response, request, CSRF_COOKIE, who.new_csrf_cookie, "/ui")
    return response


def strict_cookie(
    response: Response,
    request: Request,
    name: str,
    value: str,
    path: str,
    max_age: int | None = None,
) -> Response:
    """Set a dashboard cookie: HttpOnly, SameSite=Strict, `Secure` over HTTPS."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=path,
    )
    return response


def unavailable(e: BrokerError) -> HTMLResponse:
    return HTMLResponse(render("error.html", message=in_words(e)), status_code=503)
