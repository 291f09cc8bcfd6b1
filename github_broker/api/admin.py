"""The people's API (a maintainer's or the admin token): steer running work, read the audit
log and agents. Every route acts as `Caller`, the person behind the token; a maintainer's call
on another repository is refused (403) and audited as refused."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field, StrictBool

from github_broker.api.caller import Caller
from github_broker.api.routes import ERRORS, IssueNumber, Services
from github_broker.errors import BODY_LIMIT_RESPONSE
from github_broker.models import AGENT_ID_PATTERN, ActionAnswer, AgentPause, AuditEntry
from github_broker.steering.actions import MAX_TEXT, ActionResult, BudgetRaise

router = APIRouter(prefix="/admin", tags=["admin"], responses=BODY_LIMIT_RESPONSE)
#: Most audit entries one page returns.
MAX_AUDIT_PAGE = 500

AgentId = Annotated[str, Path(pattern=AGENT_ID_PATTERN, description="agent id")]
Text = Annotated[str, Field(max_length=MAX_TEXT)]


class Action(BaseModel):
    """Why (recorded in the audit log; a revoke's reason is told to the agent)."""

    reason: Text = ""


class Revoke(Action):
    hold: StrictBool = Field(
        False, description="Hold the issue for a person instead of returning it to the pool."
    )


class Retry(Action):
    budget_tokens: int | None = Field(
        None,
        ge=1,
        le=10**12,
        description="Raise this issue's token budget to this (usage so far kept) instead of "
        "counting its usage again from the retry.",
    )
    budget_cost: float | None = Field(
        None,
        gt=0,
        le=10**9,
        description="Raise this issue's cost budget to this (usage so far kept).",
    )


class Reassign(Action):
    agent_id: str = Field(pattern=AGENT_ID_PATTERN, description="The agent that continues it.")


class NoteBody(BaseModel):
    text: Text = Field(min_length=1, description="Delivered with the holder's next heartbeat.")


class AgentRow(BaseModel):
    agent_id: str
    paused: AgentPause | None = None
    #: Issues it holds now, as owner/name#n.
    holds: list[str] = []
    #: Consecutive failures per repository.
    streaks: dict[str, int] = {}


def _answer(result: ActionResult) -> ActionAnswer:
    return ActionAnswer(
        action=result.action,
        target=result.target,
        outcome=result.outcome,
        repositories=result.repositories,
    )


@router.post("/tasks/{owner}/{repo}/{number}/revoke", response_model=ActionAnswer, responses=ERRORS)
async def revoke(
    owner: str, repo: str, number: IssueNumber, body: Revoke, who: Caller, svc: Services
) -> ActionAnswer:
    """End the lease now; the agent hears the reason at its next heartbeat (409 revoked)."""
    return _answer(
        await svc.steering.revoke(f"{owner}/{repo}", number, who, body.reason, hold=body.hold)
    )


@router.post(
    "/tasks/{owner}/{repo}/{number}/reassign", response_model=ActionAnswer, responses=ERRORS
)
async def reassign(
    owner: str, repo: str, number: IssueNumber, body: Reassign, who: Caller, svc: Services
) -> ActionAnswer:
    """Give the task to another agent (its next request-task); the branch and PR stay."""
    return _answer(
        await svc.steering.reassign(f"{owner}/{repo}", number, body.agent_id, who, body.reason)
    )


@router.post("/tasks/{owner}/{repo}/{number}/note", response_model=ActionAnswer, responses=ERRORS)
async def note(
    owner: str, repo: str, number: IssueNumber, body: NoteBody, who: Caller, svc: Services
) -> ActionAnswer:
    """A message to the agent holding the task, delivered with its next heartbeat."""
    return _answer(await svc.steering.note(f"{owner}/{repo}", number, who, body.text))


@router.post("/tasks/{owner}/{repo}/{number}/retry", response_model=ActionAnswer, responses=ERRORS)
async def retry(
    owner: str, repo: str, number: IssueNumber, body: Retry, who: Caller, svc: Services
) -> ActionAnswer:
    """Another round for an issue the broker gave up on: failures cleared, usage counted again
    from now (or its budget raised), tasks back, agents it was revoked from let back."""
    raised = None
    if body.budget_tokens is not None or body.budget_cost is not None:
        raised = BudgetRaise(body.budget_tokens, body.budget_cost)
    return _answer(
        await svc.steering.retry(f"{owner}/{repo}", number, who, body.reason, raise_budget=raised)
    )


@router.post("/agents/{agent_id}/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_agent(agent_id: AgentId, body: Action, who: Caller, svc: Services) -> ActionAnswer:
    """Drain an agent: its current task may finish, it gets no new one (a maintainer: in
    their repositories)."""
    return _answer(await svc.steering.pause_agent(agent_id, who, body.reason))


@router.post("/agents/{agent_id}/stop", response_model=ActionAnswer, responses=ERRORS)
async def stop_agent(agent_id: AgentId, body: Action, who: Caller, svc: Services) -> ActionAnswer:
    """Stop an agent: its lease is revoked now and it gets no new task (a maintainer: in
    their repositories)."""
    return _answer(await svc.steering.pause_agent(agent_id, who, body.reason, stop=True))


@router.post("/agents/{agent_id}/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_agent(
    agent_id: AgentId, body: Action, who: Caller, svc: Services
) -> ActionAnswer:
    """Resume a paused or stopped agent (also after the circuit breaker)."""
    return _answer(await svc.steering.resume_agent(agent_id, who, body.reason))


@router.post("/repos/{owner}/{repo}/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_repo(
    owner: str, repo: str, body: Action, who: Caller, svc: Services
) -> ActionAnswer:
    """Maintenance of one repository: nothing new is handed out; leases keep running."""
    return _answer(await svc.steering.pause_repo(f"{owner}/{repo}", who, body.reason))


@router.post("/repos/{owner}/{repo}/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_repo(
    owner: str, repo: str, body: Action, who: Caller, svc: Services
) -> ActionAnswer:
    return _answer(
        await svc.steering.pause_repo(f"{owner}/{repo}", who, body.reason, resume=True)
    )


@router.post("/broker/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_broker(body: Action, who: Caller, svc: Services) -> ActionAnswer:
    """Maintenance of the whole broker: nothing new is handed out; leases keep running
    (an administrator)."""
    return _answer(await svc.steering.pause_broker(who, body.reason))


@router.post("/broker/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_broker(body: Action, who: Caller, svc: Services) -> ActionAnswer:
    return _answer(await svc.steering.pause_broker(who, body.reason, resume=True))


@router.get("/audit", response_model=list[AuditEntry], responses=ERRORS)
async def audit(
    who: Caller,
    svc: Services,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 50,
    before_ms: Annotated[
        int | None, Query(ge=0, le=2**53, description="page back: entries older than this")
    ] = None,
) -> list[AuditEntry]:
    """The audit log, newest first: every action by people and by the broker (a maintainer:
    their repositories', and their own)."""
    entries: list[AuditEntry] = await svc.store.audit_log(
        limit, before_ms, repositories=who.repositories, also_by=who.name
    )
    return entries


@router.get("/agents", response_model=list[AgentRow], responses=ERRORS)
async def agents(who: Caller, svc: Services) -> list[AgentRow]:
    """Agents that hold a task, have a failure streak or are paused (a maintainer: those
    holding a task or failing in their repositories, or paused by them)."""
    pauses = await svc.store.paused_agents()
    rows: dict[str, AgentRow] = {
        agent: AgentRow(agent_id=agent, paused=pause)
        for agent, pause in pauses.items()
        if who.repositories is None or pause.by == who.name
    }
    for name, rstore in svc.store.repos.items():
        if not who.may_act_on(name):
            continue
        for lease in await rstore.leases():
            row = rows.setdefault(lease.agent_id, AgentRow(agent_id=lease.agent_id))
            row.holds.append(f"{name}#{lease.issue}")
        for agent, streak in (await rstore.agent_streaks()).items():
            rows.setdefault(agent, AgentRow(agent_id=agent)).streaks[name] = streak
    for agent, row in rows.items():
        row.paused = pauses.get(agent)
    return sorted(rows.values(), key=lambda r: r.agent_id)
