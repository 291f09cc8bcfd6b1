"""The hot path's shortcuts give what the general tools give: `constructed` builds the same
models as pydantic's `model_construct`, `_within` bounds a call as `asyncio.timeout` does."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from github_broker.models import (
    Claimed,
    Issue,
    LeaseGrant,
    ReviewComment,
    Task,
    TaskType,
    constructed,
)
from github_broker.store.connection import _within

LEASE = {"token": "t" * 24, "expires_at": "2026-11-24T00:00:00Z", "heartbeat_interval_s": 200}
ISSUE = Issue(
    number=7,
    title="Add a widget",
    body="## Deliverables\n- a widget",
    labels=["P1", "BACKENDCODER"],
    html_url="https://github.com/acme/widgets/issues/7",
    created_at="2026-11-23T00:00:00Z",
    updated_at="2026-11-24T00:00:00Z",
)


def _task_fields() -> dict[str, object]:
    return {
        "issue_id": 7,
        "issue_url": ISSUE.html_url,
        "title": ISSUE.title,
        "body": ISSUE.body,
        "labels": ISSUE.labels,
        "branch_name": "issue-7",
        "prompt": "Work on #7",
        "required_role": "BACKENDCODER",
        "task_type": TaskType.FIX,
        "repository": "acme/widgets",
        "base_branch": "main",
        "pr_url": "https://github.com/acme/widgets/pull/9",
        "review_comments": [
            ReviewComment(id=3, kind="inline", author="rev", body="rename it", path="a.py")
        ],
        "lease": constructed(LeaseGrant, dict(LEASE)),
        "continues": None,
        "credential_path": "/tasks/acme/widgets/7/credential",
    }


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (LeaseGrant, lambda: dict(LEASE)),
        (Task, _task_fields),
        (
            Claimed,
            lambda: {
                "repository": "acme/widgets",
                "task_id": "development:7",
                "task_type": TaskType.DEVELOPMENT,
                "issue": ISSUE,
                "role": "BACKENDCODER",
                "branch": "issue-7",
                "token": "t" * 24,
                "expires_ms": 1_790_000_000_000,
                "settled_issue": None,
                "settled_outcome": None,
                "payload": None,
                "continues": None,
            },
        ),
    ],
)
def test_constructed_is_model_construct(cls: type[BaseModel], fields: object) -> None:
    values = fields()  # type: ignore[operator]
    ours = constructed(cls, dict(values))
    theirs = cls.model_construct(**values)
    assert ours == theirs
    assert ours.model_fields_set == theirs.model_fields_set == set(cls.model_fields)
    assert ours.model_dump_json() == theirs.model_dump_json()
    assert ours.model_dump() == cls.model_validate(values).model_dump()
    # What `constructed` relies on: no aliases, private attributes or post-init hook.
    assert not cls.__private_attributes__
    assert cls.__pydantic_post_init__ is None
    assert all(f.alias is None and f.validation_alias is None for f in cls.model_fields.values())
    # Copies and changes work as on any model.
    copy = ours.model_copy(update={"repository": "acme/gadgets"} if "repository" in values else {})
    assert copy.model_dump().keys() == ours.model_dump().keys()


async def _slow() -> str:
    await asyncio.sleep(5)
    return "late"


@pytest.mark.anyio
async def test_within_times_out_and_takes_its_cancel_back() -> None:
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(TimeoutError):
        await _within(0.01, _slow())
    assert task.cancelling() == 0  # as after asyncio.timeout: the cancel was its own
    assert await _within(1.0, asyncio.sleep(0, result="on time")) == "on time"


@pytest.mark.anyio
async def test_within_leaves_a_cancel_from_elsewhere_a_cancel() -> None:
    inner = asyncio.create_task(_within(5.0, _slow()))
    await asyncio.sleep(0.01)
    inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inner
    assert inner.cancelled()


@pytest.mark.anyio
async def test_within_when_the_call_swallows_the_cancel() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    task = asyncio.current_task()
    assert task is not None
    assert await _within(0.01, stubborn()) == "swallowed"
    assert task.cancelling() == 0  # its cancel taken back: later awaits are not cancelled
    await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_within_and_an_outer_timeout() -> None:
    # The outer bound expires first: the outer timeout's TimeoutError, not ours.
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await _within(5.0, _slow())
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
