"""One API worker process: uvicorn serving the broker's ASGI app on its own socket."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSpec:
    """What each API worker runs: an ASGI app factory under uvicorn."""

    app: str
    host: str
    port: int
    workers: int = 1
    log_config: dict[str, Any] | None = None
    log_level: str = "info"
    access_log: bool = False
    #: Seconds uvicorn gives open requests after SIGTERM before closing them.
    graceful_s: int = 5
    env: dict[str, str] = field(default_factory=dict)
    #: server.max_connections and server.header_timeout_s (see connections.py).
    max_connections: int = 4096
    header_timeout_s: float = 10.0


def bind(host: str, port: int, *, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def run_api_worker(spec: ServeSpec, sock: socket.socket | None = None) -> None:
    """One uvicorn server for `spec.app` on `sock` (or its own SO_REUSEPORT socket)."""
    import uvicorn

    from github_broker.processes.connections import (
        ConnectionGuard,
        connection_limits,
        raise_file_limit,
    )
    from github_broker.processes.protocol import guarded

    os.environ.update(spec.env)
    _, files = raise_file_limit()
    held, batch = connection_limits(spec.max_connections, files)
    config = uvicorn.Config(
        spec.app,
        factory=True,
        http=guarded(ConnectionGuard(held, spec.header_timeout_s)),
        # Also how many connections asyncio accepts in one go (see connection_limits).
        backlog=batch,
        # X-Forwarded-* only from server.trusted_proxies (create_app), not from any loopback
        # client as uvicorn's default would.
        proxy_headers=False,
        log_config=spec.log_config,
        log_level=spec.log_level,
        access_log=spec.access_log,
        timeout_graceful_shutdown=spec.graceful_s,
    )
    logger.info(
        "API worker %d: at most %d connections (file limit %d), request headers within %gs",
        os.getpid(),
        held,
        files,
        spec.header_timeout_s,
    )
    server = uvicorn.Server(config)
    if sock is None:
        sock = bind(spec.host, spec.port, reuse_port=True)
    server.run(sockets=[sock])
