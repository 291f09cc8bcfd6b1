"""An issue comment as both paths see it (a webhook's `comment`, an item of the listing)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from github_broker.steering.commands.access import is_bot

#: The issue (or pull request) a listed comment is on: the end of its `issue_url`.
_ISSUE_URL = re.compile(r"/issues/(\d+)$")


@dataclass(frozen=True)
class Comment:
    id: int
    #: The issue or pull request it is on.
    number: int
    login: str
    bot: bool
    body: str
    created_at: str
    updated_at: str

    @property
    def edited(self) -> bool:
        return self.updated_at != self.created_at

    def age_s(self, now_s: float) -> float:
        return now_s - datetime.fromisoformat(self.created_at).timestamp()

    @classmethod
    def from_github(cls, data: Any, number: Any = None) -> Comment | None:
        """The comment, or None when a field it needs is missing or of another type."""
        if not isinstance(data, dict):
            return None
        if number is None:
            found = _ISSUE_URL.search(str(data.get("issue_url") or ""))
            number = int(found.group(1)) if found else None
        user = data.get("user")
        fields = (data.get("id"), data.get("body"), data.get("created_at"), data.get("updated_at"))
        cid, body, created, updated = fields
        if not (
            isinstance(number, int)
            and isinstance(cid, int)
            and isinstance(user, dict)
            and isinstance(user.get("login"), str)
            and isinstance(body, str)
            and isinstance(created, str)
            and isinstance(updated, str)
        ):
            return None
        try:
            datetime.fromisoformat(created)
        except ValueError:
            return None
        return cls(
            id=cid,
            number=number,
            login=user["login"],
            bot=is_bot(user),
            body=body,
            created_at=created,
            updated_at=updated,
        )
