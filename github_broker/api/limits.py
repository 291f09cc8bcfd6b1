"""Request body cap: a body over `server.max_body_bytes` gets 413 before any route runs."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)


class BodyLimit:
    """Pure ASGI middleware: refuses by Content-Length at once, else reads the streamed body
    up to the cap (never more) and hands the route the whole of it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, declared)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, size)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: list[bytes] | None = [b"".join(chunks)]

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                whole, body = body[0], None
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: the disconnect, for long-polls

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, send: Send, size: int) -> None:
        logger.info(
            "%s %s: body of %d bytes or more refused (limit %d)",
            scope.get("method"),
            scope.get("path"),
            size,
            self.max_bytes,
        )
        await send_problem(
            send,
            413,
            f"request body too large: the limit is {self.max_bytes} bytes",
            "too_large",
        )


async def send_problem(send: Send, status: int, detail: str, reason: str) -> None:
    """Answer with the API's error shape (`Problem`) straight from ASGI."""
    payload = json.dumps({"detail": detail, "reason": reason}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
