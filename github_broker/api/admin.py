"""Maintainers' admin API (admin token): steer running work, read the audit log and agents."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field

from github_broker.api.routes import ERRORS, IssueNumber, Services
from github_broker.api.schemas import AGENT_ID_PATTERN
from github_broker.errors import BODY_LIMIT_RESPONSE
from github_broker.models import ActionAnswer, Actor, AgentPause, AuditEntry
from github_broker.steering.actions import MAX_TEXT, ActionResult, BudgetRaise

router = APIRouter(prefix="/admin", tags=["admin"], responses=BODY_LIMIT_RESPONSE)
#: Who an action through the admin API is recorded as.
API_ACTOR = Actor.admin("admin")
#: Most audit entries one page returns.
MAX_AUDIT_PAGE = 500

AgentId = Annotated[str, Path(pattern=AGENT_ID_PATTERN, description="agent id")]
Text = Annotated[str, Field(max_length=MAX_TEXT)]


class Action(BaseModel):
    """Why (recorded in the audit log; a revoke's reason is told to the agent)."""

    reason: Text = ""


class Revoke(Action):
    hold: bool = Field(
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


def _steering(request: Request, svc: Any) -> Any:
    svc.auth.admin(request)
    return svc.steering


@router.post("/tasks/{owner}/{repo}/{number}/revoke", response_model=ActionAnswer, responses=ERRORS)
async def revoke(
    owner: str, repo: str, number: IssueNumber, body: Revoke, request: Request, svc: Services
) -> ActionAnswer:
    """End the lease now; the agent hears the reason at its next heartbeat (409 revoked)."""
    steering = _steering(request, svc)
    return _answer(
        await steering.revoke(f"{owner}/{repo}", number, API_ACTOR, body.reason, hold=body.hold)
    )


@router.post(
    "/tasks/{owner}/{repo}/{number}/reassign", response_model=ActionAnswer, responses=ERRORS
)
async def reassign(
    owner: str, repo: str, number: IssueNumber, body: Reassign, request: Request, svc: Services
) -> ActionAnswer:
    """Give the task to another agent (its next request-task); the branch and PR stay."""
    steering = _steering(request, svc)
    return _answer(
        await steering.reassign(f"{owner}/{repo}", number, body.agent_id, API_ACTOR, body.reason)
    )


@router.post("/tasks/{owner}/{repo}/{number}/note", response_model=ActionAnswer, responses=ERRORS)
async def note(
    owner: str, repo: str, number: IssueNumber, body: NoteBody, request: Request, svc: Services
) -> ActionAnswer:
    """A message to the agent holding the task, delivered with its next heartbeat."""
    steering = _steering(request, svc)
    return _answer(await steering.note(f"{owner}/{repo}", number, API_ACTOR, body.text))


@router.post("/tasks/{owner}/{repo}/{number}/retry", response_model=ActionAnswer, responses=ERRORS)
async def retry(
    owner: str, repo: str, number: IssueNumber, body: Retry, request: Request, svc: Services
) -> ActionAnswer:
    """Another round for an issue the broker gave up on: failures cleared, usage counted again
    from now (or its budget raised), tasks back, agents it was revoked from let back."""
    steering = _steering(request, svc)
    raised = None
    if body.budget_tokens is not None or body.budget_cost is not None:
        raised = BudgetRaise(body.budget_tokens, body.budget_cost)
    return _answer(
        await steering.retry(
            f"{owner}/{repo}", number, API_ACTOR, body.reason, raise_budget=raised
        )
    )


@router.post("/agents/{agent_id}/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_agent(
    agent_id: AgentId, body: Action, request: Request, svc: Services
) -> ActionAnswer:
    """Drain an agent: its current task may finish, it gets no new one."""
    return _answer(await _steering(request, svc).pause_agent(agent_id, API_ACTOR, body.reason))


@router.post("/agents/{agent_id}/stop", response_model=ActionAnswer, responses=ERRORS)
async def stop_agent(
    agent_id: AgentId, body: Action, request: Request, svc: Services
) -> ActionAnswer:
    """Stop an agent: its lease is revoked now and it gets no new task."""
    steering = _steering(request, svc)
    return _answer(await steering.pause_agent(agent_id, API_ACTOR, body.reason, stop=True))


@router.post("/agents/{agent_id}/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_agent(
    agent_id: AgentId, body: Action, request: Request, svc: Services
) -> ActionAnswer:
    """Resume a paused or stopped agent (also after the circuit breaker)."""
    return _answer(await _steering(request, svc).resume_agent(agent_id, API_ACTOR, body.reason))


@router.post("/repos/{owner}/{repo}/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_repo(
    owner: str, repo: str, body: Action, request: Request, svc: Services
) -> ActionAnswer:
    """Maintenance of one repository: nothing new is handed out; leases keep running."""
    steering = _steering(request, svc)
    return _answer(await steering.pause_repo(f"{owner}/{repo}", API_ACTOR, body.reason))


@router.post("/repos/{owner}/{repo}/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_repo(
    owner: str, repo: str, body: Action, request: Request, svc: Services
) -> ActionAnswer:
    steering = _steering(request, svc)
    return _answer(
        await steering.pause_repo(f"{owner}/{repo}", API_ACTOR, body.reason, resume=True)
    )


@router.post("/broker/pause", response_model=ActionAnswer, responses=ERRORS)
async def pause_broker(body: Action, request: Request, svc: Services) -> ActionAnswer:
    """Maintenance of the whole broker: nothing new is handed out; leases keep running."""
    return _answer(await _steering(request, svc).pause_broker(API_ACTOR, body.reason))


@router.post("/broker/resume", response_model=ActionAnswer, responses=ERRORS)
async def resume_broker(body: Action, request: Request, svc: Services) -> ActionAnswer:
    steering = _steering(request, svc)
    return _answer(await steering.pause_broker(API_ACTOR, body.reason, resume=True))


@router.get("/audit", response_model=list[AuditEntry], responses=ERRORS)
async def audit(
    request: Request,
    svc: Services,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 50,
    before_ms: Annotated[
        int | None, Query(ge=0, le=2**53, description="page back: entries older than this")
    ] = None,
) -> list[AuditEntry]:
    """The audit log, newest first: every action by maintainers and by the broker."""
    svc.auth.admin(request)
    entries: list[AuditEntry] = await svc.store.audit_log(limit, before_ms)
    return entries


@router.get("/agents", response_model=list[AgentRow], responses=ERRORS)
async def agents(request: Request, svc: Services) -> list[AgentRow]:
    """Agents that hold a task, have a failure streak or are paused."""
    svc.auth.admin(request)
    rows: dict[str, AgentRow] = {
        agent: AgentRow(agent_id=agent, paused=pause)
        for agent, pause in (await svc.store.paused_agents()).items()
    }
    for name, rstore in svc.store.repos.items():
        for lease in await rstore.leases():
            row = rows.setdefault(lease.agent_id, AgentRow(agent_id=lease.agent_id))
            row.holds.append(f"{name}#{lease.issue}")
        for agent, streak in (await rstore.agent_streaks()).items():
            rows.setdefault(agent, AgentRow(agent_id=agent)).streaks[name] = streak
    return sorted(rows.values(), key=lambda r: r.agent_id)
