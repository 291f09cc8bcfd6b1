"""Write pacing: a token bucket that keeps content-creating GitHub calls under the
secondary rate limit (about 80 a minute) while letting a short burst through at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """`rate_per_s` tokens a second, at most `burst` saved up; one token per write."""

    def __init__(
        self, rate_per_s: float, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(self.burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
        self._at = now

    def wait_s(self) -> float:
        """Seconds until a token is free (0: one is free now)."""
        if self.rate_per_s <= 0:
            return 0.0
        with self._lock:
            self._refill()
            return max(0.0, (1 - self._tokens) / self.rate_per_s)

    def take(self, sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a token, sleeping until one is free; returns the seconds slept."""
        if self.rate_per_s <= 0:
            return 0.0
        slept = 0.0
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1:
                    self._tokens -= 1
                    return slept
                wait = (1 - self._tokens) / self.rate_per_s
            sleep(wait)
            slept += wait

    def pause_until(self, monotonic_s: float) -> None:
        """Spend every token until `monotonic_s` (GitHub asked us to back off)."""
        with self._lock:
            self._refill()
            self._tokens = min(self._tokens, -(monotonic_s - self._clock()) * self.rate_per_s)
