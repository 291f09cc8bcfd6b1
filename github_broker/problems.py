"""What every HTTP answer of the API and the dashboard shares: the error body (`Problem`) and
how routes declare it in the OpenAPI."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Problem(BaseModel):
    """Every error answer."""

    detail: str
    reason: str | None = None


#: A `Problem` answered as JSON, declared by hand: a `model` in `responses` would be declared
#: in the route's own media type (text/plain for /metrics, text/html for the dashboard).
PROBLEM_JSON: dict[str, Any] = {
    "application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}
}
#: Declared on every route: `BodyLimit` caps the body of every request, whatever its method,
#: and answers JSON.
BODY_LIMIT_RESPONSE: dict[int | str, dict[str, Any]] = {
    413: {"description": "The body is larger than server.max_body_bytes.", "content": PROBLEM_JSON}
}
