"""Signing in to the dashboard with a GitHub identity: a GitHub token pasted in, or GitHub's
OAuth device flow (a code the person enters on GitHub). Either way the person's token is read
once, for who they are and their permissions on the served repositories (people/rights.py),
and dropped; the session names them and lasts `signin.github_rights_s`."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from github_broker.clock import iso_from_ms, now_ms
from github_broker.errors import BrokerError, GitHubError
from github_broker.models import Actor
from github_broker.steering.authority import described
from github_broker.ui import guard
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

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])
#: The cookie naming a device-flow sign-in in progress.
DEVICE_COOKIE = "github_broker_device"
#: Longest a device code is kept waiting (GitHub's are 15 minutes).
DEVICE_MAX_S = 900

_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "The device flow's page: the code to enter on GitHub.", **HTML},
    303: {"description": "Signed in: a session cookie is set, go to /ui."},
    401: {"description": "GitHub refused the token, or the sign-in ended: the form again.", **HTML},
    403: {
        "description": "GitHub grants this person no served repository: the form again.",
        **HTML,
    },
    404: {"description": "Signing in with GitHub is not configured here.", **HTML},
    429: {
        "description": "This client's wrong attempts put it in a delay: Retry-After says "
        "when to try again.",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        **HTML,
    },
    503: {"description": "GitHub or Redis unavailable: the page says so.", **HTML},
}


async def _form(request: Request) -> dict[str, list[str]] | None:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return None
    body = await request.body()
    return None if len(body) > LOGIN_BODY_MAX else parse_qs(body.decode(errors="replace"))


@router.post(
    "/ui/login/github",
    response_class=HTMLResponse,
    responses=_ANSWERS,
    openapi_extra=form_body("github_token"),
)
async def with_token(request: Request) -> Response:
    """Sign in with a GitHub token of the person's (read once, never kept): a maintainer of
    the served repositories where GitHub grants them `signin.github_grants`."""
    if not guard.services(request).settings.signin.github:
        return login_page(request, "signing in with GitHub is not configured here", 404)
    fields = await _form(request)
    token = ((fields or {}).get("github_token") or [""])[0].strip()
    if not token:
        return login_page(request, "paste a GitHub token into the form", 401)
    try:
        verdict = await attempt(request, None)
        if verdict.waiting:
            return refused_login(request, verdict, "")
        try:
            actor = await guard.services(request).rights.sign_in(token)
        except GitHubError as e:
            logger.info("GitHub sign-in refused: %s", e)
            verdict = await attempt(request, False)
            return refused_login(request, verdict, "GitHub does not accept that token")
        await attempt(request, True)
        return await _session(request, actor)
    except BrokerError as e:
        return guard.unavailable(e)


async def _session(request: Request, actor: Actor) -> Response:
    """The session of a GitHub identity, or the form saying it steers nothing here."""
    if actor.repositories is not None and not actor.repositories:
        grants = guard.services(request).settings.signin.github_grants
        why = f"{actor.name} is not granted {grants} on any repository this broker serves"
        return login_page(request, why, 403)
    login = actor.name.removeprefix("github:")
    person = guard.services(request).auth.people.by_github(login)
    record = {"via": "github", "login": person.github if person else login}
    logger.info("dashboard sign-in with GitHub: %s", described(actor))
    ttl_s = guard.services(request).settings.signin.github_rights_s
    return await signed_in(request, record, ttl_s)


@router.post("/ui/login/github/device", response_class=HTMLResponse, responses=_ANSWERS)
async def device_start(request: Request) -> Response:
    """Start GitHub's device flow: the page shows a code to enter on GitHub, then Continue."""
    svc = guard.services(request)
    client_id = svc.settings.signin.github_client_id
    if client_id is None:
        return login_page(request, "signing in with GitHub is not configured here", 404)
    try:
        verdict = await attempt(request, None)
        if verdict.waiting:
            return refused_login(request, verdict, "")
        scope = svc.settings.signin.github_scope
        started = await asyncio.to_thread(svc.rights.personal.device_code, client_id, scope)
        ttl_s = max(1, min(int(started.get("expires_in") or DEVICE_MAX_S), DEVICE_MAX_S))
        pending = {
            "device_code": str(started["device_code"]),
            "user_code": str(started.get("user_code", "")),
            "uri": _web_link(str(started.get("verification_uri", ""))),
            "until_ms": now_ms() + ttl_s * 1000,
        }
        attempt_id = await svc.store.logins.device_wait(ttl_s, pending)
    except GitHubError as e:
        logger.warning("GitHub device flow refused: %s", e)
        return login_page(request, "GitHub refused to start the sign-in; try again later", 503)
    except BrokerError as e:
        return guard.unavailable(e)
    response = _device_page(pending, None)
    return guard.strict_cookie(response, request, DEVICE_COOKIE, attempt_id, "/ui/login", ttl_s)


@router.post("/ui/login/github/device/poll", response_class=HTMLResponse, responses=_ANSWERS)
async def device_poll(request: Request) -> Response:
    """Ask GitHub whether the person entered the code: signed in, or the page again."""
    svc = guard.services(request)
    client_id = svc.settings.signin.github_client_id
    attempt_id = request.cookies.get(DEVICE_COOKIE, "")
    if client_id is None:
        return login_page(request, "signing in with GitHub is not configured here", 404)
    try:
        pending = await svc.store.logins.device_pending(attempt_id) if attempt_id else None
        if pending is None:
            return login_page(request, "that sign-in ended; start again", 401)
        answer = await asyncio.to_thread(
            svc.rights.personal.device_token, client_id, pending["device_code"]
        )
        error = answer.get("error")
        if error in ("authorization_pending", "slow_down"):
            why = "GitHub has not seen the code entered yet; enter it, then continue"
            return _device_page(pending, why)
        await svc.store.logins.device_done(attempt_id)
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            why = "GitHub ended the sign-in (" + str(error or "no token") + "); start again"
            return login_page(request, why, 401)
        actor = await svc.rights.sign_in(token)
        response = await _session(request, actor)
    except GitHubError as e:
        logger.warning("GitHub device flow failed: %s", e)
        return login_page(request, "GitHub refused the sign-in; start again", 401)
    except BrokerError as e:
        return guard.unavailable(e)
    response.delete_cookie(DEVICE_COOKIE, path="/ui/login")
    return response


def _device_page(pending: dict[str, Any], error: str | None) -> HTMLResponse:
    page = render(
        "device.html",
        uri=pending["uri"],
        user_code=pending["user_code"],
        expires=iso_from_ms(int(pending["until_ms"])),
        error=error,
    )
    return HTMLResponse(page, headers={"Cache-Control": "no-store"})


def _web_link(uri: str) -> str:
    """GitHub's verification page, shown as a link: http(s) only."""
    return uri if urlsplit(uri).scheme in ("http", "https") else "https://github.com/login/device"
