"""Jinja2 templates shipped in the package, and the filters they use."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup

from github_broker.clock import age, iso_from_ms, ms_from_iso
from github_broker.models import shown


def clock(ms: int | None) -> str:
    return "-" if ms is None else iso_from_ms(ms).replace("T", " ").replace("Z", " UTC")


def age_of(iso: str | None, now_ms: int) -> str:
    """How long ago an ISO 8601 time (as /status writes them) was."""
    return age(ms_from_iso(iso), now_ms) if iso else "never"


def escaped(value: Any) -> Any:
    """Every value a page prints: text with control and bidirectional characters written as
    escapes (`\\u001b`), whatever its source (an old audit entry, an issue title, an agent's
    note); markup the templates made themselves passes as it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value


_env = Environment(
    loader=PackageLoader("github_broker.ui", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
    finalize=escaped,
)
_env.globals.update(age=age, age_of=age_of, clock=clock)


def render(name: str, **context: Any) -> str:
    return _env.get_template(name).render(**context)
