"""The request that carries the load, `POST /request-task`, answered without FastAPI's machinery.

FastAPI's routing, dependency solving and body handling cost about as much CPU per request
as the claim itself. This pure ASGI middleware takes that one route and runs the same code
the declared FastAPI route runs (`routes.answer_request_task`), with the same body model and
the same error answers; every other path goes on to FastAPI, which also keeps describing
`/request-task` in the OpenAPI.
"""

from __future__ import annotations

from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from github_broker.api import errors
from github_broker.api.routes import answer_request_task
from github_broker.api.schemas import TaskRequest
from github_broker.errors import BrokerError

PATH = "/request-task"


class HotPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
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
        try:
            body = TaskRequest.model_validate_json(await request.body())
        except ValidationError as e:
            raise RequestValidationError(
                [{**err, "loc": ("body", *err["loc"])} for err in e.errors()]
            ) from e
        return await answer_request_task(body, request, svc)


def _json_content(request: Request) -> bool:
    """FastAPI's rule: no content-type, or one whose subtype is json or ends in +json."""
    value = request.headers.get("content-type")
    if not value:
        return True
    subtype = value.split(";", 1)[0].strip().lower().rpartition("/")[2]
    return subtype == "json" or subtype.endswith("+json")
