"""Per-token primary rate limit (GitHub's hourly "core" quota) and its response headers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 3600


@dataclass(frozen=True)
class Quota:
    limit: int
    used: int
    reset: int

    @property
    def remaining(self) -> int:
        return max(self.limit - self.used, 0)

    def headers(self) -> dict[str, str]:
        return {
            "X-RateLimit-Limit": str(self.limit),
            "X-RateLimit-Remaining": str(self.remaining),
            "X-RateLimit-Reset": str(self.reset),
            "X-RateLimit-Used": str(self.used),
            "X-RateLimit-Resource": "core",
        }

    def as_json(self) -> dict[str, int]:
        return {
            "limit": self.limit,
            "remaining": self.remaining,
            "reset": self.reset,
            "used": self.used,
        }


class RateLimiter:
    """Quota windows per token: a window opens on first use and resets an hour later."""

    def __init__(
        self, limit: int, *, window: int = WINDOW_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int]] = {}  # key -> (reset epoch, used)

    def _current(self, key: str) -> tuple[int, int]:
        now = self._clock()
        reset, used = self._windows.get(key, (0, 0))
        if now >= reset:
            reset, used = int(now) + self.window, 0
            self._windows[key] = (reset, used)
        return reset, used

    def acquire(self, key: str) -> tuple[bool, Quota]:
        """Charge one unit; False (and nothing charged) when the window is used up."""
        with self._lock:
            reset, used = self._current(key)
            if used >= self.limit:
                return False, Quota(self.limit, used, reset)
            self._windows[key] = (reset, used + 1)
            return True, Quota(self.limit, used + 1, reset)

    def refund(self, key: str) -> Quota:
        """Give back one unit, used when a conditional request ends in 304 (free on GitHub)."""
        with self._lock:
            reset, used = self._current(key)
            used = max(used - 1, 0)
            self._windows[key] = (reset, used)
            return Quota(self.limit, used, reset)

    def peek(self, key: str) -> Quota:
        with self._lock:
            reset, used = self._current(key)
            return Quota(self.limit, used, reset)

    def exhaust(self, key: str) -> Quota:
        """Use up ``key``'s current window, for tests of quota handling."""
        with self._lock:
            reset, _ = self._current(key)
            self._windows[key] = (reset, self.limit)
            return Quota(self.limit, self.limit, reset)

    def reset(self) -> None:
        with self._lock:
            self._windows.clear()
