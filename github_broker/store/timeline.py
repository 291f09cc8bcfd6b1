"""A repository's timeline stream (the dashboard's recent events)."""

from __future__ import annotations

from typing import Any

from github_broker.models import ENDED_STATE, Event
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, translate_errors

#: Approximate cap of each timeline stream (XADD MAXLEN ~): recent events only.
TIMELINE_MAX = 2000


async def xadd_event(
    client: Any, key: str, kind: str, number: int | None, agent: str, detail: str
) -> None:
    fields = {"kind": kind, "n": "" if number is None else str(number), "agent": agent}
    fields["detail"] = detail
    await client.xadd(key, fields, maxlen=TIMELINE_MAX, approximate=True)


def events_of(entries: list[Any], repository: str | None) -> list[Event]:
    out = []
    for entry_id, raw in entries:
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        out.append(
            Event(
                at_ms=int(as_text(entry_id).split("-")[0]),
                kind=f.get("kind", ""),
                id=as_text(entry_id),
                repository=repository,
                issue=int(f["n"]) if f.get("n") else None,
                agent=f.get("agent", ""),
                detail=f.get("detail", ""),
                state=ENDED_STATE.get(f.get("kind", "")),
            )
        )
    return out


class Timeline(RepoBase):
    """A repository's timeline stream (the dashboard's recent events)."""

    @translate_errors
    async def record_event(
        self, kind: str, number: int | None = None, agent: str = "", detail: str = ""
    ) -> None:
        await xadd_event(self.client, self.keys.timeline, kind, number, agent, detail)

    @translate_errors
    async def timeline(self, count: int = 50) -> list[Event]:
        """The most recent events, newest first."""
        entries = await self.client.xrevrange(self.keys.timeline, count=count)
        return events_of(entries, self.repository)

    @translate_errors
    async def timeline_since(self, after_id: str, count: int = 100) -> list[Event]:
        """Events after `after_id` ("0-0": from the start), oldest first."""
        reply = await self.client.xread({self.keys.timeline: after_id}, count=count)
        entries = reply[0][1] if reply else []
        return events_of(entries, self.repository)
