"""Write pacing: a token bucket that keeps content-creating GitHub calls under the
secondary rate limit (about 80 a minute) while letting a short burst through at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: Tokens short of one that still count as one: a float refill after sleeping exactly the
#: computed wait can land a hair below it.
EPSILON = 1e-6


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
            return max(0.0, (1 - EPSILON - self._tokens) / self.rate_per_s)

    def take(self, sleep: Callable[[float], None] = time.sleep) -> float:
        """Take a token, sleeping until one is free; returns the seconds slept."""
        if self.rate_per_s <= 0:
            return 0.0
        slept = 0.0
        while True:
            with self._lock:
                self._refill()
                if self._tokens >= 1 - EPSILON:
                    self._tokens -= 1
                    return slept
                wait = (1 - self._tokens) / self.rate_per_s
            sleep(wait)
            slept += wait

    def pause_until(self, monotonic_s: float) -> None:
        """No token before `monotonic_s`, and then one (GitHub asked us to back off)."""
        with self._lock:
            self._refill()
            self._tokens = min(self._tokens, 1 - (monotonic_s - self._clock()) * self.rate_per_s)


class WritePacer:
    """Several budgets at once (GitHub's: about 80 writes a minute and 500 an hour); a write
    waits for a token from each."""

    def __init__(self, *buckets: TokenBucket) -> None:
        self.buckets = [b for b in buckets if b.rate_per_s > 0]

    def wait_s(self) -> float:
        return max((b.wait_s() for b in self.buckets), default=0.0)

    def take(self, sleep: Callable[[float], None] = time.sleep) -> float:
        return sum(b.take(sleep) for b in self.buckets)

    def pause_until(self, monotonic_s: float) -> None:
        # The short-term bucket waits; the hourly budget keeps what it saved.
        if self.buckets:
            self.buckets[0].pause_until(monotonic_s)
