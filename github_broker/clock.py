"""The one source of time, so tests can control it."""

import time
from datetime import datetime


def now_ms() -> int:
    """Milliseconds since the epoch (wall clock)."""
    return time.time_ns() // 1_000_000


def now_s() -> float:
    return time.time()


def iso_from_ms(ms: int) -> str:
    """ISO 8601 UTC with a `Z` suffix, second precision, as GitHub writes times."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms // 1000))


def ms_from_iso(text: str) -> int:
    """Parse GitHub's ISO 8601 (`2026-01-01T00:00:00Z`) into epoch milliseconds."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def age(ms: int | None, now: int) -> str:
    """How long ago (or, for a future time, in how long), in the largest two units."""
    if ms is None:
        return "never"
    delta_s = (now - ms) // 1000
    text = span(abs(delta_s))
    return f"in {text}" if delta_s < 0 else f"{text} ago"


def span(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600:02d}h"
