"""Builders for test data shared by several test modules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from github_broker.models import Issue

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def iso(minutes: int) -> str:
    return (EPOCH + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def body(branch: str = "feature/issue-xx") -> str:
    return f"## Deliverables\n- the change, with tests\n\nBranch: {branch}\n"


def issue(number: int, *labels: str, text: str | None = None, minute: int | None = None) -> Issue:
    """An open issue; created `minute` minutes after EPOCH (default: its number)."""
    at = iso(number if minute is None else minute)
    return Issue(
        number=number,
        title=f"Task {number}",
        body=body() if text is None else text,
        labels=sorted(labels),
        created_at=at,
        updated_at=at,
    )


def make_known(redis_url: str, *agents: str, prefix: str = "gb") -> None:
    """Agents the broker knows as if each had asked for work lately: steering actions name
    known agents only (`Steering.known_agents`)."""
    import time

    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        now = int(time.time() * 1000)
        client.zadd(f"{prefix}:agents:seen", dict.fromkeys(agents, now))
    finally:
        client.close()
