"""The baseline app: one FastAPI endpoint doing one EVALSHA, the ceiling of a claim's shape.

A claim is one HTTP request (JSON body validated by pydantic) that costs one Redis round
trip to a Lua script. This app does exactly that and nothing else, served by uvicorn with
the same settings, so the ratio claim/baseline is the cost of the broker's own logic.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from pydantic import BaseModel

#: Environment variable naming the Redis the baseline talks to.
REDIS_URL_ENV = "BENCH_REDIS_URL"
#: The trivial script: one round trip, no key touched.
SCRIPT = "return ARGV[1]"


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


def main() -> None:
    """Serve the baseline exactly as `github-broker serve` serves the broker."""
    import argparse

    import uvicorn

    from github_broker.api.protocol import NoDelayH11Protocol

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    uvicorn.run("benchmarks.baseline:create_app", factory=True, host="127.0.0.1", port=args.port,
                workers=args.workers, http=NoDelayH11Protocol, log_level="info",
                access_log=False)


if __name__ == "__main__":
    main()
