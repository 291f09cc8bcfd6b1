"""The MCP server's streamable HTTP endpoint: the loopback rule, its bearer token, its hosts."""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from dataclasses import dataclass

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

#: Addresses only this machine can reach: the endpoint may serve them without a token.
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: Bind addresses that mean "every interface".
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})
#: Shortest bearer token accepted: a short one is guessed long before a person notices.
MIN_TOKEN_CHARS = 16
#: Path of the MCP endpoint.
MCP_PATH = "/mcp"


class EndpointRefused(Exception):
    """The HTTP endpoint may not start as configured (the message says why and the fix)."""


@dataclass(frozen=True)
class HttpEndpoint:
    """Where and how the MCP endpoint listens. `token`: the bearer token every request must
    carry (required beyond loopback); `allowed_hosts`: more Host header names to accept."""

    host: str
    port: int
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()

    def check(self) -> None:
        """Refuse what `serve` refuses: an endpoint beyond loopback that anyone may call."""
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise EndpointRefused(
                f"the MCP HTTP token is {len(self.token)} characters long; use at least "
                f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)"
            )
        if self.host not in LOOPBACK_HOSTS and self.token is None:
            raise EndpointRefused(
                f"refusing to serve MCP over HTTP on {self.host!r} without a bearer token: anyone "
                "who reaches the port could take tasks as this agent. Set GITHUB_BROKER_MCP_TOKEN "
                "or --mcp-token-file (clients then send `Authorization: Bearer <token>`), or bind "
                "to 127.0.0.1"
            )

    def security(self) -> TransportSecuritySettings:
        """The SDK's Host/Origin check (against DNS rebinding), on for every bind address."""
        names = {"127.0.0.1", "localhost", "[::1]"}
        if self.host not in WILDCARD_HOSTS:
            names.add(_bracketed(self.host))
        else:
            names |= _own_names()
        names |= {_bracketed(name) for name in self.allowed_hosts}
        hosts = sorted({*names, *(f"{name}:*" for name in names)})
        origins = sorted(f"{scheme}://{host}" for scheme in ("http", "https") for host in hosts)
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        )

    def app(self, mcp: MCPServer) -> ASGIApp:
        app: ASGIApp = mcp.streamable_http_app(
            streamable_http_path=MCP_PATH, transport_security=self.security(), host=self.host
        )
        return app if self.token is None else BearerGate(app, self.token)

    async def serve(self, mcp: MCPServer) -> None:
        """Serve until a signal stops uvicorn; no access log (one line per call is noise)."""
        config = uvicorn.Config(
            self.app(mcp),
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        await uvicorn.Server(config).serve()


class BearerGate:
    """Answers 401 to any HTTP request without `Authorization: Bearer <token>`, before the
    MCP app reads its body or opens a session."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._authorised(scope):
            await self.app(scope, receive, send)
            return
        presented = any(name == b"authorization" for name, _ in scope.get("headers", ()))
        challenge = 'Bearer realm="github-broker mcp"'
        if presented:
            challenge += ', error="invalid_token"'
        body = json.dumps(
            {
                "error": "invalid_token" if presented else "unauthorized",
                "error_description": "this MCP endpoint requires Authorization: Bearer <token>"
                if not presented
                else "the bearer token is not this endpoint's",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _authorised(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # The scheme is case-insensitive (RFC 9110); the token is compared in
                # constant time.
                return scheme.lower() == b"bearer" and hmac.compare_digest(token, self._token)
        return False


def _bracketed(host: str) -> str:
    """An IPv6 address as a Host header carries it."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _own_names() -> set[str]:
    """This machine's name and addresses: what clients dial when the endpoint binds every
    interface (anything else goes in --allowed-host)."""
    names = {socket.gethostname()}
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        infos = []
    names |= {str(info[4][0]) for info in infos}
    return {_bracketed(name) for name in names if name}
