"""REST routes of an organization's planning data: issue types, issue fields and an issue's
field values (simulator/planning.py). Registered on routes.ROUTER when imported."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .messages import NotFound, Request, Response, validation_failed
from .routes import Params, paged_list, route

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)


@route("GET", "/orgs/{org}/issue-types")
def list_issue_types(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.issue_types(p["org"]))


@route("POST", "/orgs/{org}/issue-types")
def create_issue_type(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    made = svc.state.create_issue_type(
        p["org"], str(body.get("name") or ""), description=body.get("description"),
        color=body.get("color"),
    )
    return Response(200, made)


@route("GET", "/repos/{owner}/{repo}/issue-types")
def list_repo_issue_types(svc: Services, req: Request, p: Params) -> Response:
    svc.state.get_repo(p["owner"], p["repo"])
    return Response(200, svc.state.issue_types(p["owner"]))


@route("GET", "/orgs/{org}/issue-fields")
def list_issue_fields(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.issue_fields(p["org"]))


@route("POST", "/orgs/{org}/issue-fields")
def create_issue_field(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    made = svc.state.create_issue_field(
        p["org"], str(body.get("name") or ""), str(body.get("data_type") or ""),
        options=body.get("options"), description=body.get("description"),
    )
    return Response(200, made)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/issue-field-values")
def list_field_values(svc: Services, req: Request, p: Params) -> Response:
    values = svc.state.field_values(p["owner"], p["repo"], int(p["number"]))
    return paged_list(req, values)


def _set_values(svc: Services, req: Request, p: Params, replace: bool) -> Response:
    login = req.require_login()
    values = req.json_object().get("issue_field_values")
    if not isinstance(values, list):
        raise validation_failed("IssueFieldValue", "issue_field_values", "missing_field")
    answer = svc.state.set_field_values(
        p["owner"], p["repo"], int(p["number"]), values, replace=replace, actor=login
    )
    return Response(200, answer)


@route("POST", "/repos/{owner}/{repo}/issues/{number}/issue-field-values")
def add_field_values(svc: Services, req: Request, p: Params) -> Response:
    return _set_values(svc, req, p, replace=False)


@route("PUT", "/repos/{owner}/{repo}/issues/{number}/issue-field-values")
def set_field_values(svc: Services, req: Request, p: Params) -> Response:
    return _set_values(svc, req, p, replace=True)


@route("DELETE", "/repos/{owner}/{repo}/issues/{number}/issue-field-values/{field_id}")
def remove_field_value(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    if not p["field_id"].isdigit():
        raise NotFound()
    svc.state.remove_field_value(
        p["owner"], p["repo"], int(p["number"]), int(p["field_id"]), actor=login
    )
    return Response(204)
