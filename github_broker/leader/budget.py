"""The webhook worker's own share of the GitHub quota: a token bucket that may go into debt.

A delivery's GitHub cost is only known once it is applied (an issue read when two changes
share a second, a pull request read and its review upkeep for PR feedback), so the worker
spends what a delivery actually made (`gateway.counting_calls`) after applying it, and takes
no delivery while the bucket is below one call. The overshoot is bounded by one delivery's
calls; a burst of deliveries waits in the queue, and polling covers the changes meanwhile.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class GitHubBudget:
    """`per_hour` GitHub calls an hour for the webhook worker, at most `burst` saved up."""

    def __init__(
        self, per_hour: int, burst: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = per_hour / 3600
        self.burst = float(max(1, burst))
        self._clock = clock
        self._lock = threading.Lock()
        self._calls = self.burst
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._calls = min(self.burst, self._calls + (now - self._at) * self.rate_per_s)
        self._at = now

    def wait_s(self) -> float:
        """Seconds until the next delivery may be applied (0: now); inf with no budget."""
        with self._lock:
            self._refill()
            if self._calls >= 1:
                return 0.0
            if self.rate_per_s <= 0:
                return float("inf")
            return (1 - self._calls) / self.rate_per_s

    def spend(self, calls: int) -> None:
        """Charge the calls a delivery made (the balance may go below zero)."""
        if calls <= 0:
            return
        with self._lock:
            self._refill()
            self._calls -= calls

    @property
    def available(self) -> float:
        with self._lock:
            self._refill()
            return self._calls
