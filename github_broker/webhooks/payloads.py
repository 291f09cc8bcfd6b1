"""Webhook deliveries as the receiver accepts them: the events the broker reads and the
fields its worker needs, checked before anything is queued."""

from __future__ import annotations

import re
from typing import Any

from github_broker.errors import InvalidRequest

#: Events the broker reads; any other event is answered "ignored".
EVENTS = frozenset(
    {
        "issues",
        "issue_comment",
        "pull_request",
        "pull_request_review",
        "pull_request_review_comment",
        "push",
        # Done means green (leader/checks.py): the tracked PRs' CI.
        "check_run",
        "check_suite",
        "status",
        "workflow_run",
        # GitHub's dependencies and sub-issues (leader/graph.py).
        "issue_dependencies",
        "sub_issues",
    }
)
#: Check events: the object each carries, with the fields the worker reads.
_CHECK_OBJECTS = {
    "check_run": ("check_run", ("head_sha", "name")),
    "check_suite": ("check_suite", ("head_sha",)),
    "workflow_run": ("workflow_run", ("head_sha",)),
    "status": (None, ("sha", "context", "state")),
}
#: The issues each relationship delivery names (both are mirrored).
LINKED = {
    "issue_dependencies": ("blocked_issue", "blocking_issue"),
    "sub_issues": ("parent_issue", "sub_issue"),
}


#: GitHub's timestamps: `2026-11-23T10:00:00Z` (compared as strings by the mirror).
_ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


def check_shape(event: str, payload: dict[str, Any]) -> None:
    """The fields the worker reads, checked before anything is queued."""
    if event in _CHECK_OBJECTS:
        key, fields = _CHECK_OBJECTS[event]
        item = payload.get(key) if key else payload
        if not isinstance(item, dict) or not all(isinstance(item.get(f), str) for f in fields):
            where = f"`{key}`" if key else "the payload"
            raise InvalidRequest(f"{event} delivery without {', '.join(fields)} in {where}")
        return
    if event == "push":
        if not isinstance(payload.get("ref"), str) or not isinstance(payload.get("after"), str):
            raise InvalidRequest("push delivery without `ref` and `after`")
        return
    if event in LINKED:
        for key in LINKED[event]:
            _issue_shape(event, key, payload.get(key))
        return
    if not event.startswith("pull_request"):
        _issue_shape(event, "issue", payload.get("issue"))
        return
    _number(event, "pull_request", payload.get("pull_request"))


def _number(event: str, key: str, item: Any) -> None:
    number = item.get("number") if isinstance(item, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number < 2**53:
        raise InvalidRequest(f"{event} delivery without a valid `{key}.number`")


def _issue_shape(event: str, key: str, item: Any) -> None:
    """An issue object of a delivery: its number, `updated_at` and labels as the worker reads
    them."""
    _number(event, key, item)
    assert isinstance(item, dict)
    updated = item.get("updated_at")
    if not isinstance(updated, str) or not _ISO_UTC.match(updated):
        raise InvalidRequest(f"{event} delivery without `{key}.updated_at` (ISO 8601 UTC)")
    labels = item.get("labels", [])
    if not isinstance(labels, list) or not all(
        isinstance(lab, dict) and isinstance(lab.get("name"), str) for lab in labels
    ):
        raise InvalidRequest(f"{event} delivery with `{key}.labels` that are not label objects")
