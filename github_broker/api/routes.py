"""HTTP routes: parse, one call into a use case, answer."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from github_broker.api.caller import Caller, visible
from github_broker.api.query import refuse_unknown, unknown_parameters_response
from github_broker.api.schemas import (
    Done,
    FixAccepted,
    FixRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaseRequest,
    Readiness,
    ReleaseRequest,
    TaskRequest,
)
from github_broker.claim.rules import branch_problem
from github_broker.clock import iso_from_ms
from github_broker.errors import (
    BODY_LIMIT_RESPONSE,
    PROBLEM_JSON,
    BrokerError,
    InvalidRequest,
    LeaseError,
    NotFound,
    Problem,
)
from github_broker.leader import reviews
from github_broker.models import (
    AGENT_ID_PATTERN,
    MAX_LIST_ITEMS,
    MAX_NUMBER,
    AgentCredential,
    Outcome,
    ReviewComment,
    RoleName,
    Task,
)
from github_broker.reports import explain as explain_view
from github_broker.reports import status as status_view
from github_broker.steering.authority import require_repository

logger = logging.getLogger(__name__)
router = APIRouter(responses=BODY_LIMIT_RESPONSE)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem} for code in (401, 403, 404, 409, 413, 422, 503)
}
#: Admin reads: no body, no lease.
READ_ERRORS: dict[int | str, dict[str, Any]] = {
    code: ERRORS[code] for code in (401, 403, 404, 422, 503)
}
#: An issue number in a path: 1 .. 2^53-1 (anything else is 422 before Redis is asked).
IssueNumber = Annotated[int, Path(ge=1, le=MAX_NUMBER, description="issue number")]


async def services(request: Request) -> Any:
    # async: a plain def dependency would make FastAPI hop to its thread pool per request.
    return request.app.state.services


Services = Annotated[Any, Depends(services)]


@asynccontextmanager
async def counting_refusals(svc: Any) -> AsyncIterator[None]:
    try:
        yield
    except LeaseError as e:
        svc.metrics.lease_refusals[e.reason] += 1
        raise


@router.get("/health")
async def health() -> dict[str, str]:
    """Alive: the process answers (no dependency is checked)."""
    return {"status": "ok"}


@router.get(
    "/ready",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Redis or GitHub is not reachable."}},
)
async def ready(svc: Services) -> JSONResponse:
    """Ready: Redis answers and GitHub is reachable."""
    checks: dict[str, str] = {}
    ok = True
    try:
        await svc.store.ping()
        checks["redis"] = "ok"
    except BrokerError as e:
        # The message names no address; its cause (redis-py's, which does) goes to the log.
        ok, checks["redis"] = False, str(e)
        logger.warning("/ready: %s (%s)", e, e.__cause__ or "no detail")
    except Exception:
        ok, checks["redis"] = False, "Redis check failed; the broker logged the details"
        logger.exception("/ready: the Redis check failed")
    github_ok, why = await svc.github_reachable()
    checks["github"] = "ok" if github_ok else why
    ok = ok and github_ok
    return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)


@router.post(
    "/request-task",
    response_model=Task,
    responses={204: {"description": "No task for this agent now."}, **ERRORS},
)
async def request_task(body: TaskRequest, request: Request, svc: Services) -> Any:
    """The next task for an agent (200), or none (204); a held task is settled first."""
    # Served by api/hotpath.py, which calls the same function; this route describes it.
    content = await answer_request_task(body, request, svc)
    if content is None:
        return Response(status_code=204)
    return Response(content, media_type="application/json")


async def answer_request_task(body: TaskRequest, request: Request, svc: Any) -> bytes | None:
    """Everything `POST /request-task` does once its body is parsed: the task's JSON (200),
    or None (204)."""
    svc.auth.agent(request, body.agent_id)
    wait = min(body.wait_seconds, svc.settings.server.max_wait_s)
    task = await svc.tasks.request_task(
        body.agent_id,
        roles=body.roles,
        repositories=body.repositories,
        wait_s=wait,
        previous=body.previous,
        request_id=body.request_id,
    )
    if task is not None and body.wait_seconds > 0 and await request.is_disconnected():
        # The agent gave up waiting: it will never see this task, so don't let it hold it
        # (its next request would otherwise settle the task as completed).
        await svc.tasks.finish(
            task.repository,
            task.issue_id,
            body.agent_id,
            task.lease.token,
            Outcome.ABANDONED,
            counted=False,
        )
        logger.info(
            "%s left before its task arrived; %s#%d released",
            body.agent_id,
            task.repository,
            task.issue_id,
        )
        task = None
    svc.metrics.task_requests["none" if task is None else "task"] += 1
    if task is None:
        return None
    # Already a validated Task: serialise it once, skipping FastAPI's re-validation.
    answer: bytes = task.model_dump_json().encode()
    return answer


@router.post(
    "/tasks/{owner}/{repo}/{number}/heartbeat", response_model=HeartbeatResponse, responses=ERRORS
)
async def heartbeat(
    owner: str,
    repo: str,
    number: IssueNumber,
    body: HeartbeatRequest,
    request: Request,
    svc: Services,
) -> HeartbeatResponse:
    """Extend the lease (and the agent's current-task key)."""
    # The lease calls are served by api/hotpath.py, which calls the same answer_* functions;
    # these routes describe them (and answer when the hot path is off).
    return await answer_heartbeat(f"{owner}/{repo}", number, body, request, svc)


@router.post("/tasks/{owner}/{repo}/{number}/complete", response_model=Done, responses=ERRORS)
async def complete(
    owner: str, repo: str, number: IssueNumber, body: LeaseRequest, request: Request, svc: Services
) -> Done:
    """Report the task done; the issue moves on (development work goes to review)."""
    return await answer_complete(f"{owner}/{repo}", number, body, request, svc)


@router.post("/tasks/{owner}/{repo}/{number}/release", response_model=Done, responses=ERRORS)
async def release(
    owner: str,
    repo: str,
    number: IssueNumber,
    body: ReleaseRequest,
    request: Request,
    svc: Services,
) -> Done:
    """Give the task back (failed or abandoned); it returns to the pool at once."""
    return await answer_release(f"{owner}/{repo}", number, body, request, svc)


async def answer_heartbeat(
    repository: str, number: int, body: HeartbeatRequest, request: Request, svc: Any
) -> HeartbeatResponse:
    """Everything `POST .../heartbeat` does once its path and body are parsed."""
    svc.auth.agent(request, body.agent_id)
    usage = body.usage
    async with counting_refusals(svc):
        beat = await svc.tasks.heartbeat(
            repository,
            number,
            body.agent_id,
            body.token,
            note=(body.note or "").strip(),
            tokens=usage.tokens if usage else None,
            cost=usage.cost if usage else None,
        )
    return HeartbeatResponse(
        expires_at=iso_from_ms(beat.expires_ms),
        state=beat.state,
        notes=beat.notes,
        paused=beat.paused,
        agent_paused=beat.agent_paused,
    )


async def answer_complete(
    repository: str, number: int, body: LeaseRequest, request: Request, svc: Any
) -> Done:
    """Everything `POST .../complete` does once its path and body are parsed."""
    svc.auth.agent(request, body.agent_id)
    async with counting_refusals(svc):
        await svc.tasks.finish(repository, number, body.agent_id, body.token, Outcome.COMPLETED)
    if svc.credentials is not None:
        await svc.credentials.lease_ended(repository, number)
    return Done(status="completed")


async def answer_release(
    repository: str, number: int, body: ReleaseRequest, request: Request, svc: Any
) -> Done:
    """Everything `POST .../release` does once its path and body are parsed."""
    svc.auth.agent(request, body.agent_id)
    outcome = Outcome(body.reason)
    async with counting_refusals(svc):
        await svc.tasks.finish(repository, number, body.agent_id, body.token, outcome)
    if svc.credentials is not None:
        await svc.credentials.lease_ended(repository, number)
    return Done(status=outcome.value)


@router.post(
    "/tasks/{owner}/{repo}/{number}/credential",
    response_model=AgentCredential,
    responses={
        **ERRORS,
        404: {
            "model": Problem,
            "description": "Not served here, or this broker hands out no GitHub tokens "
            "(github.agent_credentials is off).",
        },
        503: {
            "model": Problem,
            "description": "Redis or GitHub unavailable: retry (the lease is not affected).",
        },
    },
)
async def credential(
    owner: str, repo: str, number: IssueNumber, body: LeaseRequest, request: Request, svc: Services
) -> AgentCredential:
    """A short-lived GitHub token for this lease's task: its repository alone, the
    permissions an agent needs (github.agent_permissions); the same one again while the lease
    lives, revoked when it completes or is released (else it expires within the hour)."""
    svc.auth.agent(request, body.agent_id)
    if svc.credentials is None:
        raise NotFound("this broker hands out no GitHub tokens (github.agent_credentials)")
    async with counting_refusals(svc):
        found: AgentCredential = await svc.credentials.for_lease(
            f"{owner}/{repo}", number, body.agent_id, body.token
        )
    return found


@router.post("/tasks/fix", status_code=202, response_model=FixAccepted, responses=ERRORS)
async def post_fix(body: FixRequest, who: Caller, svc: Services) -> FixAccepted:
    """Queue a fix task from feedback given here (a maintainer of the repository): handed out
    like any other task."""
    if body.repository in svc.store.repos:
        require_repository(who, body.repository)
    rstore = svc.tasks.repo(body.repository)
    if body.branch is not None:
        problem = branch_problem(body.branch, await svc.tasks.base_branch(rstore))
        if problem:
            raise InvalidRequest(f"`branch`: {problem}")
    task_id = await reviews.post_fix(
        rstore,
        svc.tasks.rules,
        issue_number=body.issue,
        pr=body.pr,
        pr_url=body.pr_url,
        branch=body.branch,
        comments=[
            ReviewComment(
                id=i,
                kind="direct",
                author=c.author,
                body=c.body,
                url=c.url,
                path=c.path,
                line=c.line,
            )
            for i, c in enumerate(body.comments, start=1)
        ],
    )
    return FixAccepted(task_id=task_id, status="queued")


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        503: {"description": "Redis unavailable (deployment gauges).", "content": PROBLEM_JSON}
    },
)
async def metrics(svc: Services) -> str:
    """Prometheus metrics: this process's counters and deployment-wide gauges."""
    return str(await svc.metrics.render(svc.store))


@router.get("/status", responses=READ_ERRORS)
async def status(who: Caller, svc: Services) -> dict[str, Any]:
    """Queues per priority, leases, skipped issues, waiting reviews, GitHub quota (a
    maintainer: their repositories)."""
    return await status_view.status(svc.store, svc.settings, who.repositories)


#: The query parameters of GET /explain.
EXPLAIN_PARAMETERS = ("agent_id", "repository", "roles")


@router.get(
    "/explain",
    responses={**READ_ERRORS, **unknown_parameters_response("/explain", EXPLAIN_PARAMETERS)},
)
async def explain(
    who: Caller,
    request: Request,
    svc: Services,
    agent_id: Annotated[
        str | None,
        Query(pattern=AGENT_ID_PATTERN, description="the agent asking; omit for a fresh agent"),
    ] = None,
    repository: Annotated[str | None, Query(description="owner/name; default: all")] = None,
    roles: Annotated[
        list[RoleName] | None,
        Query(max_length=MAX_LIST_ITEMS, description="roles the agent accepts"),
    ] = None,
) -> dict[str, Any]:
    """What the next request-task of this agent would hand out (the one `next`), and why each
    other issue waits: the claim's own judgement, run without side effects (a maintainer:
    in their repositories)."""
    refuse_unknown(request, EXPLAIN_PARAMETERS)
    # Bounded (by the query's declaration) and known, as in POST /request-task: a 422 before
    # any Redis work.
    roles = svc.tasks.check_roles(roles)
    if repository is not None and repository not in svc.store.repos:
        raise NotFound(f"repository {repository!r} is not served by this broker")
    if repository is not None:
        require_repository(who, repository)
    mine = None if who.repositories is None else visible(who, list(svc.store.repos))
    if mine == [] and repository is None:
        return {}
    verdicts = await explain_view.explain(
        svc.store,
        svc.settings,
        agent_id=agent_id,
        roles=roles,
        repositories=[repository] if repository else mine,
        share=svc.tasks.walk.share,
    )
    return {name: [v.model_dump() for v in rows] for name, rows in verdicts.items()}
