"""Jinja2 templates shipped in the package, and the filters they use."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from github_broker.clock import iso_from_ms


def age(ms: int | None, now_ms: int) -> str:
    """How long ago (or, for a future time, in how long), in the largest two units."""
    if ms is None:
        return "never"
    delta_s = (now_ms - ms) // 1000
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


def clock(ms: int | None) -> str:
    return "-" if ms is None else iso_from_ms(ms).replace("T", " ").replace("Z", " UTC")


_env = Environment(
    loader=PackageLoader("github_broker.ui", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals.update(age=age, clock=clock)


def render(name: str, **context: Any) -> str:
    return _env.get_template(name).render(**context)
