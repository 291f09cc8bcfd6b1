"""The dashboard's controls: one POST route per maintainer action of `Steering`, behind the
login and the CSRF token. A form answers with a redirect and a flash message of what really
happened (post/redirect/get); the page's script asks for JSON instead. Destructive actions
need `confirmed=1`: the script's confirm() sends it, and without JavaScript a confirmation
page asks."""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from github_broker.errors import (
    PROBLEM_JSON,
    BrokerError,
    Forbidden,
    InvalidRequest,
    NotFound,
    in_words,
)
from github_broker.models import MAX_NUMBER, ActionAnswer, Actor
from github_broker.settings import AGENT_ID_RE
from github_broker.steering.actions import MAX_TEXT, ActionResult, Steering
from github_broker.steering.authority import record_refusal
from github_broker.ui import flash, guard
from github_broker.ui.pages import render

logger = logging.getLogger(__name__)

router = APIRouter(tags=["dashboard"])
#: Longest form an action reads (bytes): a reason or a note of MAX_TEXT characters,
#: URL-encoded.
FORM_MAX = 16 * 1024
#: Pages an action may send the browser back to.
_BACK = re.compile(r"^/ui(/agents/[A-Za-z0-9][A-Za-z0-9._-]{0,49}|\?range=(1h|24h))?$")


@dataclass
class ActionForm:
    """The fields of one action's form, as sent."""

    action: str
    repository: str = ""
    issue: int = 0
    agent: str = ""
    to_agent: str = ""
    reason: str = ""
    text: str = ""
    hold: bool = False
    confirmed: bool = False
    back: str = "/ui"
    csrf: str = ""


@dataclass(frozen=True)
class Control:
    label: str
    #: What it acts on: issue | agent | repo | broker.
    scope: str
    #: Asks for confirmation first (it ends someone's work or stops everything).
    destructive: bool
    #: What it does, said on the confirmation page ({target}: the issue, agent, ...).
    says: str
    #: The fields a maintainer fills in (beyond what names the target).
    fields: tuple[str, ...]
    run: Callable[[Steering, ActionForm, Actor], Awaitable[ActionResult]]


CONTROLS: dict[str, Control] = {
    "revoke": Control(
        "Revoke",
        "issue",
        True,
        "Revoke the lease on {target}: its agent hears the reason at its next heartbeat, and "
        "the task returns to the pool (or, held, waits for a person until a retry).",
        ("reason", "hold"),
        lambda s, f, a: s.revoke(f.repository, f.issue, a, f.reason, hold=f.hold),
    ),
    "reassign": Control(
        "Reassign",
        "issue",
        True,
        "Give {target} to another agent: the current holder's lease is revoked, the branch and "
        "PR stay, and the named agent's next request gets it.",
        ("to_agent", "reason"),
        lambda s, f, a: s.reassign(f.repository, f.issue, f.to_agent, a, f.reason),
    ),
    "note": Control(
        "Note",
        "issue",
        False,
        "A note to the agent holding {target}, delivered with its next heartbeat.",
        ("text",),
        lambda s, f, a: s.note(f.repository, f.issue, a, f.text),
    ),
    "retry": Control(
        "Retry",
        "issue",
        False,
        "Give {target} another round: its budgets and hold are cleared, its tasks go back to "
        "the pool.",
        ("reason",),
        lambda s, f, a: s.retry(f.repository, f.issue, a, f.reason),
    ),
    "pause_agent": Control(
        "Pause",
        "agent",
        False,
        "Pause {target}: its current task may finish, it gets no new one.",
        ("reason",),
        lambda s, f, a: s.pause_agent(f.agent, a, f.reason),
    ),
    "stop_agent": Control(
        "Stop",
        "agent",
        True,
        "Stop {target}: its lease is revoked now and it gets no new task until resumed.",
        ("reason",),
        lambda s, f, a: s.pause_agent(f.agent, a, f.reason, stop=True),
    ),
    "resume_agent": Control(
        "Resume",
        "agent",
        False,
        "Resume {target}: it gets new tasks again (also after the circuit breaker).",
        ("reason",),
        lambda s, f, a: s.resume_agent(f.agent, a, f.reason),
    ),
    "pause_repo": Control(
        "Pause",
        "repo",
        False,
        "Pause {target} for maintenance: nothing new is handed out there; leases keep running.",
        ("reason",),
        lambda s, f, a: s.pause_repo(f.repository, a, f.reason),
    ),
    "resume_repo": Control(
        "Resume",
        "repo",
        False,
        "Resume {target}: its tasks are handed out again.",
        ("reason",),
        lambda s, f, a: s.pause_repo(f.repository, a, f.reason, resume=True),
    ),
    "pause_broker": Control(
        "Pause broker",
        "broker",
        True,
        "Pause {target}: nothing new is handed out in any repository until it is resumed; "
        "leases keep running.",
        ("reason",),
        lambda s, f, a: s.pause_broker(a, f.reason),
    ),
    "resume_broker": Control(
        "Resume broker",
        "broker",
        False,
        "Resume {target}: tasks are handed out again everywhere.",
        ("reason",),
        lambda s, f, a: s.pause_broker(a, f.reason, resume=True),
    ),
}


def target(f: ActionForm, scope: str) -> str:
    if scope == "issue":
        return f"{f.repository}#{f.issue}"
    if scope == "agent":
        return f.agent
    if scope == "repo":
        return f.repository
    return "the broker"


def read_form(action: str, fields: dict[str, list[str]]) -> ActionForm:
    def one(name: str) -> str:
        return (fields.get(name) or [""])[0].strip()

    back = one("back")
    issue = one("issue")
    return ActionForm(
        action=action,
        repository=one("repository"),
        issue=int(issue) if issue.isascii() and issue.isdigit() and len(issue) <= 16 else 0,
        agent=one("agent"),
        to_agent=one("to_agent"),
        reason=one("reason"),
        text=one("text"),
        hold=one("hold") in {"1", "on", "true"},
        confirmed=one("confirmed") == "1",
        back=back if _BACK.match(back) else "/ui",
        csrf=one("csrf"),
    )


def problem_of(f: ActionForm, control: Control) -> str | None:
    """What is missing or wrong in the form, before any Redis work; None when it can act."""
    if control.scope in ("issue", "repo") and not f.repository:
        return "which repository: the form names none"
    if control.scope == "issue" and not 1 <= f.issue <= MAX_NUMBER:
        return "which issue: the form's issue is not a number from 1"
    if control.scope == "agent" and not AGENT_ID_RE.match(f.agent):
        return "which agent: 1-50 characters from A-Z a-z 0-9 . _ -"
    if "to_agent" in control.fields and not AGENT_ID_RE.match(f.to_agent):
        return "reassign to which agent: name it (1-50 characters from A-Z a-z 0-9 . _ -)"
    if "text" in control.fields and not f.text:
        return "a note needs text"
    if len(f.reason) > MAX_TEXT or len(f.text) > MAX_TEXT:
        return f"a reason or note is at most {MAX_TEXT} characters"
    return None


def _wants_json(request: Request) -> bool:
    return "application/json" in request.headers.get("accept", "")


def _refused(request: Request, status: int, detail: str, reason: str) -> Response:
    if _wants_json(request):
        return JSONResponse({"detail": detail, "reason": reason}, status_code=status)
    return HTMLResponse(render("refused.html", message=detail), status_code=status)


def _step(
    request: Request, who: guard.Visitor, f: ActionForm, control: Control, error: str | None
) -> HTMLResponse:
    """The form of the action on a page of its own: the confirmation of a destructive action,
    or (without JavaScript) the place to fill in what the row's form left out."""
    page = render(
        "confirm.html",
        control=control,
        f=f,
        target=target(f, control.scope),
        says=control.says.format(target=target(f, control.scope)),
        error=error,
        csrf=who.csrf,
    )
    return HTMLResponse(page, status_code=422 if error else 200)


async def act(request: Request, action: str, control: Control) -> Response:
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return _refused(
            request, 415, "send the form as application/x-www-form-urlencoded", "unsupported"
        )
    body = await request.body()
    if len(body) > FORM_MAX:
        return _refused(request, 413, f"form too large (over {FORM_MAX} bytes)", "too_large")
    try:
        who = await guard.visitor(request)
    except BrokerError as e:
        return _unavailable(request, e)
    if who is None:
        if _wants_json(request):
            return JSONResponse(
                {"detail": "log in at /ui/login first", "reason": "unauthorized"}, status_code=401
            )
        return RedirectResponse("/ui/login", status_code=303)
    f = read_form(action, parse_qs(body.decode(errors="replace"), keep_blank_values=True))
    why = guard.csrf_refused(who, f.csrf)
    if why is not None:
        logger.warning("dashboard %s refused: %s", action, why)
        return _refused(request, 403, why, "forbidden")
    error = problem_of(f, control)
    if error is not None or (control.destructive and not f.confirmed):
        if _wants_json(request):
            detail = error or f"confirm first: {action} is destructive (send confirmed=1)"
            return JSONResponse({"detail": detail, "reason": "invalid_request"}, status_code=422)
        return _step(request, who, f, control, error)
    return await _run(request, control, f, who.actor)


async def _run(request: Request, control: Control, f: ActionForm, actor: Actor) -> Response:
    name = f"{control.label} {target(f, control.scope)}"
    svc = guard.services(request)
    try:
        result = await control.run(svc.steering, f, actor)
    except (NotFound, InvalidRequest, Forbidden) as e:
        if isinstance(e, Forbidden):
            repository = f.repository if control.scope in ("issue", "repo") else ""
            await record_refusal(
                svc.store, actor, f.action, str(e), repository=repository, agent=f.agent
            )
        if _wants_json(request):
            reason, status = _REFUSALS[type(e)]
            return JSONResponse({"detail": str(e), "reason": reason}, status_code=status)
        response = RedirectResponse(f.back, status_code=303)
        flash.leave(response, request, False, f"{name} refused: {e}")
        return response
    except BrokerError as e:
        return _unavailable(request, e)
    if _wants_json(request):
        answer = ActionAnswer(
            action=result.action,
            target=result.target,
            outcome=result.outcome,
            repositories=result.repositories,
        )
        return JSONResponse(answer.model_dump())
    response = RedirectResponse(f.back, status_code=303)
    flash.leave(response, request, not refused(result.outcome), f"{name}: {result.outcome}")
    return response


#: (reason, status) of an action the broker refused before doing anything.
_REFUSALS: dict[type[BrokerError], tuple[str, int]] = {
    NotFound: ("not_found", 404),
    InvalidRequest: ("invalid_request", 422),
    Forbidden: ("forbidden", 403),
}


def refused(outcome: str) -> bool:
    """Whether the broker declined the action (its outcome says so; it is still audited)."""
    return outcome.startswith(("refused", "not delivered", "nothing"))


def _unavailable(request: Request, e: BrokerError) -> Response:
    if _wants_json(request):
        return JSONResponse(
            {"detail": in_words(e), "reason": "unavailable"},
            status_code=503,
            headers={"Retry-After": "2"},
        )
    # Not the page that reloads itself: a reload of a POST's answer would GET the action.
    message = (
        f"Redis could not be reached or failed ({in_words(e)}); see the audit log "
        "for whether the action was done before trying again."
    )
    return HTMLResponse(render("refused.html", message=message), status_code=503)


HTML_OR_JSON: dict[str, Any] = {"text/html": {}, **PROBLEM_JSON}
_FIELD_DOC = {
    "csrf": "The CSRF token of the session (every dashboard form carries it).",
    "repository": "owner/name",
    "issue": "The issue number.",
    "agent": "The agent acted on.",
    "to_agent": "The agent that continues the task.",
    "reason": f"Why (at most {MAX_TEXT} characters; recorded in the audit log).",
    "text": f"The note (at most {MAX_TEXT} characters).",
    "hold": "1: hold the issue for a person instead of returning it to the pool.",
    "confirmed": "1: the maintainer confirmed a destructive action.",
    "back": "The dashboard page to go back to (/ui, /ui?range=24h or /ui/agents/{agent_id}).",
}
_SCOPE_FIELDS = {
    "issue": ("repository", "issue"),
    "agent": ("agent",),
    "repo": ("repository",),
    "broker": (),
}


def _openapi(name: str, control: Control) -> dict[str, Any]:
    fields = ("csrf", *_SCOPE_FIELDS[control.scope], *control.fields, "back")
    if control.destructive:
        fields = (*fields, "confirmed")
    required = ["csrf", *_SCOPE_FIELDS[control.scope]]
    required += [f for f in control.fields if f in ("to_agent", "text")]
    schema = {
        "type": "object",
        "properties": {
            f: {"type": "integer" if f == "issue" else "string", "description": _FIELD_DOC[f]}
            for f in fields
        },
        "required": required,
    }
    return {
        "requestBody": {
            "required": True,
            "content": {"application/x-www-form-urlencoded": {"schema": schema}},
        }
    }


#: The answers of every control's route (the OpenAPI); issue and repository controls add 404.
ACTION_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "With `Accept: application/json`: what the action really did. "
        "Otherwise a page with the action's form: the confirmation of a destructive "
        "action sent without confirmed=1.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/ActionAnswer"}},
            "text/html": {},
        },
    },
    303: {
        "description": "Done or refused: back to the page, with a flash message of the "
        "real outcome; or not logged in: go to /ui/login."
    },
    401: {"description": "Not logged in (JSON asked).", "content": PROBLEM_JSON},
    403: {
        "description": "The form's CSRF token is missing or not this session's, or (with "
        "JSON) the person may not act there (audited as refused): nothing is done.",
        "content": HTML_OR_JSON,
    },
    413: {
        "description": "Form over 16 kB (or the body over server.max_body_bytes).",
        "content": HTML_OR_JSON,
    },
    415: {"description": "Not an x-www-form-urlencoded form.", "content": HTML_OR_JSON},
    422: {
        "description": "A field is missing or wrong (the form again, saying what), or "
        "with JSON: a destructive action without confirmed=1, or refused by the broker.",
        "content": HTML_OR_JSON,
    },
    503: {"description": "Redis unavailable.", "content": HTML_OR_JSON},
}


def _responses(control: Control) -> dict[int | str, dict[str, Any]]:
    answers = copy.deepcopy(ACTION_ANSWERS)
    if control.scope in ("issue", "repo"):
        answers[404] = {
            "description": "With JSON: the repository is not served or the issue is not open.",
            "content": PROBLEM_JSON,
        }
    return answers


def _endpoint(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return await act(request, action, CONTROLS[action])

    return endpoint


for _name, _control in CONTROLS.items():
    router.add_api_route(
        f"/ui/actions/{_name}",
        _endpoint(_name),
        methods=["POST"],
        name=f"ui_{_name}",
        summary=f"{_control.label} ({_control.scope}) from the dashboard",
        description=_control.says.format(target=f"the {_control.scope}")
        + " Recorded in the audit log as the person signed in.",
        response_class=HTMLResponse,
        responses=_responses(_control),
        openapi_extra=_openapi(_name, _control),
    )
