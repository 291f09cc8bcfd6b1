"""The /_sim control API: stats, faults, issue edits, renames, pushes, collaborators and
device-flow approvals for tests and the sandbox driving a simulator process."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from . import webhooks
from .messages import ApiError, Response, decode_json

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)

_ISSUE_PATH = re.compile(r"/_sim/issues/(?P<owner>[^/]+)/(?P<repo>[^/]+)/(?P<number>\d+)")
_FAULT_PATH = re.compile(r"/_sim/faults/(?P<id>\d+)")
_RENAME_PATH = re.compile(r"/_sim/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/rename")
_PUSH_PATH = re.compile(r"/_sim/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/push")
_COLLABORATORS_PATH = re.compile(
    r"/_sim/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/collaborators(?:/(?P<login>[^/]+))?"
)


def handle(
    svc: Services,
    method: str,
    path: str,
    raw_body: bytes,
    base_url: str,
) -> Response:
    """Serve one control call; never counted in stats, never faulted, never rate limited."""
    try:
        return _dispatch(svc, method, path.rstrip("/"), decode_json(raw_body), base_url)
    except ApiError as exc:
        return exc.to_response()
    except (KeyError, TypeError, ValueError) as exc:
        return ApiError(400, f"Bad control request: {exc}").to_response()


def _dispatch(svc: Services, method: str, path: str, body: Any, base_url: str) -> Response:
    route = (method, path)
    if route == ("GET", "/_sim/health"):
        return Response(200, {"ok": True, "repositories": svc.state.repo_names()})
    if route == ("GET", "/_sim/stats"):
        return Response(200, svc.stats.snapshot())
    if route == ("POST", "/_sim/stats/reset"):
        svc.stats.reset()
        return Response(200, svc.stats.snapshot())
    if route == ("POST", "/_sim/rate_limit/reset"):
        svc.limiter.reset()
        return Response(200, {"ok": True})
    if path == "/_sim/faults":
        return _faults(svc, method, body)
    if route == ("POST", "/_sim/device/authorize") and svc.device is not None:
        found = _object(body)
        svc.device.authorize(
            str(found["user_code"]), str(found.get("login", "")), deny=bool(found.get("deny"))
        )
        return Response(200, {"ok": True})
    fault = _FAULT_PATH.fullmatch(path)
    if fault and method == "DELETE":
        if not svc.faults.remove(int(fault["id"])):
            raise ApiError(404, "Not Found")
        return Response(200, {"faults": svc.faults.rules()})
    if path.startswith("/_sim/webhooks") and svc.webhooks is not None:
        return webhooks.control(svc.webhooks, svc.state, method, path, body)
    if route == ("POST", "/_sim/issues"):
        return _create_issue(svc, _object(body), base_url)
    rename = _RENAME_PATH.fullmatch(path)
    if rename and method == "POST":
        # {"owner": ..., "name": ...}: the old name answers 301 from now on.
        target = _object(body)
        owner = str(target.get("owner") or rename["owner"])
        svc.state.rename_repo(rename["owner"], rename["repo"], owner, str(target["name"]))
        return Response(200, svc.state.get_repo(owner, str(target["name"]), base_url=base_url))
    push = _PUSH_PATH.fullmatch(path)
    if push and method == "POST":
        return _push(svc, push["owner"], push["repo"], _object(body))
    collaborators = _COLLABORATORS_PATH.fullmatch(path)
    if collaborators:
        return _collaborators(svc, method, collaborators, body)
    issue = _ISSUE_PATH.fullmatch(path)
    if issue:
        return _issue(
            svc, method, issue["owner"], issue["repo"], int(issue["number"]), body, base_url
        )
    raise ApiError(404, "Not Found")


def _faults(svc: Services, method: str, body: Any) -> Response:
    if method == "GET":
        return Response(200, {"faults": svc.faults.rules()})
    if method == "DELETE":
        svc.faults.clear()
        return Response(200, {"faults": []})
    if method == "POST":
        specs = body.get("faults", [body]) if isinstance(body, dict) else body
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise ApiError(400, 'Expected a fault object, a list of them, or {"faults": [...]}')
        added = [svc.faults.add(spec).to_dict() for spec in specs]
        return Response(201, {"added": added, "faults": svc.faults.rules()})
    raise ApiError(404, "Not Found")


def _create_issue(svc: Services, body: dict[str, Any], base_url: str) -> Response:
    issue = svc.state.create_issue(
        body["owner"],
        body["repo"],
        title=body["title"],
        body=body.get("body") or "",
        labels=body.get("labels") or (),
        state=body.get("state") or "open",
        created_at=body.get("created_at"),
        user=body.get("user") or "octocat",
        number=body.get("number"),
        base_url=base_url,
    )
    return Response(201, issue)


def _issue(
    svc: Services, method: str, owner: str, repo: str, number: int, body: Any, base_url: str
) -> Response:
    if method == "DELETE":
        svc.state.delete_issue(owner, repo, number)
        return Response(204)
    if method == "GET":
        return Response(200, svc.state.get_issue(owner, repo, number, base_url=base_url))
    if method != "PATCH":
        raise ApiError(404, "Not Found")
    fields = _object(body)
    if fields.get("add_labels"):
        svc.state.add_labels(owner, repo, number, fields["add_labels"])
    for label in fields.get("remove_labels") or ():
        svc.state.remove_label(owner, repo, number, label)
    issue = svc.state.update_issue(
        owner,
        repo,
        number,
        title=fields.get("title"),
        body=fields.get("body"),
        state=fields.get("state"),
        labels=fields.get("labels"),
        base_url=base_url,
    )
    return Response(200, issue)


def _push(svc: Services, owner: str, repo: str, body: dict[str, Any]) -> Response:
    """{"branch", "message"?, "author"?, "count"?, "parent"?, "base"?, "files"?, "merge"?}:
    see RefStore.push."""
    files = body.get("files")
    if files is not None and not (
        isinstance(files, dict) and all(isinstance(v, str | None) for v in files.values())
    ):
        raise ApiError(400, '"files" must map paths to contents (null deletes)')
    pushed = svc.state.push(
        owner,
        repo,
        str(body["branch"]),
        message=str(body.get("message") or "Work in progress"),
        author=str(body.get("author") or "octocat"),
        count=int(body.get("count", 1)),
        parent=body.get("parent"),
        base=body.get("base"),
        files=files,
        merge=body.get("merge"),
    )
    return Response(201, pushed)


def _collaborators(svc: Services, method: str, found: re.Match[str], body: Any) -> Response:
    """GET the list; PUT {"permission": role} on a login; DELETE a login."""
    owner, repo, login = found["owner"], found["repo"], found["login"]
    if login is None and method == "GET":
        return Response(200, {"collaborators": svc.state.collaborators(owner, repo)})
    if login is not None and method == "PUT":
        role = str(_object(body)["permission"])
        listed = svc.state.set_collaborator(owner, repo, login, role)
        return Response(200, {"collaborators": listed})
    if login is not None and method == "DELETE":
        svc.state.remove_collaborator(owner, repo, login)
        return Response(204)
    raise ApiError(404, "Not Found")


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "Expected a JSON object")
    return body
