"""The baselines: one EVALSHA per request, the ceiling of a claim's shape.

A claim is one HTTP request (a JSON body) that costs one Redis round trip to a Lua script.
Two apps do exactly that and nothing else, served by uvicorn with serve's settings, so the
ratio claim/baseline is the cost of the broker's own logic:

- `fastapi`: a FastAPI endpoint with a pydantic body model, the framework serve is built on;
- `asgi`: the same endpoint as a bare ASGI callable (json in, one EVALSHA, json out), no
  framework at all, on redis-py's asyncio client (a connection checked out of its pool per
  call);
- `asgi-pipelined`: the same bare endpoint on serve's own Redis client (one pipelined
  hiredis connection per event loop, `github_broker/store/resp.py`: `pipelined_for`,
  `PipelinedScript`), the fairest ceiling: what is left between it and serve is the
  broker's own logic, not its Redis client.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from pydantic import BaseModel

from github_broker.store.resp import PipelinedScript, close_pipelined, pipelined_for

#: Environment variable naming the Redis the baseline talks to.
REDIS_URL_ENV = "BENCH_REDIS_URL"
#: The trivial script: one round trip, no key touched.
SCRIPT = "return ARGV[1]"
KINDS = ("fastapi", "asgi", "asgi-pipelined")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class TaskRequest(BaseModel):
    agent_id: str
    previous: str = "completed"


def create_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = aioredis.Redis.from_url(os.environ[REDIS_URL_ENV])
        app.state.script = client.register_script(SCRIPT)
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="baseline", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/request-task")
    async def request_task(body: TaskRequest, request: Request) -> dict[str, Any]:
        value = await request.app.state.script(keys=[], args=[body.agent_id])
        return {"agent_id": body.agent_id, "echo": value.decode()}

    return app


class BareApp:
    """The same two routes as a bare ASGI application; `pipelined`: on serve's Redis client
    instead of redis-py's."""

    def __init__(self, *, pipelined: bool = False) -> None:
        self.pipelined = pipelined
        self.script: Any = None
        self.client: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await _answer(send, 200, b'{"status":"ok"}')
            return
        if path != "/request-task" or scope["method"] != "POST":
            await _answer(send, 404, b'{"detail":"not found"}')
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            agent_id = str(json.loads(b"".join(chunks))["agent_id"])
        except (ValueError, KeyError, TypeError):
            await _answer(send, 422, b'{"detail":"agent_id required"}')
            return
        value = await self.script(keys=[], args=[agent_id])
        body = json.dumps({"agent_id": agent_id, "echo": value.decode()}).encode()
        await _answer(send, 200, body)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.client = aioredis.Redis.from_url(os.environ[REDIS_URL_ENV])
                if self.pipelined:
                    # As serve's store builds it (store/scripts.py): the pipelined client for
                    # the redis-py client's server, one EVALSHA per call.
                    pipelined = pipelined_for(self.client)
                    if pipelined is None:
                        raise RuntimeError(f"{REDIS_URL_ENV} is not a plain redis:// URL")
                    self.script = PipelinedScript(pipelined, SCRIPT)
                else:
                    self.script = self.client.register_script(SCRIPT)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.pipelined:
                    await close_pipelined(self.client)
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def create_asgi_app() -> BareApp:
    return BareApp()


def create_pipelined_app() -> BareApp:
    return BareApp(pipelined=True)


def main() -> None:
    """Serve a baseline exactly as `github-broker serve` serves the broker."""
    import argparse

    from github_broker.processes.api_worker import ServeSpec
    from github_broker.processes.supervisor import Supervisor

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--kind", choices=KINDS, default="fastapi")
    args = parser.parse_args()
    factory = {
        "fastapi": "create_app",
        "asgi": "create_asgi_app",
        "asgi-pipelined": "create_pipelined_app",
    }[args.kind]
    spec = ServeSpec(
        app=f"benchmarks.baseline:{factory}",
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="info",
        access_log=False,
    )
    raise SystemExit(Supervisor(spec, poller=False).run())


if __name__ == "__main__":
    main()
