"""A configuration file re-read when it changes (the agent tokens file, the maintainers file):
a line removed there is refused from then on, with no restart."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import yaml

logger = logging.getLogger(__name__)

#: Seconds between two looks at a watched file for changes.
CHECK_S = 1.0

T = TypeVar("T")


class WatchedFile(Generic[T]):
    """`read()` of a file, again whenever its (mtime, size, inode) changed, looked at most once
    per CHECK_S. A file that no longer reads keeps the value read last (and says so)."""

    def __init__(self, path: Path | None, read: Callable[[], T], what: str) -> None:
        self.path = path
        self._read = read
        self.what = what
        self._checked_s = 0.0
        self._stamp = self._file_stamp()
        self.value: T = read()

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def current(self) -> T:
        if self.path is None:
            return self.value
        now = time.monotonic()
        if now - self._checked_s < CHECK_S:
            return self.value
        self._checked_s = now
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return self.value
        try:
            value = self._read()
        except (OSError, ValueError, AttributeError, yaml.YAMLError) as e:
            logger.warning(
                "%s %s unreadable, keeping what was read last: %s", self.what, self.path, e
            )
            return self.value
        self._stamp = stamp
        self.value = value
        logger.info("%s re-read from %s", self.what, self.path)
        return self.value
