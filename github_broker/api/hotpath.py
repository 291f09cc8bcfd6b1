"""The request that carries the load, `POST /request-task`, answered without FastAPI's machinery.

FastAPI's routing, dependency solving and body handling, and the middleware stack Starlette
and FastAPI put around every route (error pages, telemetry, FastAPI's own body limit), cost
about as much CPU per request as the claim itself. `BrokerApp` hands that one route, before
any of it, to a short pure-ASGI chain: the request timer, the body cap, then `HotPath`, which
runs the same code the declared FastAPI route runs (`routes.answer_request_task`), with the
same body model and the same error answers. Every other path goes to FastAPI, which also
keeps describing `/request-task` in the OpenAPI.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from github_broker.api import errors
from github_broker.api.limits import BodyLimit
from github_broker.api.routes import answer_request_task
from github_broker.api.schemas import TaskRequest
from github_broker.errors import BrokerError
from github_broker.metrics import RequestTaskTimer

PATH = "/request-task"


class BrokerApp(FastAPI):
    """FastAPI, except that `POST /request-task` skips the middleware stack for `hot`."""

    hot: ASGIApp | None = None

    def take_request_task(self, max_body_bytes: int) -> None:
        """Answer `POST /request-task` on the hot path: timed, body-capped, then `HotPath`."""
        self.hot = RequestTaskTimer(BodyLimit(HotPath(), max_bytes=max_body_bytes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.hot is not None
            and scope["type"] == "http"
            and scope["path"] == PATH
            and scope["method"] == "POST"
        ):
            scope["app"] = self  # as Starlette sets it: routes read app.state through it
            await self.hot(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


class HotPath:
    """The terminal ASGI app of the hot path: parse, answer, and map errors like FastAPI's
    handlers do (the last resort included: logged, a 500)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self._answer(request, scope["app"].state.services)
        except BrokerError as e:
            response = await errors.broker_error(request, e)
        except RequestValidationError as e:
            response = await errors.validation_error(request, e)
        except Exception as e:  # the same last resort as FastAPI's handler: logged, a 500
            response = await errors.unexpected_error(request, e)
        await response(scope, receive, send)

    async def _answer(self, request: Request, svc: Any) -> Any:
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
    content-type, or one whose subtype is json or ends in +json."""
    value = request.headers.get("content-type")
    if not value:
        return True
    subtype = value.split(";", 1)[0].strip().lower().rpartition("/")[2]
    return subtype == "json" or subtype.endswith("+json")
