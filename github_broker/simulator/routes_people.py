"""REST routes about people: a collaborator's permission, the caller's repositories, and
reactions on issue comments.

Registered on routes.ROUTER when imported (gateway.py does).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .messages import NotFound, Request, Response
from .routes import Params, paged_list, route

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)


def _comment_id(p: Params) -> int:
    if not p["comment_id"].isdigit():
        raise NotFound()
    return int(p["comment_id"])


@route("GET", "/repos/{owner}/{repo}/collaborators/{username}/permission")
def collaborator_permission(svc: Services, req: Request, p: Params) -> Response:
    """Only for callers with push access: an anonymous one is asked to authenticate."""
    answer = svc.state.permission(
        p["owner"], p["repo"], p["username"], viewer=req.require_login(), base_url=req.base_url
    )
    return Response(200, answer)


@route("GET", "/user/repos")
def user_repositories(svc: Services, req: Request, p: Params) -> Response:
    """The caller's repositories (owned or as a collaborator) with their permissions, by full
    name, 30 a page unless per_page says otherwise."""
    return paged_list(req, svc.state.user_repositories(req.require_login(), base_url=req.base_url))


@route("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}")
def get_issue_comment(svc: Services, req: Request, p: Params) -> Response:
    comment = svc.state.get_issue_comment(
        p["owner"], p["repo"], _comment_id(p), base_url=req.base_url
    )
    return Response(200, comment)


@route("GET", "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions")
def list_comment_reactions(svc: Services, req: Request, p: Params) -> Response:
    reactions = svc.state.list_reactions(
        p["owner"],
        p["repo"],
        _comment_id(p),
        content=req.arg("content"),
        base_url=req.base_url,
    )
    return paged_list(req, reactions)


@route("POST", "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions")
def create_comment_reaction(svc: Services, req: Request, p: Params) -> Response:
    """201 with a new reaction; 200 with the one `user` already gave, as GitHub answers."""
    login = req.require_login()
    reaction, created = svc.state.add_reaction(
        p["owner"],
        p["repo"],
        _comment_id(p),
        user=login,
        content=req.json_object().get("content"),
        base_url=req.base_url,
    )
    return Response(201 if created else 200, reaction)
