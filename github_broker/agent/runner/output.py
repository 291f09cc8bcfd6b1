"""The command's output: passed on where it goes, its last line kept for the heartbeat's note."""

from __future__ import annotations

import os
import re
import threading
from typing import IO

#: Bytes of the latest output kept to find its last line in.
TAIL_BYTES = 8192
#: Seconds to wait for the output readers once the command's group is gone (a process that
#: left the group may still hold the pipe; its output is then dropped).
DRAIN_TIMEOUT_S = 2.0
#: Terminal control sequences (colours, cursor moves) and other control characters, which
#: mean nothing in a note.
CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b-\x1f\x7f]")


class OutputTap:
    """Pipes for the command's stdout and stderr, each read by a thread that writes what
    comes to `stdout`/`stderr` (a log file, or the runner's own file descriptors 1 and 2)
    and keeps the tail of both for `last_line()`."""

    def __init__(self, stdout: IO[bytes] | None = None, stderr: IO[bytes] | None = None) -> None:
        self._sinks = (stdout, stderr)
        self._lock = threading.Lock()
        self._tail = b""
        self._threads: list[threading.Thread] = []
        self._write_ends: list[int] = []
        self._read_ends: list[int] = []

    def open(self) -> tuple[int, int]:
        """The write ends to give the command as its stdout and stderr."""
        for _ in self._sinks:
            r, w = os.pipe()
            self._read_ends.append(r)
            self._write_ends.append(w)
        return self._write_ends[0], self._write_ends[1]

    def start(self) -> None:
        """Close our copies of the write ends (the command holds its own) and start reading."""
        for w in self._write_ends:
            os.close(w)
        self._write_ends = []
        for fd, sink, default in zip(self._read_ends, self._sinks, (1, 2), strict=True):
            thread = threading.Thread(
                target=self._pump, args=(fd, sink, default), name="output", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Wait for the readers to reach the end of the output (bounded)."""
        if not self._threads:  # the command never started
            for fd in self._write_ends + self._read_ends:
                os.close(fd)
            self._write_ends, self._read_ends = [], []
        for thread in self._threads:
            thread.join(timeout=DRAIN_TIMEOUT_S)

    def last_line(self) -> str | None:
        """The last line of the output with something in it, without control sequences."""
        with self._lock:
            tail = self._tail
        for line in reversed(re.split(rb"[\r\n]", tail)):
            text = CONTROL.sub("", line.decode("utf-8", "replace")).strip()
            if text:
                return text
        return None

    def _pump(self, fd: int, sink: IO[bytes] | None, default_fd: int) -> None:
        passing = True
        try:
            while chunk := os.read(fd, 65536):
                with self._lock:
                    self._tail = (self._tail + chunk)[-TAIL_BYTES:]
                    if not passing:
                        continue
                    try:
                        if sink is not None:
                            sink.write(chunk)
                            sink.flush()
                        else:
                            _write_all(default_fd, chunk)
                    except OSError:
                        # Where it went is gone: keep reading, or the command would block on
                        # a full pipe.
                        passing = False
        finally:
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
