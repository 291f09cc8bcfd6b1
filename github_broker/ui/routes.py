"""Dashboard routes: `/ui` (the page), an agent's page, the login form and assets, `/`
redirecting there. The controls are in controls.py, the live updates in live.py."""

from __future__ import annotations

import hmac
import math
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from github_broker.errors import BODY_LIMIT_RESPONSE, PROBLEM_JSON, BrokerError
from github_broker.models import AGENT_ID_PATTERN
from github_broker.ui import controls, flash, fragments, guard, live, session, views
from github_broker.ui.guard import admin_token, services, unavailable
from github_broker.ui.pages import render

router = APIRouter(tags=["dashboard"], responses=BODY_LIMIT_RESPONSE)
STATIC_DIR = Path(__file__).parent / "static"
#: The dashboard's icon, also served at /favicon.ico.
FAVICON = (STATIC_DIR / "favicon.svg").read_bytes()
#: Longest login form body read (bytes): a token, not an upload.
LOGIN_BODY_MAX = 4096

HTML: dict[str, Any] = {"content": {"text/html": {}}}
AgentId = Annotated[str, PathParam(pattern=AGENT_ID_PATTERN, description="agent id")]
#: The trend charts' time range (`?range=`): the last hour or the last 24 hours.
RangeName = Annotated[
    Literal["1h", "24h"], Query(alias="range", description="The trend charts' time range.")
]


@router.get("/", include_in_schema=True, status_code=307, response_class=RedirectResponse)
async def root() -> RedirectResponse:
    """The dashboard lives at /ui."""
    return RedirectResponse("/ui", status_code=307)


@router.get(
    "/favicon.ico",
    response_class=Response,
    responses={200: {"description": "The dashboard's icon.", "content": {"image/svg+xml": {}}}},
)
async def favicon() -> Response:
    """The dashboard's icon (SVG), where browsers look for it."""
    return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


@router.get(
    "/ui",
    response_class=HTMLResponse,
    responses={
        200: {"description": "The dashboard page.", **HTML},
        303: {"description": "Not logged in: go to /ui/login."},
        422: {"description": "`range` is not 1h or 24h.", "content": PROBLEM_JSON},
        503: {"description": "Redis unavailable: the page says so.", **HTML},
    },
)
async def dashboard(request: Request, range_name: RangeName = "1h") -> Response:
    """Trend charts, leases, queues, blockers, reviews, agents, the integrations' health, the
    write queue, recent events and the audit log, with the maintainers' controls (admin)."""
    svc = services(request)
    try:
        who = await guard.visitor(request)
        if who is None:
            return RedirectResponse("/ui/login", status_code=303)
        data = await views.dashboard_view(svc.store, svc.settings, range_name)
    except BrokerError as e:
        return unavailable(e)
    context = fragments.dashboard_context(data, who)
    return _page(request, who, "dashboard.html", context)


@router.get(
    "/ui/agents/{agent_id}",
    response_class=HTMLResponse,
    responses={
        200: {"description": "The agent's page.", **HTML},
        303: {"description": "Not logged in: go to /ui/login."},
        422: {"description": "Not an agent id.", "content": PROBLEM_JSON},
        503: {"description": "Redis unavailable: the page says so.", **HTML},
    },
)
async def agent_page(request: Request, agent_id: AgentId) -> Response:
    """One agent: what it holds, its recent tasks, its failure streaks, whether it is paused,
    with the pause, stop and resume controls (admin)."""
    svc = services(request)
    try:
        who = await guard.visitor(request)
        if who is None:
            return RedirectResponse("/ui/login", status_code=303)
        board = await views.dashboard_view(svc.store, svc.settings)
        data = await views.agent_view(svc.store, board, agent_id)
    except BrokerError as e:
        return unavailable(e)
    return _page(request, who, "agent.html", fragments.agent_context(data, who))


def _page(request: Request, who: guard.Visitor, template: str, context: dict[str, Any]) -> Response:
    message = flash.take(request)
    show_logout = admin_token(request) is not None
    page = render(template, flash=message, show_logout=show_logout, **context)
    response = HTMLResponse(page, headers={"Cache-Control": "no-store"})
    flash.clear(response, request)
    return guard.keep_csrf_cookie(response, who, request)


@router.get("/ui/login", response_class=HTMLResponse, responses={200: HTML})
async def login_form(request: Request) -> HTMLResponse:
    """The admin-token login form."""
    return HTMLResponse(render("login.html", error=None))


@router.post(
    "/ui/login",
    response_class=HTMLResponse,
    responses={
        303: {"description": "Logged in: a session cookie is set, go to /ui."},
        401: {"description": "Wrong token: the form again, with the reason.", **HTML},
        429: {
            "description": "Too many attempts from this client (or from everyone) in the "
            "login window: the form again, and Retry-After (seconds) says when to retry.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
            **HTML,
        },
        503: {"description": "Redis unavailable: the page says so.", **HTML},
        413: {
            "description": "Form body too large: the form again (over 4 kB), or the API's "
            "JSON problem (over server.max_body_bytes).",
            "content": {"text/html": {}, **PROBLEM_JSON},
        },
        415: {"description": "Not an application/x-www-form-urlencoded form.", **HTML},
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "properties": {"token": {"type": "string"}},
                        "required": ["token"],
                    }
                }
            },
        }
    },
)
async def login(request: Request) -> Response:
    """Check the admin token (throttled per client and overall) and open a session: an
    HttpOnly cookie names it (the token stays secret), `Secure` over HTTPS."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        page = render("login.html", error="send the form as application/x-www-form-urlencoded")
        return HTMLResponse(page, status_code=415)
    body = await request.body()
    if len(body) > LOGIN_BODY_MAX:
        return HTMLResponse(render("login.html", error="form too large"), status_code=413)
    given = (parse_qs(body.decode(errors="replace")).get("token") or [""])[0].strip()
    admin = admin_token(request)
    if admin is None:
        return RedirectResponse("/ui", status_code=303)
    logins = services(request).store.logins
    # uvicorn's address, or the forwarded one when server.trusted_proxies names the proxy.
    address = request.client.host if request.client else "unknown"
    try:
        wait_s = await logins.attempt(
            address,
            session.LOGIN_WINDOW_S,
            session.LOGIN_ATTEMPTS_PER_CLIENT,
            session.LOGIN_ATTEMPTS_OVERALL,
        )
        if wait_s > 0:
            retry_s = max(1, math.ceil(wait_s))
            why = f"too many login attempts; try again in {retry_s} s"
            page = render("login.html", error=why)
            return HTMLResponse(page, status_code=429, headers={"Retry-After": str(retry_s)})
        if not given or not admin or not hmac.compare_digest(given.encode(), admin.encode()):
            why = "no admin token is configured" if not admin else "that is not the admin token"
            return HTMLResponse(render("login.html", error=why), status_code=401)
        await logins.succeeded(address)
        session_id = await logins.open_session(session.SESSION_TTL_S)
    except BrokerError as e:
        return unavailable(e)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        session.COOKIE,
        session.issue(admin, session_id),
        max_age=session.SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )
    return response


@router.post(
    "/ui/logout",
    status_code=303,
    response_class=RedirectResponse,
    responses={
        303: {"description": "Session ended and cookie cleared: go to /ui/login."},
        503: {"description": "Redis unavailable: the session could not be ended.", **HTML},
    },
)
async def logout(request: Request) -> Response:
    """End the session on the server (the old cookie opens nothing any more), clear the
    cookie."""
    admin = admin_token(request)
    session_id = session.session_of(admin, request.cookies.get(session.COOKIE)) if admin else None
    if session_id is not None:
        try:
            await services(request).store.logins.end_session(session_id)
        except BrokerError as e:
            return unavailable(e)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(session.COOKIE, path="/ui")
    return response


def install(app: FastAPI) -> None:
    """Mount the dashboard, its assets and the offline API docs on `app`."""
    from github_broker.ui import docs

    app.include_router(router)
    app.include_router(controls.router, responses=BODY_LIMIT_RESPONSE)
    app.include_router(live.router, responses=BODY_LIMIT_RESPONSE)
    app.state.live_feed = live.LiveFeed()
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    docs.install(app)
