"""`create_app()`: builds settings, store, services and the daemon for one serve process."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from fastapi import FastAPI

from github_broker import __version__
from github_broker.api import admin, errors, routes, webhooks
from github_broker.api.auth import Authenticator, open_deployment
from github_broker.api.hosts import SAFE_METHODS, HostGuard
from github_broker.api.hotpath import BrokerApp
from github_broker.api.limits import BodyLimit
from github_broker.claim.credentials import AgentCredentials
from github_broker.claim.events import ReadyWaker
from github_broker.claim.prompts import Prompts
from github_broker.claim.service import TaskService
from github_broker.errors import BODY_LIMIT_RESPONSE, BrokerError, ConfigError, StoreUnavailable
from github_broker.gateway import GitHubGateway
from github_broker.gateway.credentials import AppTokens
from github_broker.leader.poller import Daemon
from github_broker.leader.sync import Syncer
from github_broker.metrics import Metrics
from github_broker.people.rights import GitHubRights
from github_broker.settings import Settings, default_config_dir, load_settings
from github_broker.steering.actions import Steering
from github_broker.store import Store
from github_broker.ui import github_signin
from github_broker.ui import routes as dashboard

logger = logging.getLogger(__name__)

#: Seconds a GitHub reachability check is reused by /ready.
READY_CACHE_S = 10.0


@dataclass
class Services:
    settings: Settings
    store: Store
    gateway: GitHubGateway
    tasks: TaskService
    auth: Authenticator
    daemon: Daemon | None
    metrics: Metrics
    steering: Steering
    #: Where GitHub makes people maintainers (sign-in, `github_rights` in the file).
    rights: GitHubRights
    #: Agents' scoped GitHub tokens (None: github.agent_credentials is off).
    credentials: AgentCredentials | None = None
    _github_ok: tuple[bool, float, str] = (False, 0.0, "not checked yet")

    async def github_reachable(self) -> tuple[bool, str]:
        ok, at, why = self._github_ok
        if time.monotonic() - at < READY_CACHE_S:
            return ok, why
        try:
            quota = await asyncio.to_thread(self.gateway.ping)
            ok, why = True, f"quota remaining {quota.remaining}"
        except BrokerError as e:
            ok, why = False, str(e)
        self._github_ok = (ok, time.monotonic(), why)
        return ok, why


def _wake_waiters_on_exit(waker: ReadyWaker) -> Callable[[], None]:
    """On SIGTERM/SIGINT answer waiting long-polls at once (204), then let uvicorn's own
    handler stop accepting and shut down: no orchestrator grace period is spent waiting.
    Returns what puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signals are only caught in the main thread (in-thread servers)
    loop = asyncio.get_running_loop()
    saved: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        saved[sig] = previous

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            loop.call_soon_threadsafe(waker.close)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, handler)

    def restore() -> None:
        for sig, previous in saved.items():
            if previous is not None:  # None: not installed from Python, nothing to restore
                signal.signal(sig, previous)

    return restore


def create_app(settings: Settings | None = None, config_dir: Path | None = None) -> FastAPI:
    """The ASGI app. Without arguments it loads settings like the CLI (uvicorn --factory)."""
    config_dir = config_dir or default_config_dir()
    settings = settings or load_settings(config_dir)
    prompts = Prompts.load(config_dir)
    app = BrokerApp(
        title="github-broker",
        version=__version__,
        description="Hands GitHub issues to AI coding agents as leased tasks.",
        lifespan=_lifespan(settings, prompts),
        docs_url=None,  # served offline by the dashboard package
        # A JSON body sent without a content-type header is read as JSON, on every route as
        # on the hot path (`curl -d` sends a form content-type, so it still needs `-H`).
        strict_content_type=False,
    )
    _install_handlers(app, settings)
    _declare_openapi(app, settings)
    return app


def _lifespan(
    settings: Settings, prompts: Prompts
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What the app starts and stops around serving: the store, the gateway, the long-poll
    waker, the poller daemon (`server.run_poller`) and the services the routes use."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        _say_how_leases_are_signed(settings)
        store = await _open_store(settings)
        gateway = GitHubGateway(settings.github)
        waker = ReadyWaker(settings.server.long_poll_recheck_s)
        waker.start(store)
        restore_signals = _wake_waiters_on_exit(waker)
        daemon = Daemon(settings, store, gateway) if settings.server.run_poller else None
        if daemon is not None:
            await daemon.hold_leadership()
            daemon.start()
        app.state.services = _services(settings, prompts, store, gateway, waker, daemon)
        try:
            yield
        finally:
            await _stop_services(app.state.services)
            restore_signals()
            await waker.stop()
            await store.close()
            await asyncio.to_thread(gateway.close)

    return lifespan


async def _open_store(settings: Settings) -> Store:
    """The store, its durability said in the log (checked at start only)."""
    store = Store.from_settings(settings)
    try:
        logger.info("durability %s", await store.check_durability())
    except StoreUnavailable as e:
        # Serve anyway (answers 503 while Redis is away); checked again by no one, so say so.
        logger.warning("redis.durability not checked at start, Redis unavailable: %s", e)
    return store


def _services(
    settings: Settings,
    prompts: Prompts,
    store: Store,
    gateway: GitHubGateway,
    waker: ReadyWaker,
    daemon: Daemon | None,
) -> Services:
    """What the routes use, built once per app."""
    auth = Authenticator(settings.server, [r.full_name for r in settings.repositories])
    services = Services(
        settings=settings,
        store=store,
        gateway=gateway,
        tasks=TaskService(settings, store, prompts, waker),
        auth=auth,
        daemon=daemon,
        metrics=Metrics(),
        steering=Steering(settings, store, Syncer(settings, store, gateway).reindex),
        rights=GitHubRights(settings, store, gateway, auth.people),
    )
    services.credentials = _agent_credentials(settings, store)
    return services


async def _stop_services(services: Services) -> None:
    """The services' own background work ended: rights, agents' credentials, the daemon."""
    services.rights.close()
    if services.credentials is not None:
        await services.credentials.close()
    if services.daemon is not None:
        await services.daemon.stop()


def _agent_credentials(settings: Settings, store: Store) -> AgentCredentials | None:
    """Agents' scoped GitHub tokens, minted from the App's installation, when configured."""
    if not settings.github.agent_credentials:
        return None
    app_tokens = AppTokens(settings.github)
    return AgentCredentials(store, app_tokens.mint, app_tokens.revoke, app_tokens.close)


def _say_how_leases_are_signed(settings: Settings) -> None:
    """A warning at start when lease tokens are unsigned: after Redis loses its data, nothing
    but GitHub's labels then proves who holds a lease."""
    try:
        keys = settings.leases.resolved_signing_keys(settings.server)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if not keys:
        logger.warning(
            "lease tokens are unsigned (no token and no signing key configured): after Redis "
            "loses its data a lease is proven only by GitHub's labels; set "
            "leases.signing_keys or leases.signing_keys_file"
        )
    else:
        logger.info("lease tokens are signed with key %r", next(iter(keys)))


def _install_handlers(app: BrokerApp, settings: Settings) -> None:
    """The error table, the middleware, the hot path, the routers and the dashboard, in
    the order they wrap one another."""
    errors.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.server.max_body_bytes)
    if settings.server.trusted_proxies:
        # Forwarded headers only from the configured proxies (uvicorn's own trust of loopback
        # is switched off where the broker runs uvicorn: api_worker, sandbox).
        from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.server.trusted_proxies)
    app.take_request_task(settings.server.max_body_bytes)
    if open_deployment(settings.server):
        app.host_guard = HostGuard(settings.server.allowed_hosts)
    app.include_router(routes.router)
    app.include_router(webhooks.router)
    app.include_router(admin.router)
    dashboard.install(app)
    app.include_router(github_signin.router, responses=BODY_LIMIT_RESPONSE)


def _declare_openapi(app: BrokerApp, settings: Settings) -> None:
    """The OpenAPI, built once: this deployment's roles and repositories, the open
    deployment's 421 and cross-origin 403, HEAD routes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = declare_deployment(FastAPI.openapi(app), settings)
            app.openapi_schema = declare_head(declare_hosts(spec))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def declare_deployment(spec: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The OpenAPI names this deployment's roles (agents.yml) and repositories where a request
    may name them: anything else is a 422, so the schema says which values are valid."""
    roles = list(settings.roles)
    repositories = [r.full_name for r in settings.repositories]

    def items_of(schema: dict[str, Any]) -> dict[str, Any]:
        array = next(s for s in schema["anyOf"] if s.get("type") == "array")
        items: dict[str, Any] = array["items"]
        return items

    request = spec["components"]["schemas"]["TaskRequest"]["properties"]
    if roles:
        items_of(request["roles"])["enum"] = roles
    if repositories:
        items_of(request["repositories"])["enum"] = repositories
    for param in spec["paths"]["/explain"]["get"]["parameters"]:
        if param["name"] == "roles" and roles:
            items_of(param["schema"])["enum"] = roles
    return spec


#: How the open deployment's refusals are declared on every operation (api/hosts.py).
MISDIRECTED = {
    "description": "No token is configured and the request's Host is neither a loopback name "
    "nor one of server.allowed_hosts (a DNS-rebinding page): nothing is done.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}
CROSS_ORIGIN = (
    " Also, while no token is configured: a state-changing request whose Origin is not this "
    "broker's own host."
)


def declare_hosts(spec: dict[str, Any]) -> dict[str, Any]:
    """Every operation may answer 421 (and every state-changing one 403) while no token is
    configured: declared on each."""
    for ops in spec["paths"].values():
        for method, op in ops.items():
            answers = op.setdefault("responses", {})
            answers.setdefault("421", MISDIRECTED)
            if method.upper() in SAFE_METHODS:
                continue
            forbidden = answers.setdefault(
                "403",
                {"description": "Refused.", "content": MISDIRECTED["content"]},
            )
            forbidden["description"] = forbidden.get("description", "") + CROSS_ORIGIN
    return spec


def declare_head(spec: dict[str, Any]) -> dict[str, Any]:
    """Every GET path answers HEAD as GET without the body (`BrokerApp`): declared so, each
    answer's headers without its content."""
    for ops in spec["paths"].values():
        get = ops.get("get")
        if get is None or "head" in ops:
            continue
        head: dict[str, Any] = {
            key: get[key] for key in ("tags", "summary", "parameters") if key in get
        }
        head["description"] = "As GET, without the body."
        if "operationId" in get:
            head["operationId"] = f"{get['operationId']}_head"
        head["responses"] = {
            code: {k: v for k, v in answer.items() if k != "content"}
            for code, answer in get["responses"].items()
        }
        ops["head"] = head
    return spec
