"""REST routes of checks: check runs and suites, commit statuses and the combined status,
branch protection, Actions runs and their approval (state in checks.py).

Registered on routes.ROUTER when imported (gateway.py does).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .messages import NotFound, Request, Response
from .routes import ROUTER, Params, paged_list, route

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)


def _before_branch_routes() -> None:
    """`branches/{branch+}` (a branch name may hold '/') would take `.../protection`: the
    protection routes, registered last, are tried first, as GitHub resolves it."""
    ours = [r for r in ROUTER.routes if r.template.endswith("/branches/{branch}/protection")]
    rest = [r for r in ROUTER.routes if r not in ours]
    ROUTER.routes[:] = ours + rest


def _id(p: Params, name: str) -> int:
    if not p[name].isdigit():
        raise NotFound()
    return int(p[name])


@route("POST", "/repos/{owner}/{repo}/check-runs")
def create_check_run(svc: Services, req: Request, p: Params) -> Response:
    run = svc.state.create_check_run(
        p["owner"], p["repo"], req.json_object(), app=req.require_login(), base_url=req.base_url
    )
    return Response(201, run)


@route("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}")
def get_check_run(svc: Services, req: Request, p: Params) -> Response:
    run = svc.state.get_check_run(
        p["owner"], p["repo"], _id(p, "check_run_id"), base_url=req.base_url
    )
    return Response(200, run)


@route("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}")
def update_check_run(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    run = svc.state.update_check_run(
        p["owner"], p["repo"], _id(p, "check_run_id"), req.json_object(), base_url=req.base_url
    )
    return Response(200, run)


@route("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}/annotations")
def check_run_annotations(svc: Services, req: Request, p: Params) -> Response:
    notes = svc.state.check_run_annotations(
        p["owner"], p["repo"], _id(p, "check_run_id"), base_url=req.base_url
    )
    return paged_list(req, notes)


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/check-runs")
def check_runs_for_ref(svc: Services, req: Request, p: Params) -> Response:
    runs = svc.state.check_runs_for_ref(
        p["owner"],
        p["repo"],
        p["ref"],
        check_name=req.arg("check_name"),
        status=req.arg("status"),
        latest=req.arg("filter", "latest") != "all",
        base_url=req.base_url,
    )
    page = paged_list(req, runs)
    return Response(200, {"total_count": len(runs), "check_runs": page.body}, page.headers)


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/check-suites")
def check_suites_for_ref(svc: Services, req: Request, p: Params) -> Response:
    suites = svc.state.check_suites_for_ref(p["owner"], p["repo"], p["ref"], base_url=req.base_url)
    page = paged_list(req, suites)
    return Response(200, {"total_count": len(suites), "check_suites": page.body}, page.headers)


@route("POST", "/repos/{owner}/{repo}/statuses/{sha}")
def create_status(svc: Services, req: Request, p: Params) -> Response:
    created = svc.state.create_status(
        p["owner"],
        p["repo"],
        p["sha"],
        req.json_object(),
        creator=req.require_login(),
        base_url=req.base_url,
    )
    return Response(201, created)


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/status")
def combined_status(svc: Services, req: Request, p: Params) -> Response:
    combined = svc.state.combined_status(p["owner"], p["repo"], p["ref"], base_url=req.base_url)
    return Response(200, combined)


@route("GET", "/repos/{owner}/{repo}/commits/{ref}/statuses")
def statuses_for_ref(svc: Services, req: Request, p: Params) -> Response:
    return paged_list(
        req, svc.state.statuses_for_ref(p["owner"], p["repo"], p["ref"], base_url=req.base_url)
    )


@route("GET", "/repos/{owner}/{repo}/branches/{branch+}/protection")
def get_protection(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    rule = svc.state.get_protection(p["owner"], p["repo"], p["branch"], base_url=req.base_url)
    return Response(200, rule)


@route("PUT", "/repos/{owner}/{repo}/branches/{branch+}/protection")
def set_protection(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    rule = svc.state.set_protection(
        p["owner"], p["repo"], p["branch"], req.json_object(), base_url=req.base_url
    )
    return Response(200, rule)


@route("DELETE", "/repos/{owner}/{repo}/branches/{branch+}/protection")
def delete_protection(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    svc.state.delete_protection(p["owner"], p["repo"], p["branch"])
    return Response(204)


_before_branch_routes()


@route("GET", "/repos/{owner}/{repo}/actions/runs")
def workflow_runs(svc: Services, req: Request, p: Params) -> Response:
    runs = svc.state.workflow_runs(
        p["owner"],
        p["repo"],
        head_sha=req.arg("head_sha"),
        status=req.arg("status"),
        base_url=req.base_url,
    )
    page = paged_list(req, runs)
    return Response(200, {"total_count": len(runs), "workflow_runs": page.body}, page.headers)


@route("POST", "/repos/{owner}/{repo}/actions/runs/{run_id}/approve")
def approve_workflow_run(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    svc.state.approve_workflow_run(p["owner"], p["repo"], _id(p, "run_id"), login=login)
    return Response(201, {})
