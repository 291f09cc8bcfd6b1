"""What every HTTP answer of the API and the dashboard shares: the error body (`Problem`) and
how routes declare it in the OpenAPI."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

#: What `Problem.reason` says, per status; the OpenAPI carries it as the field's description.
REASON_DOC = (
    "Why, for programs: 401 `unauthorized` (no or an unknown token, or a webhook signature "
    "that does not match), 403 `forbidden` (a token of another agent), 404 `not_found` (a "
    "repository, issue, path or organization the broker does not serve), 405 "
    "`method_not_allowed`, 409 the lease refusal (`expired`, `revoked`, `not_owner`, "
    "`issue_closed`, `label_removed`, ...) or `conflict`, 413 `too_large`, 422 "
    "`invalid_request`, 429 `too_many_attempts` (dashboard login), 500 `internal`, 503 "
    "`unavailable` (Redis or GitHub cannot be reached), `rebuilding` (Redis lost its data "
    "and the mirror is being rebuilt) or `rate_limited` (GitHub's rate limit)."
)


class Problem(BaseModel):
    """Every error answer: `detail` for people (never an internal address), `reason` for
    programs."""

    detail: str
    reason: str | None = Field(None, description=REASON_DOC)


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
