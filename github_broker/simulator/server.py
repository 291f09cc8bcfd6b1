"""HTTP transport (stdlib ThreadingHTTPServer) and the Simulator lifecycle object."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, cast

from .faults import Faults
from .gateway import Gateway, Services
from .oauth import DeviceFlow
from .ratelimit import RateLimiter
from .seed import apply_seed, load_seed
from .state import SimState
from .stats import Stats
from .webhooks import WebhookDispatcher

logger = logging.getLogger(__name__)

SeedSource = Mapping[str, Any] | str | os.PathLike[str]


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Tests restart simulators on fixed ports in quick succession.
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops SYNs under parallel load (1 s client retry).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], gateway: Gateway, default_base: str) -> None:
        super().__init__(address, _Handler)
        self.gateway = gateway
        self.default_base = default_base

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that time out and hang up are expected under fault injection.
        logger.debug("connection from %s ended abruptly", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, so paging thousands of issues stays cheap
    # Headers and body go out in separate writes; without this Nagle stalls each answer ~40 ms.
    disable_nagle_algorithm = True
    server_version = "GitHubSimulator/1.0"
    sys_version = ""

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - " + format, self.address_string(), *args)

    def _serve(self) -> None:
        server = cast(_HTTPServer, self.server)
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length > 0 else b""
        # Header names are case-insensitive; the gateway sees them lower-cased.
        headers = {name.lower(): value for name, value in self.headers.items()}
        host = headers.get("host")
        # URLs in answers follow the host the client dialled, or PyGithub refuses to follow them.
        base_url = f"http://{host}" if host else server.default_base
        response = server.gateway.process(self.command, self.path, headers, raw_body, base_url)
        body = b"" if response.status in (204, 304) else response.encode()
        try:
            self.send_response(response.status)
            if response.status != 304:
                self.send_header("Content-Type", "application/json; charset=utf-8")
            for name, value in response.headers.items():
                self.send_header(name, value)
            if response.status != 304:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            logger.debug("client went away before %s %s was answered", self.command, self.path)
            self.close_connection = True


class Simulator:
    """A local GitHub REST API; point PyGithub at ``base_url`` and it works unmodified."""

    def __init__(
        self,
        seed: SeedSource | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tokens: dict[str, str] | None = None,
        rate_limit: int = 5000,
        apps: dict[int, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.state = SimState()
        self.faults = Faults()
        self.stats = Stats()
        self.rate_limiter = RateLimiter(rate_limit)
        self.tokens = None if tokens is None else dict(tokens)
        self.services = Services(
            self.state, self.faults, self.stats, self.rate_limiter, self.tokens, apps
        )
        self.webhooks = WebhookDispatcher()
        self.services.webhooks = self.webhooks
        self.device = self.services.device = DeviceFlow(self.tokens)
        self._gateway = Gateway(self.services)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        if seed is not None:
            data = seed if isinstance(seed, Mapping) else load_seed(seed)
            apply_seed(self.state, data)

    @property
    def base_url(self) -> str:
        if self.port == 0:
            raise RuntimeError("Simulator was asked for a free port; start() it first")
        return f"http://{_client_host(self.host)}:{self.port}"

    @property
    def running(self) -> bool:
        return self._httpd is not None

    def start(self) -> None:
        if self._httpd is not None:
            return
        httpd = _HTTPServer((self.host, self.port), self._gateway, "")
        self.port = httpd.server_address[1]
        self._httpd = httpd
        httpd.default_base = self.base_url
        self.state.base_url = self.base_url
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"github-simulator-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("GitHub simulator serving at %s", self.base_url)

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self.faults.release()  # wake requests hanging in a timeout fault
        self.webhooks.close()
        if self.state.ci is not None:
            self.state.ci.close()  # its runs still waiting to complete
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        logger.info("GitHub simulator on port %s stopped", self.port)

    def __enter__(self) -> Simulator:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _client_host(host: str) -> str:
    # A wildcard bind is reachable on loopback; clients cannot dial 0.0.0.0 portably.
    return "127.0.0.1" if host in ("", "0.0.0.0") else host
