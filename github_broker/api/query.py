"""Query strings: a parameter a route does not take is refused with a 422 naming the ones it
does (`/explain?agent=a1` would otherwise explain for a fresh agent without a word)."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from typing import Any

from fastapi import Request

from github_broker.errors import InvalidRequest, Problem


def unknown_parameters_response(route: str, known: Collection[str]) -> dict[int | str, Any]:
    """The OpenAPI entry of the 422 `refuse_unknown` answers on `route`."""
    names = ", ".join(sorted(known))
    return {
        422: {
            "model": Problem,
            "description": f"A malformed value, or a query parameter {route} does not take "
            f"(it takes {names}; e.g. `agent` is refused, naming `agent_id`).",
        }
    }


def refuse_unknown(request: Request, known: Collection[str]) -> None:
    """422 (InvalidRequest) for the first query parameter not in `known`, naming the likely
    one meant and every one the route takes."""
    for name in request.query_params:
        if name in known:
            continue
        guess = difflib.get_close_matches(name, list(known), n=1, cutoff=0.5)
        meant = f"; did you mean {guess[0]!r}?" if guess else ""
        names = ", ".join(sorted(known))
        raise InvalidRequest(
            f"unknown query parameter {name[:64]!r}{meant} ({request.url.path} takes {names})"
        )
