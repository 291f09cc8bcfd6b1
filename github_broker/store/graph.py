"""GitHub's dependency graph as one repository mirrors it: each issue's blockers, what the
leader knows of each blocker, the verdicts, sub-issues' places in their parents' order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors

#: A blocker GitHub counts on an issue but did not show (no permission to read it).
HIDDEN = "?hidden"
#: A blocker list GitHub could not be asked for (the read failed): the issue waits.
UNREAD = "?error"


@dataclass
class GraphUpdate:
    """One graph_save.lua call: see its header for each part."""

    links: dict[int, list[str]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    gone: list[int] = field(default_factory=list)
    order: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    cycles: dict[int, list[str]] | None = None

    def __bool__(self) -> bool:
        return bool(self.links or self.states or self.gone or self.order) or self.cycles is not None

    def payload(self) -> str:
        body: dict[str, Any] = {
            "links": {str(n): refs for n, refs in self.links.items()},
            "states": self.states,
            "gone": self.gone,
            "order": {str(n): place or False for n, place in self.order.items()},
        }
        if self.cycles is not None:
            body["cycles"] = {str(n): refs for n, refs in self.cycles.items()}
        return json.dumps(body)


@dataclass(frozen=True)
class Verdict:
    """Whether an issue is blocked now (ref: the blocker that keeps it, '' none)."""

    number: int
    ref: str = ""
    state: str = ""
    changed: bool = False


@dataclass(frozen=True)
class Blocked:
    """An issue a blocker keeps from being handed out, as the leader last judged."""

    ref: str
    state: str


class GraphStore(RepoBase):
    """The graph:* keys of one repository (keys.py), written by graph_save.lua."""

    @translate_errors
    async def save_graph(self, update: GraphUpdate, *, epoch: int = 0) -> list[Verdict]:
        """Write `update`; the verdicts of the issues it concerns (see graph_save.lua)."""
        if not update:
            return []
        raw = json.loads(as_text(await self._run("graph_save", update.payload(), epoch)))
        return [
            Verdict(int(v["n"]), v.get("ref") or "", v.get("state") or "", bool(v["changed"]))
            for v in raw or []
        ]

    @translate_errors
    async def blocked(self) -> dict[int, Blocked]:
        """Every issue a blocker keeps waiting, as the leader last judged (reports); none while
        dependencies are off (the claim ignores the graph then)."""
        if not self.settings.dependencies.enabled:
            return {}
        raw = await awaited(self.client.hgetall(self.keys.graph_blocked))
        out = {}
        for n, v in raw.items():
            ref, _, state = as_text(v).rpartition(" ")
            out[int(n)] = Blocked(ref, state)
        return out

    @translate_errors
    async def blocked_count(self) -> int:
        if not self.settings.dependencies.enabled:
            return 0
        return int(await awaited(self.client.hlen(self.keys.graph_blocked)))

    @translate_errors
    async def links(self, numbers: list[int] | None = None) -> dict[int, list[str]]:
        """Issues' blockers as last read (all of them when `numbers` is None)."""
        if numbers is None:
            raw = await awaited(self.client.hgetall(self.keys.graph_deps))
            return {int(n): json.loads(v) for n, v in raw.items()}
        if not numbers:
            return {}
        values = await awaited(self.client.hmget(self.keys.graph_deps, [str(n) for n in numbers]))
        return {n: json.loads(v) for n, v in zip(numbers, values, strict=True) if v}

    @translate_errors
    async def blocker_states(self, refs: list[str]) -> dict[str, str]:
        """What the leader last learnt of these blockers (graph:state)."""
        if not refs:
            return {}
        values = await awaited(self.client.hmget(self.keys.graph_state, refs))
        return {r: as_text(v) for r, v in zip(refs, values, strict=True) if v}

    @translate_errors
    async def orders(self, numbers: list[int]) -> dict[int, dict[str, Any]]:
        """Sub-issues' places in their parents' order."""
        if not numbers:
            return {}
        values = await awaited(self.client.hmget(self.keys.graph_order, [str(n) for n in numbers]))
        return {n: json.loads(v) for n, v in zip(numbers, values, strict=True) if v}

    @translate_errors
    async def cycles(self) -> dict[int, list[str]]:
        raw = await awaited(self.client.hgetall(self.keys.graph_cycles))
        return {int(n): json.loads(v) for n, v in raw.items()}
