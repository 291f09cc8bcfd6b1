"""Request counters, so tests and benchmarks can assert how much GitHub traffic they cost."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import Any

logger = logging.getLogger(__name__)


class Stats:
    """Thread-safe counters of every API request served (control endpoints excluded).

    ``rate_limited_cost`` is the quota GitHub would have charged (304s and injected faults are
    free); ``rate_limited`` counts requests refused by a primary or secondary rate limit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._by_status: Counter[str] = Counter()
        self._by_route: Counter[str] = Counter()
        self._by_method: Counter[str] = Counter()
        self._cost = 0
        self._rate_limited = 0

    def record(
        self, method: str, route: str, status: int, *, cost: int = 0, rate_limited: bool = False
    ) -> None:
        with self._lock:
            self._total += 1
            self._by_status[str(status)] += 1
            self._by_route[route] += 1
            self._by_method[method] += 1
            self._cost += cost
            self._rate_limited += int(rate_limited)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "total": self._total,
                "by_status": dict(self._by_status),
                "by_route": dict(self._by_route),
                "by_method": dict(self._by_method),
                "rate_limited_cost": self._cost,
                "rate_limited": self._rate_limited,
            }

    def reset(self) -> None:
        with self._lock:
            self._total = 0
            self._by_status.clear()
            self._by_route.clear()
            self._by_method.clear()
            self._cost = 0
            self._rate_limited = 0
