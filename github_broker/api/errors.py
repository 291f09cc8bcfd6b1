"""The one table from domain errors to HTTP answers; no traceback ever reaches a client."""

from __future__ import annotations

import logging
import math
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from github_broker.errors import (
    AgentPaused,
    AuthError,
    BrokerError,
    Conflict,
    GitHubUnavailable,
    InvalidRequest,
    LeaseError,
    MirrorRebuilding,
    NotFound,
    RateLimited,
    StoreUnavailable,
)
from github_broker.models import ENDED_STATE

logger = logging.getLogger(__name__)

#: Retry-After (seconds) sent with a 503 while Redis or GitHub is down.
UNAVAILABLE_RETRY_S = 2

#: The `reason` of each error status (409's come with the lease refusal's own reason; a 503
#: says `rebuilding` while the mirror is rebuilt after a Redis loss and `rate_limited` while
#: GitHub's limit holds): a client tells answers apart by reason, never by the text.
REASONS: dict[int, str] = {
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    421: "misdirected",
    422: "invalid_request",
    429: "too_many_attempts",
    500: "internal",
    503: "unavailable",
}

STATUS: dict[type[BrokerError], int] = {
    InvalidRequest: 422,
    NotFound: 404,
    LeaseError: 409,
    AgentPaused: 409,
    Conflict: 409,
    AuthError: 401,
    StoreUnavailable: 503,
    GitHubUnavailable: 503,
    RateLimited: 503,
}


def _answer(
    status: int,
    detail: str,
    reason: str | None = None,
    headers: dict[str, str] | None = None,
    state: str | None = None,
) -> JSONResponse:
    body: dict[str, str | None] = {"detail": detail, "reason": reason}
    if state is not None:
        body["state"] = state
    return JSONResponse(body, status_code=status, headers=headers)


async def broker_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BrokerError)
    status = next((code for cls, code in STATUS.items() if isinstance(exc, cls)), 500)
    headers = None
    if isinstance(exc, RateLimited):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_at_s - time.time())))}
    elif status == 503:
        headers = {"Retry-After": str(UNAVAILABLE_RETRY_S)}
    if isinstance(exc, AuthError) and getattr(exc, "forbidden", False):
        status = 403
    reason = exc.reason if isinstance(exc, LeaseError | AgentPaused) else REASONS.get(status)
    if isinstance(exc, MirrorRebuilding):
        reason = "rebuilding"
    elif isinstance(exc, RateLimited):
        reason = "rate_limited"
    if status >= 500:
        # The answer says what is wrong; the cause (with addresses) is for the operator.
        logger.warning(
            "%s %s -> %d: %s (%s)",
            request.method,
            request.url.path,
            status,
            exc,
            exc.__cause__ or "no detail",
        )
    state = None
    if isinstance(exc, LeaseError):
        ended = ENDED_STATE.get(exc.reason)
        state = ended.value if ended is not None else None
    return _answer(status, str(exc), reason, headers, state)


async def validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for err in exc.errors():
        where = err.get("loc", ())
        if err.get("type") == "json_invalid" and len(where) == 2 and isinstance(where[1], int):
            # FastAPI's (and the lease hot path's) decode error: loc ("body", offset).
            error = (err.get("ctx") or {}).get("error", "malformed")
            parts.append(f"`body`: invalid JSON at character {where[1]}: {error}")
            continue
        loc = ".".join(str(p) for p in where if p != "body") or "body"
        parts.append(f"`{loc}`: {err.get('msg', 'invalid')}")
    return _answer(422, "invalid request: " + "; ".join(parts), "invalid_request")


#: What FastAPI says when a body is not JSON it can decode (bad UTF-8, nesting too deep).
UNPARSABLE = "There was an error parsing the body"


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own refusals in the API's shape; an undecodable body is malformed JSON like
    any other, so it gets the same 422."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == UNPARSABLE:
        return _answer(
            422,
            "invalid request: `body`: not JSON the broker can read (UTF-8, nested at most "
            "a few hundred levels)",
            "invalid_request",
        )
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request) or headers.get("Allow", "")
    return _answer(exc.status_code, str(exc.detail), REASONS.get(exc.status_code), headers or None)


#: Methods a 405's `Allow` may name.
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route of this path takes: Starlette's 405 names only the first route
    that matched the path (`GET /ui/login` hides `POST /ui/login`)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    if "GET" in allowed and "HEAD" not in allowed:
        allowed.insert(allowed.index("GET") + 1, "HEAD")  # answered like GET (BrokerApp)
    return ", ".join(allowed)


async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return _answer(500, "internal error; the broker logged the details", "internal")


def install(app: FastAPI) -> None:
    app.add_exception_handler(BrokerError, broker_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
