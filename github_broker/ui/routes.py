"""Dashboard routes: `/ui` (the page), an agent's page, the login form and assets, `/`
redirecting there. The controls are in controls.py, the live updates in live.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
from github_broker.ui.guard import services, unavailable
from github_broker.ui.login import (
    HTML,
    LOGIN_BODY_MAX,
    attempt,
    form_body,
    login_page,
    refused_login,
    signed_in,
)
from github_broker.ui.pages import render

router = APIRouter(tags=["dashboard"], responses=BODY_LIMIT_RESPONSE)
STATIC_DIR = Path(__file__).parent / "static"
#: The dashboard's icon, also served at /favicon.ico.
FAVICON = (STATIC_DIR / "favicon.svg").read_bytes()
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


def _page_responses(page: str, invalid: str) -> dict[int | str, dict[str, Any]]:
    """The answers of a signed-in page, for the OpenAPI: `invalid` says what a 422 refuses."""
    return {
        200: {"description": page, **HTML},
        303: {"description": "Not logged in: go to /ui/login."},
        422: {"description": invalid, "content": PROBLEM_JSON},
        503: {"description": "Redis unavailable: the page says so.", **HTML},
    }


@router.get(
    "/ui",
    response_class=HTMLResponse,
    responses=_page_responses("The dashboard page.", "`range` is not 1h or 24h."),
)
async def dashboard(request: Request, range_name: RangeName = "1h") -> Response:
    """Trend charts, leases, queues, blockers, reviews, agents, the integrations' health, the
    write queue, recent events and the audit log, with the maintainers' controls (admin)."""
    svc = services(request)

    async def context(who: guard.Visitor) -> dict[str, Any]:
        data = await views.dashboard_view(svc.store, svc.settings, range_name, who.actor)
        return fragments.dashboard_context(data, who)

    return await _signed_in_page(request, "dashboard.html", context)


@router.get(
    "/ui/agents/{agent_id}",
    response_class=HTMLResponse,
    responses=_page_responses("The agent's page.", "Not an agent id."),
)
async def agent_page(request: Request, agent_id: AgentId) -> Response:
    """One agent: what it holds, its recent tasks, its failure streaks, whether it is paused,
    with the pause, stop and resume controls (admin)."""
    svc = services(request)

    async def context(who: guard.Visitor) -> dict[str, Any]:
        board = await views.dashboard_view(svc.store, svc.settings, None, who.actor)
        data = await views.agent_view(svc.store, board, agent_id, who.actor)
        return fragments.agent_context(data, who)

    return await _signed_in_page(request, "agent.html", context)


async def _signed_in_page(
    request: Request,
    template: str,
    context: Callable[[guard.Visitor], Awaitable[dict[str, Any]]],
) -> Response:
    """A dashboard page for a signed-in visitor; the login page for anyone else, and a page
    that says so while Redis is unavailable."""
    try:
        who = await guard.visitor(request)
        if who is None:
            return RedirectResponse("/ui/login", status_code=303)
        page_context = await context(who)
    except BrokerError as e:
        return unavailable(e)
    return _page(request, who, template, page_context)


def _page(request: Request, who: guard.Visitor, template: str, context: dict[str, Any]) -> Response:
    message = flash.take(request)
    page = render(template, flash=message, show_logout=who.logged_in, **context)
    response = HTMLResponse(page, headers={"Cache-Control": "no-store"})
    flash.clear(response, request)
    return guard.keep_csrf_cookie(response, who, request)


@router.get("/ui/login", response_class=HTMLResponse, responses={200: HTML})
async def login_form(request: Request) -> HTMLResponse:
    """The login form: a person's token, and signing in with GitHub where configured."""
    return login_page(request, None)


@router.post(
    "/ui/login",
    response_class=HTMLResponse,
    responses={
        303: {"description": "Logged in: a session cookie is set, go to /ui."},
        401: {
            "description": "Wrong token: the form again, with the reason (and Retry-After "
            "when this failure starts the client's delay).",
            **HTML,
        },
        429: {
            "description": "This client's wrong attempts put it in a delay (each one more "
            "doubles it): the form again, and Retry-After (seconds) says when to retry.",
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
    openapi_extra=form_body("token"),
)
async def login(request: Request) -> Response:
    """Check a person's token (the admin token or a maintainers file entry; a client's wrong
    attempts slow that client down, nobody else) and open a session naming them: an HttpOnly
    cookie names it (the token stays secret), `Secure` over HTTPS."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return login_page(request, "send the form as application/x-www-form-urlencoded", 415)
    body = await request.body()
    if len(body) > LOGIN_BODY_MAX:
        return login_page(request, "form too large", 413)
    given = (parse_qs(body.decode(errors="replace")).get("token") or [""])[0].strip()
    if not guard.needs_login(request):
        return RedirectResponse("/ui", status_code=303)
    person = services(request).auth.people.by_token(given.encode("utf-8", "surrogateescape"))
    try:
        verdict = await attempt(request, person is not None)
        if person is None or not verdict.allowed:
            return refused_login(request, verdict, "that is not the token of anyone here")
        record = {"via": "token", "name": person.name, "stamp": person.stamp}
        return await signed_in(request, record, session.SESSION_TTL_S)
    except BrokerError as e:
        return unavailable(e)


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
    try:
        key = await guard.secret(request)
        session_id = session.session_of(key, request.cookies.get(session.COOKIE))
        if session_id is not None:
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
