"""Steering: maintainers' actions on one repository (control.lua), paused agents, work that
waits on a person, the audit log, and what the poller learns about held tasks
(lease_upkeep.lua)."""

from __future__ import annotations

import json
from typing import Any

from github_broker.models import (
    AgentPause,
    AuditEntry,
    Authority,
    ControlOutcome,
    TaskState,
    Waiting,
)
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors
from github_broker.store.leases import pause_of


def split_actor(actor: str) -> tuple[int, str]:
    """(rank, name) of an actor argument `<rank>:<name>`; a bare name is the broker's own
    (steering/authority.py `actor_arg`, `parse_actor` in _lib.lua)."""
    if actor[1:2] == ":" and actor[:1].isdigit():
        return int(actor[0]), actor[2:]
    return int(Authority.BROKER), actor


async def xadd_audit(client: Any, key: str, max_entries: int, entry: dict[str, str]) -> None:
    await client.xadd(key, entry, maxlen=max_entries, approximate=True)


def audit_entries(entries: list[Any], repository: str | None) -> list[AuditEntry]:
    out = []
    for entry_id, raw in entries:
        f = {as_text(k): as_text(v) for k, v in raw.items()}
        out.append(
            AuditEntry(
                at_ms=int(as_text(entry_id).split("-")[0]),
                id=as_text(entry_id),
                actor=f.get("actor", ""),
                authority=Authority(int(f.get("authority") or Authority.BROKER)),
                action=f.get("action", ""),
                repository=f.get("repository") or repository,
                issue=int(f["n"]) if f.get("n") else None,
                agent=f.get("agent", ""),
                reason=f.get("reason", ""),
                outcome=f.get("outcome", ""),
                state=TaskState(f["state"]) if f.get("state") else None,
            )
        )
    return out


class ControlStore(RepoBase):
    """One repository's side of steering."""

    @translate_errors
    async def control(
        self, action: str, actor: str, target: str, reason: str = "", *extra: str
    ) -> ControlOutcome:
        """Run one maintainer action (see control.lua), audited with its real outcome; durable
        like a claim (`redis.durability`): a lease it ends stays ended."""
        reply = await self._run_durable("control", action, actor, target, reason, *extra)
        outcome, agent, reindex = reply[:3]
        kept = as_text(reply[3]) if len(reply) > 3 else ""
        return ControlOutcome(
            outcome=as_text(outcome),
            agent=as_text(agent),
            reindex=as_text(reindex) == "1",
            kept_away=kept,
        )

    @translate_errors
    async def lease_upkeep(
        self, action: str, number: int, token: str, what: str, *, epoch: int = 0, kind: str = ""
    ) -> bool:
        """What the poller learned about issue n's lease (see lease_upkeep.lua); True when it
        changed something."""
        return bool(int(await self._run("lease_upkeep", action, number, token, what, epoch, kind)))

    @translate_errors
    async def paused_agents(self) -> dict[str, AgentPause]:
        raw = await awaited(self.client.hgetall(self.keys.paused_agents))
        return {as_text(k): pause_of(json.loads(v)) for k, v in raw.items()}

    @translate_errors
    async def recovering(self) -> dict[int, str]:
        """Issues whose lease Redis lost and whose agent never proved it: issue -> agent; the
        leader reads GitHub to settle each (control.lua `recovered`)."""
        raw = await awaited(self.client.hgetall(self.keys.recovering))
        return {int(k): as_text(v) for k, v in raw.items()}

    @translate_errors
    async def repo_pause(self) -> dict[str, Any] | None:
        """This repository's maintenance pause (its own or the broker's), or None."""
        raw = await awaited(self.client.hmget(self.keys.control, ["repo", "broker"]))
        found = next((v for v in raw if v), None)
        return json.loads(found) if found else None

    @translate_errors
    async def waiting(self) -> dict[int, Waiting]:
        """Work that waits on a person, by issue."""
        raw = await awaited(self.client.hgetall(self.keys.waiting))
        out = {}
        for k, v in raw.items():
            data = json.loads(v)
            prio = data.get("prio")
            out[int(k)] = Waiting(
                issue=int(k),
                code=data["code"],
                since_ms=int(data["since_ms"]),
                detail=data.get("detail") or "",
                priority=int(prio) if isinstance(prio, int | float) and prio >= 0 else None,
            )
        return out

    @translate_errors
    async def usage(self, number: int) -> dict[str, float]:
        raw = await awaited(self.client.hget(self.keys.usage, str(number)))
        return json.loads(raw) if raw else {"tokens": 0, "cost": 0}

    @translate_errors
    async def audit_log(self, count: int = 50, before: str = "+") -> list[AuditEntry]:
        """The newest entries up to `before` (a stream id, exclusive; "+" from the newest)."""
        end = before if before == "+" else f"({before}"
        entries = await self.client.xrevrange(self.keys.audit, max=end, count=count)
        return audit_entries(entries, self.repository)

    @translate_errors
    async def audit_since(self, after_id: str, count: int = 500) -> list[AuditEntry]:
        """Entries after `after_id` ("0-0": from the start), oldest first."""
        reply = await self.client.xread({self.keys.audit: after_id}, count=count)
        return audit_entries(reply[0][1] if reply else [], self.repository)
