"""Jinja2 templates shipped in the package, and the filters they use."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from github_broker.clock import age, iso_from_ms


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
