"""The servers the sandbox runs in its own process: the broker's API under uvicorn, and its
in-process store served on a loopback port for `status` and `explain` in another terminal."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from github_broker.errors import BrokerError
from github_broker.settings import DEFAULTS_DIR, Settings

#: Seconds the API may take to come up (first sync included in the lifespan).
START_TIMEOUT_S = 20.0


class SandboxError(BrokerError):
    """The sandbox cannot start: port taken, API not up."""


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # As uvicorn binds: a port whose last server left it in TIME-WAIT is free to reuse.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class ApiServer:
    """The broker's API (and poller) under uvicorn in a thread, so the main thread keeps signals."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        import uvicorn

        from github_broker.api.app import create_app

        config = uvicorn.Config(
            create_app(settings, config_dir=DEFAULTS_DIR),
            host=host,
            port=port,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            proxy_headers=False,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="sandbox-api", daemon=True)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SandboxError("the broker API did not start; its log lines above say why")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.ident is not None:  # never started when start-up failed before it
            self.thread.join(timeout=15)


def _replying_errors() -> type[Any]:
    """fakeredis's TCP handler, except that an error reply (NOSCRIPT, a script's error) is sent
    and the connection kept: its own closes the connection after any error, and the store's
    pipelined client answers NOSCRIPT by loading the script on that same connection."""
    import redis
    from fakeredis._clients._tcp_server import TCPFakeRequestHandler  # no public name

    class Handler(TCPFakeRequestHandler):
        def setup(self) -> None:
            super().setup()
            read = self.current_client.read_response

            def read_response(*args: Any, **kwargs: Any) -> Any:
                try:
                    return read(*args, **kwargs)
                except redis.exceptions.ResponseError as e:
                    return e  # written as an error reply, like Redis does

            self.current_client.read_response = read_response  # type: ignore[method-assign]

    return Handler


class SharedStore:
    """The sandbox's in-process store (memory://) served on a loopback port, so that
    `github-broker status` and `explain` in another terminal read the same data."""

    def __init__(self) -> None:
        from fakeredis import TcpFakeServer

        from github_broker.store.connection import memory_server

        self.server = TcpFakeServer(("127.0.0.1", 0))
        self.server.fake_server = memory_server()
        self.server.RequestHandlerClass = _replying_errors()
        self.server.daemon_threads = True  # a reader left connected must not hold the exit
        self.url = f"redis://127.0.0.1:{self.server.server_address[1]}/0"
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(0.2,), name="sandbox-redis", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        if self.thread.ident is not None:
            self.server.shutdown()
        self.server.server_close()
