"""A TCP proxy between one broker process and the test's redis-server that can stall the
broker's way to Redis on cue: the pause of a process (or of its network) between two of its
Redis calls, forced rather than hoped for.

Armed for an agent id, it lets everything through until the broker sends a script call
(EVALSHA/EVAL/FCALL) carrying that id among its arguments: from that call on, every byte the
broker sends on any connection is held, in order, as a stalled network would hold it, until the
test calls `release`. Then the held bytes reach Redis in the order they were sent, also those of
connections the broker has closed meanwhile (they were on their way), and Redis's reply to the
held call is kept (`held_reply`). Replies always flow back at once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

#: Bytes read from a socket at a time.
CHUNK = 65536


class RespError(bytes):
    """An error reply of Redis (its text, without the leading '-')."""


class Incomplete(Exception):
    """The buffer ends inside a RESP value: wait for more bytes."""


def _line(buf: bytes | bytearray, pos: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    return bytes(buf[pos:end]), end + 2


#: RESP types whose body is one line (RESP2, and RESP3's null, double, boolean, big number).
_SCALARS = {ord("+"): bytes, ord(":"): int, ord("_"): bytes, ord(","): bytes, ord("#"): bytes}
#: RESP types with a length, then that many bytes (bulk string, bulk error, verbatim string).
_BULKS = {ord("$"), ord("!"), ord("=")}
#: RESP types with a count, then that many values (array, set, push; a map counts pairs).
_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}


def parse(buf: bytes | bytearray, pos: int = 0) -> tuple[object, int]:
    """One RESP value of `buf` from `pos`, and where the next one starts; Incomplete when the
    buffer ends inside it, ValueError when it is not RESP."""
    if pos >= len(buf):
        raise Incomplete
    kind = buf[pos]
    head, pos = _line(buf, pos + 1)
    if kind == ord("-"):
        return RespError(head), pos
    if kind in _SCALARS:
        return _SCALARS[kind](head), pos
    size = int(head)
    if kind in _BULKS:
        if size < 0:
            return None, pos
        if len(buf) < pos + size + 2:
            raise Incomplete
        body = bytes(buf[pos : pos + size])
        return (RespError(body) if kind == ord("!") else body), pos + size + 2
    if kind in _AGGREGATES:
        items: list[object] = []
        for _ in range(max(size, 0) * _AGGREGATES[kind]):
            item, pos = parse(buf, pos)
            items.append(item)
        return (None if size < 0 else items), pos
    raise ValueError(f"not RESP: {bytes(buf[pos - 1 : pos + 20])!r}")


def carries(command: object, agent: str) -> bool:
    """Whether `command` (a parsed request) is a script call with `agent` among its args."""
    if not isinstance(command, list) or not command or not isinstance(command[0], bytes):
        return False
    name = command[0].upper()
    return name in {b"EVALSHA", b"EVAL", b"FCALL"} and agent.encode() in command[1:]


@dataclass(eq=False)
class _Link:
    """One connection of the broker, and the proxy's own to Redis."""

    client: socket.socket
    upstream: socket.socket
    #: Commands sent (or held) so far, and replies read so far.
    sent: int = 0
    replies: int = 0
    #: Which of this connection's commands is the held script call (None: none).
    held_at: int | None = None
    pending: bytearray = field(default_factory=bytearray)
    answers: bytearray = field(default_factory=bytearray)
    #: Replies stopped being counted (a value this parser does not know).
    lost_count: bool = False


class RedisProxy:
    """Listens on a free loopback port (`port`) and forwards to Redis on `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._armed: str | None = None
        self._one_connection = False
        self._held_link: _Link | None = None
        #: (connection, bytes) held in the order they came; None while nothing is held.
        self._held: list[tuple[_Link, bytes]] | None = None
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        #: Set when Redis has answered the held call; its reply is `held_reply`.
        self.answered = threading.Event()
        self.held_reply: object = None
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def arm(self, agent: str, *, one_connection: bool = False) -> None:
        """Hold everything from the next script call carrying `agent` on (`one_connection`:
        only what follows it on its own connection, as a connection that stalled while the
        broker's new ones get through)."""
        with self._lock:
            self._armed = agent
            self._one_connection = one_connection

    def holding(self) -> bool:
        with self._lock:
            return self._held is not None

    def release(self) -> None:
        """Send what was held to Redis, in order, and let everything through again."""
        with self._lock:
            for link, data in self._held or []:
                with contextlib.suppress(OSError):
                    link.upstream.sendall(data)
            self._held = None

    def close(self) -> None:
        with self._lock:
            self._closing = True
            links = list(self._links)
        self._listener.close()
        for link in links:
            for sock in (link.client, link.upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> RedisProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()  # Redis is down: so is the way to it
                continue
            link = _Link(client, upstream)
            with self._lock:
                if self._closing:
                    client.close()
                    upstream.close()
                    return
                self._links.append(link)
            self._spawn(self._to_redis, link)
            self._spawn(self._to_client, link)

    def _to_redis(self, link: _Link) -> None:
        """The broker's commands, one by one: through, or held."""
        while True:
            try:
                data = link.client.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                # The broker closed it. Keep the way to Redis open: what is held for it is
                # still on its way, and its replies are read (`close` ends it).
                return
            link.pending += data
            for command, raw in self._commands(link):
                self._forward(link, command, raw)

    @staticmethod
    def _commands(link: _Link) -> list[tuple[object, bytes]]:
        out = []
        while link.pending:
            try:
                command, end = parse(link.pending)
            except Incomplete:
                break
            except ValueError:  # not RESP (an inline command): through as it is
                command, end = None, len(link.pending)
            out.append((command, bytes(link.pending[:end])))
            del link.pending[:end]
        return out

    def _forward(self, link: _Link, command: object, raw: bytes) -> None:
        with self._lock:
            if self._held is None and self._armed is not None and carries(command, self._armed):
                self._armed, self._held, link.held_at = None, [], link.sent
                self._held_link = link
            link.sent += 1
            if self._held is not None and (not self._one_connection or link is self._held_link):
                self._held.append((link, raw))
                return
            with contextlib.suppress(OSError):
                link.upstream.sendall(raw)

    def _to_client(self, link: _Link) -> None:
        """Redis's replies, back at once; the reply to the held call is kept."""
        while True:
            try:
                data = link.upstream.recv(CHUNK)
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(OSError):
                    link.client.close()
                return
            with contextlib.suppress(OSError):
                link.client.sendall(data)  # the broker may have gone: its replies are dropped
            self._count_replies(link, data)

    def _count_replies(self, link: _Link, data: bytes) -> None:
        if link.lost_count:
            return
        link.answers += data
        while link.answers:
            try:
                reply, end = parse(link.answers)
            except Incomplete:
                return
            except ValueError:
                link.lost_count = True
                return
            del link.answers[:end]
            if link.replies == link.held_at:
                self.held_reply = reply
                self.answered.set()
            link.replies += 1
