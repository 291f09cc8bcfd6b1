"""Runtime-switchable failure injection: latency, 5xx, hangs and primary/secondary rate limits."""

from __future__ import annotations

import itertools
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

LATENCY = "latency"
ERROR = "error"
TIMEOUT = "timeout"
PRIMARY_RATE_LIMIT = "primary_rate_limit"
SECONDARY_RATE_LIMIT = "secondary_rate_limit"
KINDS = (LATENCY, ERROR, TIMEOUT, PRIMARY_RATE_LIMIT, SECONDARY_RATE_LIMIT)
# Kinds that replace the real answer; latency and timeout only delay it.
ANSWERING_KINDS = (ERROR, PRIMARY_RATE_LIMIT, SECONDARY_RATE_LIMIT)


@dataclass
class FaultRule:
    """One injected fault; ``count`` is how many more matching requests it hits (None = all)."""

    kind: str
    id: int
    method: str | None = None
    path: str | None = None
    count: int | None = None
    probability: float | None = None
    status: int = 502
    latency_ms: float = 0.0
    seconds: float = 0.0
    retry_after: int = 60
    reset_at: float | None = None
    message: str | None = None
    _path_re: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {KINDS}")
        if self.path is not None:
            self._path_re = re.compile(self.path)
        if self.method is not None:
            self.method = self.method.upper()

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method != method:
            return False
        return self._path_re is None or self._path_re.search(path) is not None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "id": self.id,
            "type": self.kind,
            "method": self.method,
            "path": self.path,
            "count": self.count,
            "probability": self.probability,
        }
        extras: dict[str, dict[str, Any]] = {
            LATENCY: {"latency_ms": self.latency_ms},
            ERROR: {"status": self.status, "message": self.message},
            TIMEOUT: {"seconds": self.seconds},
            PRIMARY_RATE_LIMIT: {"reset_at": self.reset_at},
            SECONDARY_RATE_LIMIT: {"retry_after": self.retry_after},
        }
        return {**data, **extras[self.kind]}


@dataclass
class FaultDecision:
    """What the gateway must do for one request: wait ``delay`` seconds, then maybe ``rule``."""

    delay: float = 0.0
    rule: FaultRule | None = None


class Faults:
    """Mutable, thread-safe fault set consulted before every counted API request."""

    def __init__(
        self, *, rng: random.Random | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)
        self._rng = rng or random.Random()
        self._clock = clock
        # Sleeping requests wait on this so clear()/release() can cut a hang short.
        self._wake = threading.Condition()
        self._generation = 0

    # ----- adding faults ---------------------------------------------------------------------

    def _add(self, kind: str, **fields: Any) -> FaultRule:
        with self._wake:
            rule = FaultRule(kind, next(self._ids), **fields)
            self._rules.append(rule)
        logger.info("fault added: %s", rule.to_dict())
        return rule

    def add_latency(
        self,
        ms: float,
        *,
        method: str | None = None,
        path: str | None = None,
        count: int | None = None,
        probability: float | None = None,
    ) -> FaultRule:
        return self._add(
            LATENCY, latency_ms=ms, method=method, path=path, count=count, probability=probability
        )

    def add_error(
        self,
        status: int = 502,
        *,
        count: int | None = None,
        probability: float | None = None,
        method: str | None = None,
        path: str | None = None,
        message: str | None = None,
    ) -> FaultRule:
        """Answer ``status`` for the next ``count`` matches, with ``probability``, or always."""
        return self._add(
            ERROR,
            status=status,
            count=count,
            probability=probability,
            method=method,
            path=path,
            message=message,
        )

    def add_timeout(
        self,
        seconds: float,
        *,
        count: int | None = None,
        probability: float | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> FaultRule:
        """Hang ``seconds`` before answering normally, so client-side timeouts fire."""
        return self._add(
            TIMEOUT, seconds=seconds, count=count, probability=probability, method=method, path=path
        )

    def add_primary_rate_limit(
        self,
        *,
        reset_in: float = 60.0,
        reset_at: float | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> FaultRule:
        """Quota looks exhausted until ``reset_at`` (epoch seconds); the rule then expires."""
        reset = reset_at if reset_at is not None else self._clock() + reset_in
        return self._add(PRIMARY_RATE_LIMIT, reset_at=float(int(reset)), method=method, path=path)

    def add_secondary_rate_limit(
        self,
        *,
        count: int | None = 1,
        retry_after: int = 60,
        probability: float | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> FaultRule:
        return self._add(
            SECONDARY_RATE_LIMIT,
            count=count,
            retry_after=retry_after,
            probability=probability,
            method=method,
            path=path,
        )

    def add(self, spec: Mapping[str, Any]) -> FaultRule:
        """Add a fault from its JSON form, e.g. ``{"type": "error", "status": 503, "count": 2}``."""
        kind = spec.get("type") or spec.get("kind")
        scope: dict[str, Any] = {"method": spec.get("method"), "path": spec.get("path")}
        count = spec.get("count")
        probability = spec.get("probability")
        match kind:
            case "latency":
                ms = float(spec.get("latency_ms", spec.get("ms", 0)))
                return self.add_latency(ms, count=count, probability=probability, **scope)
            case "error":
                return self.add_error(
                    int(spec.get("status", 502)),
                    count=count,
                    probability=probability,
                    message=spec.get("message"),
                    **scope,
                )
            case "timeout":
                seconds = float(spec.get("seconds", 30))
                return self.add_timeout(seconds, count=count, probability=probability, **scope)
            case "primary_rate_limit":
                return self.add_primary_rate_limit(
                    reset_in=float(spec.get("reset_in", 60)), reset_at=spec.get("reset_at"), **scope
                )
            case "secondary_rate_limit":
                return self.add_secondary_rate_limit(
                    count=spec.get("count", 1),
                    retry_after=int(spec.get("retry_after", 60)),
                    probability=probability,
                    **scope,
                )
        raise ValueError(f"unknown fault type {kind!r}; expected one of {KINDS}")

    # ----- removing and inspecting -----------------------------------------------------------

    def remove(self, rule_id: int) -> bool:
        with self._wake:
            before = len(self._rules)
            self._rules = [rule for rule in self._rules if rule.id != rule_id]
            return len(self._rules) != before

    def clear(self) -> None:
        """Drop every fault and wake requests that are still hanging."""
        with self._wake:
            self._rules.clear()
        self.release()

    def release(self) -> None:
        with self._wake:
            self._generation += 1
            self._wake.notify_all()

    def rules(self) -> list[dict[str, Any]]:
        with self._wake:
            self._expire()
            return [rule.to_dict() for rule in self._rules]

    def __bool__(self) -> bool:
        with self._wake:
            self._expire()
            return bool(self._rules)

    # ----- used by the gateway ---------------------------------------------------------------

    def evaluate(self, method: str, path: str) -> FaultDecision:
        decision = FaultDecision()
        with self._wake:
            self._expire()
            for rule in list(self._rules):
                if not rule.matches(method, path):
                    continue
                if rule.kind in ANSWERING_KINDS and decision.rule is not None:
                    continue
                if rule.probability is not None and self._rng.random() >= rule.probability:
                    continue
                if rule.kind == LATENCY:
                    decision.delay += rule.latency_ms / 1000.0
                elif rule.kind == TIMEOUT:
                    decision.delay += rule.seconds
                else:
                    decision.rule = rule
                self._consume(rule)
        return decision

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` unless clear()/release() happens first."""
        deadline = time.monotonic() + seconds
        with self._wake:
            generation = self._generation
            while self._generation == generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._wake.wait(remaining)

    def _consume(self, rule: FaultRule) -> None:
        if rule.count is None:
            return
        rule.count -= 1
        if rule.count <= 0:
            self._rules.remove(rule)

    def _expire(self) -> None:
        now = self._clock()
        self._rules = [
            rule
            for rule in self._rules
            if rule.kind != PRIMARY_RATE_LIMIT or rule.reset_at is None or now < rule.reset_at
        ]
