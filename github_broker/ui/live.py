"""Live updates of the dashboard's pages: `GET /ui/live` streams a fresh copy of the page's
changing part (server-sent events) whenever the timeline or audit streams have a new entry or
a health signal moves, and every REFRESH_S for what they do not record (ages, the queue).

One watcher per process looks at the streams' newest entries for every open page, and each
page's data is read once per change however many pages show it. Streams are bounded: they
need a login, end after STREAM_S (the browser reconnects, logging in anew), end when their
session is logged out, and a process serves at most MAX_STREAMS at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from github_broker.errors import PROBLEM_JSON, BrokerError, in_words
from github_broker.models import AGENT_ID_PATTERN
from github_broker.store import Store
from github_broker.ui import fragments, guard, views

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])

#: Seconds between two looks at the newest timeline and audit entries.
POLL_S = 1.0
#: Seconds after which open pages get a fresh copy though no stream moved (ages, health).
REFRESH_S = 10.0
#: Seconds one stream lasts; the browser's EventSource then reconnects (and is checked anew).
STREAM_S = 300.0
#: Seconds between two keep-alive comments on a quiet stream (proxies drop idle ones).
KEEPALIVE_S = 15.0
#: Milliseconds the browser waits before reconnecting a stream that ended.
RETRY_MS = 2000
#: Live streams one process serves at once; one more is refused with 503.
MAX_STREAMS = 16
#: Seconds a refused stream is told to wait (Retry-After).
FULL_RETRY_S = 30


async def stream_heads(store: Store) -> tuple[object, ...]:
    """What moves whenever something worth showing changed: the ids of the newest timeline
    and audit entries (a lease, a pause, a write, a maintainer's action), and the health
    signals they do not record (a sync failing, the mirror rebuilt, a refused delivery)."""
    events = await store.timeline(1)
    audit = await store.audit_log(1)
    heads: list[object] = [*(e.id for e in events), *(a.id for a in audit)]
    for rstore in store.repos.values():
        heads += [await rstore.sync_failing(), await rstore.mirror_rebuilt()]
    heads.append(await store.webhook_refused())
    return tuple(heads)


class LiveFeed:
    """The process's watcher of the streams and the cache of each live page's data."""

    def __init__(self) -> None:
        #: Bumped on every change; pages wait for it to move.
        self.version = 0
        self.streams = 0
        self._changed: asyncio.Condition | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._cache: dict[str, tuple[int, Any]] = {}
        self._loading: dict[str, asyncio.Lock] = {}

    def join(self, store: Store) -> bool:
        """Count one more stream (False when the process serves MAX_STREAMS already) and
        start the watcher if it is the first."""
        if self.streams >= MAX_STREAMS:
            return False
        self.streams += 1
        if self._changed is None:
            self._changed = asyncio.Condition()
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.create_task(self._watch(store))
        return True

    def leave(self) -> None:
        self.streams -= 1
        if self.streams == 0 and self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
            self._cache.clear()
            self._loading.clear()

    async def _watch(self, store: Store) -> None:
        last: tuple[object, ...] | None = None
        bumped = time.monotonic()
        while True:
            try:
                heads: tuple[object, ...] | None = await stream_heads(store)
            except BrokerError as e:
                logger.debug("live dashboard: streams unreadable: %s", e)
                heads = None
            stale = time.monotonic() - bumped >= REFRESH_S
            if (last is not None and heads != last) or stale:
                bumped = time.monotonic()
                await self._bump()
            last = heads
            await asyncio.sleep(POLL_S)

    async def _bump(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self.version += 1
            self._cache.clear()
            self._changed.notify_all()

    async def changed(self, seen: int, timeout_s: float) -> int:
        """The version once it differs from `seen`; TimeoutError after `timeout_s`."""
        assert self._changed is not None
        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(lambda: self.version != seen)
            return self.version

    async def data(self, key: str, load: Callable[[], Awaitable[Any]]) -> Any:
        """A page's data at the current version: read once, shared by every stream."""
        lock = self._loading.setdefault(key, asyncio.Lock())
        async with lock:
            version = self.version
            hit = self._cache.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
            value = await load()
            if version == self.version:
                self._cache[key] = (version, value)
            return value


def feed(request: Request) -> LiveFeed:
    live: LiveFeed = request.app.state.live_feed
    return live


def _event(name: str, payload: dict[str, Any]) -> bytes:
    # An id makes the browser send Last-Event-ID when it reconnects (see `live`).
    return f"id: {name}\nevent: {name}\ndata: {json.dumps(payload)}\n\n".encode()


async def _stream(
    request: Request,
    who: guard.Visitor,
    render: Callable[[], Awaitable[str]],
    resumed: bool,
) -> AsyncIterator[bytes]:
    live = feed(request)
    # A page just loaded is fresh; a stream that reconnects (after STREAM_S, or to another
    # process) may have missed a change meanwhile: it gets the page at once.
    seen = -1 if resumed else live.version
    deadline = time.monotonic() + STREAM_S
    yield f"retry: {RETRY_MS}\n\n".encode()
    while (left := deadline - time.monotonic()) > 0:
        try:
            seen = await live.changed(seen, min(left, KEEPALIVE_S))
        except TimeoutError:
            yield b": keep-alive\n\n"
            continue
        try:
            if who.session_id is not None and not await guard.session_alive(
                request, who.session_id
            ):
                yield _event("logout", {"detail": "logged out"})
                return
            yield _event("update", {"html": await render()})
        except BrokerError as e:
            yield _event("trouble", {"detail": in_words(e)})


def _problem(status: int, detail: str, reason: str, **headers: str) -> JSONResponse:
    return JSONResponse({"detail": detail, "reason": reason}, status_code=status, headers=headers)


@router.get(
    "/ui/live",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-sent events: `update` with `{html}`, the page's changing "
            "part, on every change; `trouble` with `{detail}` while the state cannot be "
            "read; `logout` when the session ended. The stream ends after 300 s (the browser "
            "reconnects).",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        401: {"description": "Not logged in.", "content": PROBLEM_JSON},
        422: {
            "description": "`agent` is not an agent id, or `range` not 1h or 24h.",
            "content": PROBLEM_JSON,
        },
        503: {
            "description": "This process serves as many live pages as it may (Retry-After "
            "says when to try again; the page keeps working by itself), or Redis is "
            "unavailable.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
            "content": PROBLEM_JSON,
        },
    },
)
async def live(
    request: Request,
    agent: Annotated[
        str | None,
        Query(pattern=AGENT_ID_PATTERN, description="The agent page's updates, not /ui's."),
    ] = None,
    range_name: Annotated[
        Literal["1h", "24h"], Query(alias="range", description="/ui's trend charts' range.")
    ] = "1h",
) -> Response:
    """Live updates of the dashboard (or of one agent's page) while it is open (admin)."""
    try:
        who = await guard.visitor(request)
    except BrokerError as e:
        return _problem(503, in_words(e), "unavailable", **{"Retry-After": "2"})
    if who is None or who.new_csrf_cookie is not None:
        # An open dashboard's page sets its CSRF cookie first: a stream without one was not
        # opened by it.
        return _problem(401, "log in at /ui/login first", "unauthorized")
    if request.scope.get("head"):
        # A HEAD request: the stream's headers, no stream (it would hold a slot for minutes).
        return Response(media_type="text/event-stream")
    svc = guard.services(request)
    if not feed(request).join(svc.store):
        return _problem(
            503,
            f"this process serves {MAX_STREAMS} live pages already; reload the page later",
            "unavailable",
            **{"Retry-After": str(FULL_RETRY_S)},
        )

    live_feed = feed(request)
    render = _renderer(live_feed, svc, who, agent, range_name)
    resumed = "last-event-id" in request.headers
    return LiveResponse(_stream(request, who, render, resumed), live_feed.leave)


def _renderer(
    live_feed: LiveFeed, svc: Any, who: guard.Visitor, agent: str | None, range_name: str
) -> Callable[[], Awaitable[str]]:
    """The page's fragment, rendered anew; pages are read once per change for every viewer
    who sees the same: the whole deployment, or one person's repositories."""
    mine = who.actor.repositories
    seen = "all" if mine is None else f"{who.actor.name}:{hash(mine)}"

    async def render() -> str:
        if agent is None:
            board = await live_feed.data(
                f"dashboard:{seen}:{range_name}",
                lambda: views.dashboard_view(svc.store, svc.settings, range_name, who.actor),
            )
            return fragments.dashboard(board, who)
        board = await live_feed.data(
            f"dashboard:{seen}",
            lambda: views.dashboard_view(svc.store, svc.settings, None, who.actor),
        )
        page = await live_feed.data(
            f"agent:{seen}:{agent}",
            lambda: views.agent_view(svc.store, board, agent, who.actor),
        )
        return fragments.agent(page, who)

    return render


class LiveResponse(StreamingResponse):
    """The event stream, giving its place back however it ends (a client that went away
    before the first byte included)."""

    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
