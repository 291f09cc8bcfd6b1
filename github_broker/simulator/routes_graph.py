"""REST routes of issue relationships: dependencies (blocked by / blocking) and sub-issues.

Registered on routes.ROUTER when imported (gateway.py does). The other issue is named by its
id in bodies and paths, as on GitHub. The `blocked_by` list carries an ETag made of the
blocked issue and its links (see GraphStore.blocked_by): a conditional read after a blocker
closed answers 304, GitHub's trap for clients that cache the list.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from .messages import NotFound, Request, Response, validation_failed
from .routes import Params, paged_list, route

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)


def _n(p: Params) -> tuple[str, str, int]:
    return p["owner"], p["repo"], int(p["number"])


def _body_id(req: Request, name: str) -> Any:
    value = req.json_object().get(name)
    if value is None:
        raise validation_failed("Issue", name, "missing_field")
    if isinstance(value, bool) or not isinstance(value, int):
        raise validation_failed("Issue", name, "invalid")
    return value


@route("GET", "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by")
def list_blocked_by(svc: Services, req: Request, p: Params) -> Response:
    items, basis = svc.state.blocked_by(*_n(p), viewer=req.login, base_url=req.base_url)
    answer = paged_list(req, items)
    page = req.arg("page") or "1"
    digest = hashlib.sha256(f"{basis}:{page}:{req.arg('per_page')}".encode()).hexdigest()
    answer.headers["ETag"] = f'"{digest[:40]}"'
    return answer


@route("POST", "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by")
def add_blocked_by(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    blocker = svc.state.add_blocked_by(*_n(p), _body_id(req, "issue_id"), actor=login)
    location = f"{req.base_url}{req.path}"
    return Response(201, blocker, {"Location": location})


@route("DELETE", "/repos/{owner}/{repo}/issues/{number}/dependencies/blocked_by/{issue_id}")
def remove_blocked_by(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    if not p["issue_id"].isdigit():
        raise NotFound()
    blocker = svc.state.remove_blocked_by(*_n(p), int(p["issue_id"]), actor=login)
    return Response(200, blocker)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/dependencies/blocking")
def list_blocking(svc: Services, req: Request, p: Params) -> Response:
    return paged_list(req, svc.state.blocking(*_n(p), viewer=req.login, base_url=req.base_url))


@route("GET", "/repos/{owner}/{repo}/issues/{number}/sub_issues")
def list_sub_issues(svc: Services, req: Request, p: Params) -> Response:
    return paged_list(
        req, svc.state.sub_issues(*_n(p), viewer=req.login, base_url=req.base_url)
    )


@route("POST", "/repos/{owner}/{repo}/issues/{number}/sub_issues")
def add_sub_issue(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    replace = req.json_object().get("replace_parent") is True
    parent = svc.state.add_sub_issue(
        *_n(p), _body_id(req, "sub_issue_id"), replace_parent=replace, actor=login
    )
    return Response(201, parent, {"Location": f"{req.base_url}{req.path}"})


@route("DELETE", "/repos/{owner}/{repo}/issues/{number}/sub_issue")
def remove_sub_issue(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    parent = svc.state.remove_sub_issue(*_n(p), _body_id(req, "sub_issue_id"), actor=login)
    return Response(200, parent, {"Location": f"{req.base_url}{req.path}"})


@route("PATCH", "/repos/{owner}/{repo}/issues/{number}/sub_issues/priority")
def reprioritize_sub_issue(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    parent = svc.state.reprioritize_sub_issue(
        *_n(p),
        _body_id(req, "sub_issue_id"),
        after_id=body.get("after_id"),
        before_id=body.get("before_id"),
    )
    return Response(200, parent)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/parent")
def get_parent(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.parent_issue(*_n(p), base_url=req.base_url))
