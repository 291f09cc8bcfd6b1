"""Dashboard routes: `/ui` (the page), its login form and assets, `/` redirecting there."""

from __future__ import annotations

import hmac
import math
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from github_broker import overview
from github_broker.errors import BrokerError
from github_broker.problems import BODY_LIMIT_RESPONSE, PROBLEM_JSON
from github_broker.ui import session
from github_broker.ui.pages import render

router = APIRouter(tags=["dashboard"], responses=BODY_LIMIT_RESPONSE)
STATIC_DIR = Path(__file__).parent / "static"
#: Longest login form body read (bytes): a token, not an upload.
LOGIN_BODY_MAX = 4096

HTML: dict[str, Any] = {"content": {"text/html": {}}}


def _services(request: Request) -> Any:
    return request.app.state.services


def _admin_token(request: Request) -> str | None:
    """The admin token when the dashboard needs a login, None when it is open."""
    auth = _services(request).auth
    if auth.open:
        return None
    # Agent tokens alone (no admin token): nobody may log in, as for /status.
    return auth.admin_token or ""


async def _logged_in(request: Request) -> bool:
    """Whether the request may see the dashboard: it is open, or the cookie names a session
    that is still open (Redis: a logout anywhere ends it)."""
    token = _admin_token(request)
    if token is None:
        return True
    session_id = session.session_of(token, request.cookies.get(session.COOKIE)) if token else None
    return session_id is not None and bool(
        await _services(request).store.logins.session_alive(session_id)
    )


def _unavailable(e: BrokerError) -> HTMLResponse:
    return HTMLResponse(render("error.html", message=f"{type(e).__name__}: {e}"), status_code=503)


@router.get("/", include_in_schema=True, status_code=307, response_class=RedirectResponse)
async def root() -> RedirectResponse:
    """The dashboard lives at /ui."""
    return RedirectResponse("/ui", status_code=307)


@router.get(
    "/ui",
    response_class=HTMLResponse,
    responses={
        200: {"description": "The dashboard page.", **HTML},
        303: {"description": "Not logged in: go to /ui/login."},
        503: {"description": "Redis unavailable: the page says so.", **HTML},
    },
)
async def dashboard(request: Request) -> Response:
    """Leases, queues, blockers, reviews, the write queue and recent events (admin)."""
    svc = _services(request)
    try:
        if not await _logged_in(request):
            return RedirectResponse("/ui/login", status_code=303)
        data = await overview.overview(svc.store, svc.settings)
    except BrokerError as e:
        return _unavailable(e)
    show_logout = _admin_token(request) is not None
    return HTMLResponse(render("dashboard.html", o=data, show_logout=show_logout))


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
    admin = _admin_token(request)
    if admin is None:
        return RedirectResponse("/ui", status_code=303)
    logins = _services(request).store.logins
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
        return _unavailable(e)
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
    admin = _admin_token(request)
    session_id = session.session_of(admin, request.cookies.get(session.COOKIE)) if admin else None
    if session_id is not None:
        try:
            await _services(request).store.logins.end_session(session_id)
        except BrokerError as e:
            return _unavailable(e)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(session.COOKIE, path="/ui")
    return response


def install(app: FastAPI) -> None:
    """Mount the dashboard, its assets and the offline API docs on `app`."""
    from github_broker.ui import docs

    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    docs.install(app)
