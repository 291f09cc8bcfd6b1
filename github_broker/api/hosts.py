"""No way in for strangers while no token is configured (loopback only): a page of another
site must not reach the broker through the browser of someone on this machine.

- A request whose `Host` is not a loopback name (`localhost`, `127.0.0.1`, `[::1]`) nor one of
  `server.allowed_hosts` gets 421 Misdirected Request: a DNS-rebinding page's requests name
  its own domain.
- A state-changing request (anything but GET, HEAD, OPTIONS) that carries an `Origin` gets 403
  unless the origin is this very host: a cross-site form or fetch names its own.

Checked by `BrokerApp` before anything else, the hot path included: a header scan and a set
lookup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import Scope, Send

#: The names loopback is reached by, as a Host header carries them.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
#: Methods that change nothing (RFC 9110's safe methods): no Origin check.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def host_name(host: bytes) -> bytes:
    """A Host header's name without its port, lower-cased: `[::1]:8080` -> `[::1]`."""
    host = host.strip().lower()
    if host.startswith(b"["):
        return host[: host.find(b"]") + 1]
    return host.partition(b":")[0]


class HostGuard:
    """The open deployment's Host and Origin rules."""

    def __init__(self, allowed: Iterable[str]) -> None:
        names = [*LOOPBACK_HOSTS, *allowed]
        self.allowed = frozenset(host_name(_bracketed(n).encode()) for n in names)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, reason, detail) that refuses the request, or None."""
        host = origin = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
        if host is None or host_name(host) not in self.allowed:
            shown = host.decode("latin-1")[:100] if host is not None else "none"
            return (
                421,
                "misdirected",
                f"this broker answers only loopback host names and server.allowed_hosts while "
                f"no token is configured; this request names the host {shown!r}",
            )
        changes = scope.get("method") not in SAFE_METHODS
        if origin is not None and changes and _origin_host(origin) != host.strip().lower():
            return (
                403,
                "forbidden",
                "cross-origin request refused: its Origin is not this broker's own host",
            )
        return None

    async def refuse(self, refusal: tuple[int, str, str], send: Send) -> None:
        status, reason, detail = refusal
        body = json.dumps({"detail": detail, "reason": reason}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(body)).encode()),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _origin_host(origin: bytes) -> bytes | None:
    """The host (with port) an Origin names, lower-cased; None for `null` or no http(s)."""
    try:
        parts = urlsplit(origin.decode("latin-1").strip())
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return parts.netloc.lower().encode("latin-1")


def _bracketed(name: str) -> str:
    """An IPv6 address as a Host header carries it."""
    return f"[{name}]" if ":" in name and not name.startswith("[") else name
