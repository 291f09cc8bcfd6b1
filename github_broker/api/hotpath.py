"""The requests that carry the load, `POST /request-task` and the lease calls
(`POST /tasks/{owner}/{repo}/{number}/heartbeat|complete|release`), answered without
FastAPI's machinery.

FastAPI's routing, dependency solving and body handling, and the middleware stack Starlette
and FastAPI put around every route (error pages, telemetry, FastAPI's own body limit), cost
about as much CPU per request as the claim itself. `BrokerApp` hands that one route, before
any of it, to a short pure-ASGI chain: the request timer, the body cap, then `HotPath`, which
runs the same code the declared FastAPI route runs (`routes.answer_request_task`), with the
same body model and the same error answers. The lease calls take the same way without the
timer: `LeasePath` parses the path and the body as FastAPI does for the declared routes (the
same pydantic checks, errors in the same order and words) and runs their functions
(`routes.answer_heartbeat`, `answer_complete`, `answer_release`). Every other path goes to
FastAPI, which also keeps describing these routes in the OpenAPI.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from github_broker.api import errors
from github_broker.api.hosts import HostGuard
from github_broker.api.limits import BodyLimit
from github_broker.api.routes import (
    answer_complete,
    answer_heartbeat,
    answer_release,
    answer_request_task,
)
from github_broker.api.schemas import (
    HeartbeatRequest,
    LeaseRequest,
    ReleaseRequest,
    TaskRequest,
)
from github_broker.errors import BrokerError
from github_broker.metrics import RequestTaskTimer
from github_broker.models import MAX_NUMBER

PATH = "/request-task"
#: The lease calls, matched as Starlette matches `/tasks/{owner}/{repo}/{number}/<action>`.
LEASE_PATH = re.compile(r"/tasks/([^/]+)/([^/]+)/([^/]+)/(heartbeat|complete|release)")


class BrokerApp(FastAPI):
    """FastAPI, except that `POST /request-task` and the lease calls skip the middleware
    stack for `hot` and `hot_leases`."""

    hot: ASGIApp | None = None
    hot_leases: ASGIApp | None = None
    #: The Host and Origin rules of a deployment without tokens (None: tokens are configured).
    host_guard: HostGuard | None = None

    def take_request_task(self, max_body_bytes: int) -> None:
        """Answer `POST /request-task` on the hot path: timed, body-capped, then `HotPath`;
        the lease calls body-capped, then `LeasePath`."""
        self.hot = RequestTaskTimer(BodyLimit(HotPath(), max_bytes=max_body_bytes))
        self.hot_leases = BodyLimit(LeasePath(), max_bytes=max_body_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.host_guard is not None and scope["type"] in ("http", "websocket"):
            refusal = self.host_guard.refusal(scope)
            if refusal is not None:
                await self.host_guard.refuse(refusal, send)
                return
        if scope["type"] == "http" and scope["method"] == "HEAD":
            # Every GET route answers HEAD (RFC 9110): the GET's status and headers, no body.
            # FastAPI's routes take only the methods they name, so HEAD got 405 everywhere.
            # `head`: routes that stream (the dashboard's live page) answer without opening
            # the stream.
            head = {**scope, "method": "GET", "head": True}
            await super().__call__(head, receive, _without_body(send))
            return
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            if path == PATH:
                if self.hot is not None:
                    scope["app"] = self  # as Starlette sets it: routes read app.state through it
                    await self.hot(scope, receive, send)
                    return
            elif self.hot_leases is not None and path.startswith("/tasks/"):
                found = LEASE_PATH.fullmatch(path)
                if found is not None:
                    scope["app"] = self
                    scope["path_params"] = dict(
                        zip(("owner", "repo", "number", "action"), found.groups(), strict=True)
                    )
                    await self.hot_leases(scope, receive, send)
                    return
        await super().__call__(scope, receive, send)


def _without_body(send: Send) -> Send:
    """`send` dropping the body's bytes (and keeping its headers, Content-Length included)."""

    async def sender(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return sender


class HotPath:
    """The terminal ASGI app of the hot path: parse, answer, and map errors like FastAPI's
    handlers do (the last resort included: logged, a 500)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            content = await self._answer(request, scope["app"].state.services)
        except Exception as e:
            response = await _error_response(request, e)
            await response(scope, receive, send)
            return
        if content is None:  # as Starlette's Response(status_code=204): no body, no length
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        else:
            await _send_json(send, content)

    async def _answer(self, request: Request, svc: Any) -> bytes | None:
        if not _json_content(request):
            message = "send the body as JSON (content-type: application/json)"
            raise RequestValidationError([{"loc": ("body",), "msg": message}])
        raw = await request.body()
        try:
            try:
                body = TaskRequest.model_validate_json(raw)
            except ValidationError as e:
                if e.errors()[0]["type"] != "json_invalid":
                    raise
                # What FastAPI's route reads with json.loads: a byte-order mark, UTF-16/32.
                body = TaskRequest.model_validate(_loads_or_raise(raw, e))
        except ValidationError as e:
            raise RequestValidationError(
                [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
            ) from e
        return await answer_request_task(body, request, svc)


def _loads_or_raise(raw: bytes, error: ValidationError) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than json can read
        raise error from None


def _json_content(request: Request) -> bool:
    """FastAPI's rule with `strict_content_type=False` (as `create_app` sets it): no
    content-type, or `application/json` or `application/<anything>+json` (the type read as
    `email.message` reads it: up to the first `;`, one `/`, case-insensitive)."""
    # The raw ASGI headers (names arrive lowercased), not Starlette's `Headers` mapping:
    # building that costs more than this whole check, once per request.
    raw = next((v for k, v in request.scope["headers"] if k == b"content-type"), None)
    if not raw:
        return True
    media = raw.decode("latin-1").split(";", 1)[0].strip().lower()
    if media.count("/") != 1:
        return False  # email.message reads it as text/plain
    main, subtype = media.split("/")
    return bool(main == "application" and (subtype == "json" or subtype.endswith("+json")))


#: The declared routes' `number: IssueNumber` path parameter, validated as FastAPI does.
_NUMBER = TypeAdapter(Annotated[int, Field(ge=1, le=MAX_NUMBER)])
#: action -> (body model, the route's function).
_LEASE_ACTIONS: dict[str, tuple[type[BaseModel], Any]] = {
    "heartbeat": (HeartbeatRequest, answer_heartbeat),
    "complete": (LeaseRequest, answer_complete),
    "release": (ReleaseRequest, answer_release),
}
#: FastAPI's answer to a body it cannot decode (errors.http_error makes it the API's 422).
_UNPARSABLE = HTTPException(status_code=400, detail=errors.UNPARSABLE)


class LeasePath:
    """The terminal ASGI app of the lease calls. Parses like FastAPI's declared route: the
    body read as JSON (by the content-type rule of `strict_content_type=False`), then the
    path number and the body validated, every error of both reported together; answers
    like it (the response model's JSON) and maps errors with the same handlers."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            payload = await self._answer(request, scope)
        except Exception as e:
            response = await _error_response(request, e)
            await response(scope, receive, send)
            return
        await _send_json(send, payload.model_dump_json().encode())

    async def _answer(self, request: Request, scope: Scope) -> BaseModel:
        params = scope["path_params"]
        model, answer = _LEASE_ACTIONS[params["action"]]
        value = await _body_value(request)
        problems: list[dict[str, Any]] = []
        number = 0
        try:
            number = _NUMBER.validate_python(params["number"], from_attributes=True)
        except ValidationError as e:
            problems += [{**err, "loc": ("path", "number", *err["loc"])} for err in e.errors()]
        body: Any = None
        if value is _MISSING:
            problems.append(
                {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
            )
        else:
            try:
                body = model.model_validate(value, from_attributes=True)  # as FastAPI
            except ValidationError as e:
                problems += [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
        if problems:
            raise RequestValidationError(problems)
        repository = f"{params['owner']}/{params['repo']}"
        result: BaseModel = await answer(
            repository, number, body, request, scope["app"].state.services
        )
        return result


async def _body_value(request: Request) -> Any:
    """The body as FastAPI reads it: JSON when it says so, else the raw bytes (refused by the
    model as FastAPI refuses them); _MISSING when there is none."""
    raw = await request.body()
    if not raw:
        return _MISSING
    if not _json_content(request):
        return raw  # not JSON: validated as it is, and refused, as FastAPI does
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", e.pos),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": e.msg},
                }
            ]
        ) from e
    except Exception as e:  # undecodable, too deep: FastAPI's 400, our 422
        raise _UNPARSABLE from e


_MISSING = object()


async def _send_json(send: Send, content: bytes) -> None:
    """A 200 with a JSON body, the headers as Starlette's `Response` writes them."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-length", str(len(content)).encode()),
                (b"content-type", b"application/json"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": content})


async def _error_response(request: Request, exc: Exception) -> Any:
    if isinstance(exc, BrokerError):
        return await errors.broker_error(request, exc)
    if isinstance(exc, RequestValidationError):
        return await errors.validation_error(request, exc)
    if isinstance(exc, HTTPException):
        return await errors.http_error(request, exc)
    return await errors.unexpected_error(request, exc)
