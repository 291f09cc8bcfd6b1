"""Internal records of the simulated GitHub (repositories) and the time/sha helpers they use."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

logger = logging.getLogger(__name__)

Record = dict[str, Any]

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime(TIME_FORMAT)


def parse_time(value: str | datetime | date) -> datetime:
    """Accept what YAML and clients hand us: datetimes, dates and ISO 8601 strings."""
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    else:
        moment = datetime.fromisoformat(value.strip())
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def normalize_time(value: str | datetime | date) -> str:
    return format_time(parse_time(value))


def fake_sha(*parts: object) -> str:
    return hashlib.sha1("/".join(str(p) for p in parts).encode("utf-8")).hexdigest()


@dataclass
class Repo:
    """One repository and everything hanging off it; only touched under SimState.lock."""

    id: int
    owner: str
    name: str
    default_branch: str
    private: bool
    description: str
    created_at: str
    labels: dict[str, Record] = field(default_factory=dict)  # lower-cased name -> label
    issues: dict[int, Record] = field(default_factory=dict)  # issues and pulls share numbers
    refs: dict[str, str] = field(default_factory=dict)  # "refs/heads/x" -> sha
    reviews: dict[int, list[Record]] = field(default_factory=dict)
    review_comments: dict[int, list[Record]] = field(default_factory=dict)
    issue_comments: dict[int, list[Record]] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    next_number: int = 1
    # Bumped on every issue/pull change so cached listings know they are stale.
    version: int = 0
    listing_cache: dict[tuple[Any, ...], tuple[int, list[Record]]] = field(default_factory=dict)
    #: (updated_at, number) of every issue change, oldest first, so a `since` listing reads
    #: only the issues changed since instead of all of them (see IssueStore.since_candidates);
    #: None until a `since` listing builds it, and again when a change would break its order.
    updates: list[tuple[str, int]] | None = None
    #: Numbers of the pull requests (a record is a pull from its creation on).
    pulls: set[int] = field(default_factory=set)
    #: sha -> commit record (simulator/commits.py): parents, message, author, seq.
    commits: dict[str, Record] = field(default_factory=dict)
    #: lower-cased login -> (login, role): admin, maintain, write, triage or read.
    collaborators: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: When a ref last moved; None until the first push (GitHub then shows created_at).
    pushed_at: str | None = None

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def open_issues_count(self) -> int:
        key: tuple[Any, ...] = ("open_count",)
        cached = self.listing_cache.get(key)
        if cached is None or cached[0] != self.version:
            opened = [rec for rec in self.issues.values() if rec["state"] == "open"]
            cached = (self.version, opened)
            self.listing_cache[key] = cached
        return len(cached[1])
