"""Claims and leases: the claim script, heartbeats, lease ends, the ready indexes and the
failure budget's streaks."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, NamedTuple

from github_broker.clock import iso_from_ms, now_ms
from github_broker.errors import MirrorRebuilding
from github_broker.models import (
    AgentPause,
    Beat,
    Claimed,
    Issue,
    Judgement,
    LeaseInfo,
    LeaseRefusal,
    NoTask,
    Note,
    TaskPause,
    TaskState,
    TaskType,
    constructed,
)
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors
from github_broker.store.tokens import Grant, new_nonce

#: Ready tasks a claim looks at per index before giving up on held leftovers.
CLAIM_SCAN = 16


class Refusal(str):
    """Why a lease call was refused (a LeaseRefusal value, so it compares as one), with the
    reason in words when the lease ended with one (a maintainer's revoke): `detail`."""

    detail: str = ""

    def __new__(cls, reason: str, detail: str = "") -> Refusal:
        made = super().__new__(cls, LeaseRefusal(reason).value)
        made.detail = detail
        return made


def _refusal(value: Any) -> Refusal:
    reason, _, detail = as_text(value).partition("|")
    if reason == "rebuilding":
        # Redis lost the lease with everything else; the next sync re-adopts it from GitHub.
        raise MirrorRebuilding("the mirror is being rebuilt from GitHub; retry shortly")
    return Refusal(reason, detail)


def _ms_iso(ms: Any) -> str:
    return iso_from_ms(int(ms)) if ms is not None else ""


def beat_of(expires_ms: int, raw: Any) -> Beat:
    """heartbeat.lua's answer as a Beat (times as ISO 8601)."""
    data = json.loads(raw)
    paused, agent_paused = data.get("paused"), data.get("agent_paused")
    return Beat(
        expires_ms=expires_ms,
        state=TaskState(data["state"]),
        notes=[
            Note(by=n["by"], text=n["text"], at=_ms_iso(n.get("at_ms")))
            for n in (data.get("notes") or [])
        ],
        paused=TaskPause(
            code=paused["code"], detail=paused["detail"], at=_ms_iso(paused.get("at_ms"))
        )
        if paused
        else None,
        agent_paused=pause_of(agent_paused) if agent_paused else None,
    )


def pause_of(data: dict[str, Any]) -> AgentPause:
    return AgentPause(
        kind=data["kind"],
        by=data["by"],
        reason=data.get("reason") or "",
        at=_ms_iso(data.get("at_ms")),
    )


class Sweep(NamedTuple):
    """What one lease sweep found (LeaseRegistry.sweep)."""

    expired: int
    trips: list[str]
    revived: list[int]


class LeaseRegistry(RepoBase):
    """Claims, heartbeats and lease ends (one script each), the ready indexes, streaks."""

    @translate_errors
    async def claim(
        self,
        agent_id: str,
        *,
        previous: str,
        mode: str,
        base_branch: str,
        roles: list[str] | None,
        settle_only: bool = False,
        skip_issue: int | None = None,
        request_id: str | None = None,
        fence_ms: int | None = None,
    ) -> Claimed | NoTask:
        """Settle the agent's held task with `previous`, then lease the next task (one call).
        A `request_id` seen before gets the same task and lease again (see claim.lua). Under
        the agent's mutex (several repositories), `fence_ms` is its `MutexHold.fence_ms`:
        past it Redis refuses to run the script (StoreUnavailable)."""
        token = new_nonce()
        res = await self._run_durable(
            "claim",
            agent_id,
            token,
            previous,
            mode,
            base_branch,
            CLAIM_SCAN,
            "1" if settle_only else "0",
            "" if skip_issue is None else str(skip_issue),
            request_id or "",
            "" if fence_ms is None else str(fence_ms),
            *(roles or []),
        )
        if int(res[0]) == 0:
            return _no_task(res)
        return self._claimed(agent_id, res)

    def _claimed(self, agent_id: str, res: list[Any]) -> Claimed:
        """claim.lua's hand-out, with its lease token signed over what it grants."""
        _, task_id, n, tok, expires, issue, role, branch, settled, outcome, payload, cont, at = res
        task_id = as_text(task_id)
        task_type = TaskType(task_id.split(":")[0])
        grant = Grant(self.repository, int(n), agent_id, task_type.value, int(at), 0)
        signed = self.signer.token(
            as_text(tok), replace(grant, until_ms=self.signer.until(int(at)))
        )
        # Every value is typed here (the issue validated from its JSON): no second validation
        # of the whole (once per claim, on the hot path).
        return constructed(
            Claimed,
            {
                "repository": self.repository,
                "task_id": task_id,
                "task_type": task_type,
                "issue": Issue.model_validate_json(issue),
                "role": as_text(role),
                "branch": as_text(branch),
                "token": signed,
                "expires_ms": int(expires),
                "settled_issue": int(settled) if as_text(settled) else None,
                "settled_outcome": as_text(outcome) if as_text(settled) else None,
                "payload": json.loads(payload) if payload else None,
                "continues": json.loads(cont) if cont else None,
            },
        )

    @translate_errors
    async def judge(
        self, agent_id: str, *, mode: str, roles: list[str] | None, shown: int
    ) -> Judgement:
        """What claim.lua would decide for `agent_id` here now, without doing it
        (explain.lua, read only)."""
        res = await self._run("explain", agent_id, mode, CLAIM_SCAN, shown, *(roles or []))
        bucket, paused, held_back, reserved, held, next_id, judged = (as_text(v) for v in res)
        return Judgement(
            repository=self.repository,
            agent=agent_id,
            bucket=int(bucket) if int(bucket) >= 0 else None,
            agent_paused=json.loads(paused) if paused else None,
            repo_paused=json.loads(held_back) if held_back else None,
            reserved=json.loads(reserved) if reserved else None,
            held=int(held) if held else None,
            next_id=next_id or None,
            judged=json.loads(judged) if judged != "[]" else [],
        )

    @translate_errors
    async def heartbeat(
        self,
        number: int,
        agent_id: str,
        token: str,
        *,
        note: str = "",
        tokens: int | None = None,
        cost: float | None = None,
    ) -> tuple[bool, Beat | Refusal]:
        """(True, the Beat) or (False, why) when the lease is not this agent's any more.
        `note`, `tokens`, `cost`: what the agent reports (see heartbeat.lua)."""
        heard = self.ended.ended(self.signer.nonce(token))
        if heard is not None:
            return False, _refusal(heard)
        res = await self._run(
            "heartbeat",
            number,
            agent_id,
            self.signer.nonce(token),
            note,
            "" if tokens is None else str(tokens),
            "" if cost is None else repr(float(cost)),
            *self._proof(number, agent_id, token),
        )
        if not int(res[0]):
            return False, _refusal(res[1])
        return True, beat_of(int(res[1]), res[2])

    @translate_errors
    async def finish(
        self, number: int, agent_id: str, token: str, outcome: str, *, counted: bool = True
    ) -> tuple[bool, str]:
        """(True, outcome) or (False, why: a Refusal). `counted=False`: a failure that is
        not the agent's (it never saw the task) spends no failure budget."""
        heard = self.ended.ended(self.signer.nonce(token))
        if heard is not None:
            return False, _refusal(heard)
        ok, value = await self._run_durable(
            "finish",
            number,
            agent_id,
            self.signer.nonce(token),
            outcome,
            "1" if counted else "0",
            *self._proof(number, agent_id, token),
        )
        return (True, as_text(value)) if int(ok) else (False, _refusal(value))

    def _proof(self, number: int, agent_id: str, token: str) -> tuple[str, str, str]:
        """(task type, claimed ms, what this process remembers of the lease: 'live' or
        'unknown', see EndedLeases.recall) when `token` is a valid, unexpired token the broker
        signed for `agent_id`'s lease on this repository's issue `number`; ("", "", "")
        otherwise."""
        grant = self.signer.verify(token)
        if (
            grant is None
            or grant.repository != self.repository
            or grant.issue != number
            or grant.agent != agent_id
            or grant.until_ms <= now_ms()
        ):
            return "", "", ""
        memory = self.ended.recall(self.signer.nonce(token), grant.claimed_ms)
        return grant.task_type, str(grant.claimed_ms), memory

    async def reap(self, limit: int = 100, *, epoch: int = 0) -> int:
        """Expired leases examined."""
        return (await self.sweep(limit, epoch=epoch))[0]

    @translate_errors
    async def sweep(self, limit: int = 100, *, epoch: int = 0) -> Sweep:
        """The leader's sweep (reap.lua): expired leases examined, the agents the circuit
        breaker paused here since the last sweep (to pause in every repository), and the
        issues revived by taking back a convicted agent's charge (to index again)."""
        examined, trips, revived = await self._run("reap", limit, epoch)
        return Sweep(
            int(examined),
            [as_text(a) for a in json.loads(trips)],
            [int(n) for n in json.loads(revived)],
        )

    @translate_errors
    async def knows_request(self, agent_id: str, request_id: str) -> bool:
        """Whether a claim here remembers a hand-out for this request id (claim.lua)."""
        return bool(await awaited(self.client.exists(self.keys.handout(agent_id, request_id))))

    @translate_errors
    async def current_task(self, agent_id: str) -> int | None:
        """The issue the agent holds a live lease on here, or None."""
        raw = await awaited(self.client.get(self.keys.agent_current_task(agent_id)))
        if not raw:
            return None
        n = int(raw)
        holder = await awaited(self.client.hget(self.keys.lease(n), "agent"))
        return n if holder is not None and as_text(holder) == agent_id else None

    @translate_errors
    async def holds_lease(self, agent_id: str) -> bool:
        """Whether the agent's current task here is a live lease."""
        raw = await awaited(self.client.get(self.keys.agent_current_task(agent_id)))
        if not raw:
            return False
        return bool(await awaited(self.client.exists(self.keys.issue_lock(int(raw)))))

    @translate_errors
    async def candidate(self, number: int, agent_id: str) -> dict[str, Any] | None:
        raw = await awaited(self.client.get(self.keys.task_candidate(number, agent_id)))
        return json.loads(raw) if raw else None

    @translate_errors
    async def leases(self) -> list[LeaseInfo]:
        numbers = [int(n) for n in await self.client.zrange(self.keys.leases, 0, -1)]
        async with self.client.pipeline(transaction=False) as pipe:
            for n in numbers:
                pipe.hgetall(self.keys.lease(n))
            rows = await pipe.execute()
        out = []
        for n, row in zip(numbers, rows, strict=True):
            if row and (b"agent" in row or "agent" in row):
                out.append(lease_info(self.repository, n, row))
        return out

    @translate_errors
    async def lease(self, number: int) -> LeaseInfo | None:
        """Issue n's lease, if one is recorded (its lock may have just expired)."""
        row = await awaited(self.client.hgetall(self.keys.lease(number)))
        return lease_info(self.repository, number, row) if row else None

    @translate_errors
    async def ready_tasks(self, role: str | None = None) -> list[tuple[str, float]]:
        key = self.keys.ready_role(role) if role else self.keys.ready
        return [
            (as_text(m), float(s)) for m, s in await self.client.zrange(key, 0, -1, withscores=True)
        ]

    @translate_errors
    async def task_index(self) -> dict[str, tuple[float, str, str]]:
        """Every task the rules allow, held or not: id -> (score, role, branch)."""
        out = {}
        for task_id, raw in (await awaited(self.client.hgetall(self.keys.tasks))).items():
            score, role, _pr, _author, _since, branch = as_text(raw).split("|", 5)
            out[as_text(task_id)] = (float(score), role, branch)
        return out

    @translate_errors
    async def task_branches(self, task_ids: list[str]) -> dict[str, str]:
        """The branch of each of `task_ids` that still exists (one HMGET)."""
        if not task_ids:
            return {}
        values = await awaited(self.client.hmget(self.keys.tasks, task_ids))
        return {
            t: as_text(v).split("|", 5)[5]
            for t, v in zip(task_ids, values, strict=True)
            if v is not None
        }

    @translate_errors
    async def existing_tasks(self, task_ids: list[str]) -> set[str]:
        """Those of `task_ids` that are in the tasks hash (one HMGET, not the whole hash)."""
        if not task_ids:
            return set()
        values = await awaited(self.client.hmget(self.keys.tasks, task_ids))
        return {t for t, v in zip(task_ids, values, strict=True) if v is not None}

    @translate_errors
    async def agent_streaks(self) -> dict[str, int]:
        """Consecutive failures per agent (the failure budget's hash), when it exists."""
        raw = await awaited(self.client.hgetall(self.keys.agent_streaks))
        return {as_text(k): int(v) for k, v in raw.items() if int(v) > 0}


def lease_info(repository: str, number: int, row: dict[Any, Any]) -> LeaseInfo:
    """A `lease:{n}` hash as a LeaseInfo."""
    h = {as_text(k): as_text(v) for k, v in row.items()}

    def ms(name: str) -> int | None:
        return int(h[name]) if h.get(name) else None

    return LeaseInfo(
        repository=repository,
        issue=number,
        agent_id=h.get("agent", ""),
        task_type=h.get("task_type", ""),
        claimed_ms=int(h.get("claimed_ms") or 0),
        expires_ms=int(h.get("expires_ms") or 0),
        beats=int(h.get("beats") or 0),
        note=h.get("note", ""),
        note_ms=ms("note_ms"),
        progress=h.get("progress", ""),
        progress_ms=ms("progress_ms"),
        stalled=h.get("stalled", ""),
        paused=h.get("paused", ""),
        used_tokens=int(h.get("used_tokens") or 0),
        used_cost=float(h.get("used_cost") or 0),
        continues=h.get("continues", ""),
        token=h.get("token", ""),
        budget_since_ms=ms("budget_since_ms"),
    )


def _no_task(res: list[Any]) -> NoTask:
    """claim.lua's answer when it handed nothing out: why, what it settled, the bucket."""
    _, reason, settled, outcome, bucket, detail = res
    return NoTask(
        reason=as_text(reason),
        bucket=int(bucket) if int(bucket) >= 0 else None,
        settled_issue=int(settled) if as_text(settled) else None,
        settled_outcome=as_text(outcome) if as_text(settled) else None,
        detail=as_text(detail),
    )
