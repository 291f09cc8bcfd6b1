"""The GitHub REST v3 surface: URL templates mapped to handlers over SimState."""

from __future__ import annotations

import logging
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlencode

from .commits import COMPARE_COMMITS
from .installations import scope_of
from .messages import ApiError, Request, Response, validation_failed

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)

Handler = Callable[["Services", Request, dict[str, str]], Response]
Params = dict[str, str]

DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
_PARAM = re.compile(r"\{(\w+)(\+?)\}")


@dataclass(frozen=True)
class Route:
    method: str
    template: str  # as reported in stats, e.g. "/repos/{owner}/{repo}/issues/{number}"
    pattern: re.Pattern[str]
    handler: Handler

    @property
    def key(self) -> str:
        return f"{self.method} {self.template}"


class Router:
    """Ordered route table; ``{name+}`` captures the rest of the path (branch names have '/')."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, template: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            parts = _PARAM.split(template)  # literal, name, plus, literal, ...
            regex = re.escape(parts[0])
            for i in range(1, len(parts), 3):
                name, greedy, literal = parts[i], parts[i + 1], parts[i + 2]
                body = r"\d+" if name == "number" else (".+" if greedy else "[^/]+")
                regex += f"(?P<{name}>{body})" + re.escape(literal)
            clean = _PARAM.sub(lambda m: "{" + m.group(1) + "}", template)
            self.routes.append(Route(method, clean, re.compile(regex), handler))
            return handler

        return register

    def match(self, method: str, path: str) -> tuple[Route | None, Params]:
        if len(path) > 1:
            path = path.rstrip("/")
        for route in self.routes:
            if route.method != method:
                continue
            found = route.pattern.fullmatch(path)
            if found:
                return route, {k: unquote(v) for k, v in found.groupdict().items()}
        return None, {}


ROUTER = Router()
route = ROUTER.add


# ----- pagination ------------------------------------------------------------------------------


def page_args(req: Request) -> tuple[int, int]:
    per_page = req.int_arg("per_page", DEFAULT_PER_PAGE)
    per_page = DEFAULT_PER_PAGE if per_page < 1 else min(per_page, MAX_PER_PAGE)
    return max(req.int_arg("page", 1), 1), per_page


def link_header(req: Request, page: int, per_page: int, total: int) -> str | None:
    """RFC 5988 links in GitHub's exact layout; PyGithub splits on ', ' and '; '."""
    last = max(math.ceil(total / per_page), 1)

    def url(number: int) -> str:
        pairs = [(k, v) for k, values in req.query.items() if k != "page" for v in values]
        return f"{req.base_url}{req.path}?{urlencode([*pairs, ('page', number)])}"

    links: list[str] = []
    if page > 1:
        links.append(f'<{url(min(page - 1, last))}>; rel="prev"')
    if page < last:
        links += [f'<{url(page + 1)}>; rel="next"', f'<{url(last)}>; rel="last"']
    if page > 1:
        links.append(f'<{url(1)}>; rel="first"')
    return ", ".join(links) or None


def paged(req: Request, items: list[Any], total: int, page: int, per_page: int) -> Response:
    response = Response(200, items)
    link = link_header(req, page, per_page, total)
    if link:
        response.headers["Link"] = link
    return response


def paged_list(req: Request, items: list[Any]) -> Response:
    page, per_page = page_args(req)
    start = (page - 1) * per_page
    return paged(req, items[start : start + per_page], len(items), page, per_page)


def _labels_from_body(req: Request) -> list[str]:
    """Label endpoints take a bare list, {"labels": [...]}, or label objects."""
    body = req.body
    if isinstance(body, dict):
        body = body.get("labels", [])
    if not isinstance(body, list):
        raise validation_failed("Label", "labels", "invalid")
    return [item["name"] if isinstance(item, dict) else str(item) for item in body]


# ----- meta ------------------------------------------------------------------------------------


@route("GET", "/")
def root(svc: Services, req: Request, p: Params) -> Response:
    base = req.base_url
    return Response(
        200,
        {
            "current_user_url": f"{base}/user",
            "rate_limit_url": f"{base}/rate_limit",
            "repository_url": f"{base}/repos/{{owner}}/{{repo}}",
            "user_url": f"{base}/users/{{user}}",
        },
    )


@route("POST", "/app/installations/{installation_id}/access_tokens")
def installation_token(svc: Services, req: Request, p: Params) -> Response:
    """A GitHub App's installation token (the gateway has verified the App's JWT), limited to
    the `repositories` and `permissions` the body names, if any (installations.py)."""
    scope = scope_of(req.body, svc.state.repo_names())
    token = "ghs_" + secrets.token_hex(18)
    if svc.tokens is not None:
        svc.tokens[token] = req.require_login()
    if scope is not None:
        svc.scopes[token] = scope
    expires = datetime.now(UTC) + timedelta(hours=1)
    granted = {"issues": "write", "pull_requests": "write", "contents": "write"}
    answer: dict[str, Any] = {
        "token": token,
        "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "permissions": (scope.permissions if scope and scope.permissions else granted),
        "repository_selection": "selected" if scope and scope.repositories else "all",
    }
    if scope is not None and scope.repositories:
        answer["repositories"] = [
            svc.state.get_repo(*name.split("/", 1), base_url=req.base_url)
            for name in svc.state.repo_names()
            if name.split("/", 1)[1].lower() in scope.repositories
        ]
    return Response(201, answer)


@route("DELETE", "/installation/token")
def revoke_installation_token(svc: Services, req: Request, p: Params) -> Response:
    """Revoke the installation token the request is made with: 204, and it is refused (401)
    from then on."""
    req.require_login()
    token = req.token or ""
    svc.scopes.pop(token, None)
    if svc.tokens is not None:
        svc.tokens.pop(token, None)
    else:
        svc.revoked.add(token)
    return Response(204, None)


@route("GET", "/user")
def current_user(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.private_user_json(req.require_login(), base_url=req.base_url))


@route("GET", "/users/{login}")
def get_user(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.user_json(p["login"], base_url=req.base_url))


@route("GET", "/rate_limit")
def rate_limit(svc: Services, req: Request, p: Params) -> Response:
    core = svc.limiter.peek(req.quota_key).as_json()
    graphql = svc.limiter.peek("graphql:" + req.quota_key).as_json()  # POST /graphql's bucket
    spare = {"limit": 30, "remaining": 30, "reset": core["reset"], "used": 0}
    return Response(
        200, {"resources": {"core": core, "search": spare, "graphql": graphql}, "rate": core}
    )


@route("GET", "/repos/{owner}/{repo}")
def get_repo(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.get_repo(p["owner"], p["repo"], base_url=req.base_url))


# ----- issues ----------------------------------------------------------------------------------


@route("GET", "/repos/{owner}/{repo}/issues")
def list_issues(svc: Services, req: Request, p: Params) -> Response:
    page, per_page = page_args(req)
    try:
        items, total = svc.state.list_issues(
            p["owner"],
            p["repo"],
            state=req.arg("state") or "open",
            labels=(req.arg("labels") or "").split(","),
            since=req.since_arg(),
            sort=req.arg("sort") or "created",
            direction=req.arg("direction") or "desc",
            creator=req.arg("creator"),
            assignee=req.arg("assignee"),
            page=page,
            per_page=per_page,
            base_url=req.base_url,
        )
    except ValueError as exc:
        raise validation_failed("Issue", "since", "invalid", str(exc)) from exc
    return paged(req, items, total, page, per_page)


@route("POST", "/repos/{owner}/{repo}/issues")
def create_issue(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    assignees = list(body.get("assignees") or [])
    if body.get("assignee"):
        assignees.append(body["assignee"])
    issue = svc.state.create_issue(
        p["owner"],
        p["repo"],
        title=body.get("title") or "",
        body=body.get("body") or "",
        labels=[lb["name"] if isinstance(lb, dict) else lb for lb in body.get("labels") or []],
        user=login,
        assignees=assignees,
        base_url=req.base_url,
    )
    if body.get("type") is not None:  # an issue type of the owner, by name (planning.py)
        svc.state.set_issue_type(p["owner"], p["repo"], issue["number"], body["type"], actor=login)
        issue = svc.state.get_issue(p["owner"], p["repo"], issue["number"], base_url=req.base_url)
    return Response(201, issue)


@route("GET", "/repos/{owner}/{repo}/issues/{number}")
def get_issue(svc: Services, req: Request, p: Params) -> Response:
    issue = svc.state.get_issue(p["owner"], p["repo"], int(p["number"]), base_url=req.base_url)
    return Response(200, issue)


@route("PATCH", "/repos/{owner}/{repo}/issues/{number}")
def update_issue(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    labels = body.get("labels")
    assignees = body.get("assignees")
    issue = svc.state.update_issue(
        p["owner"],
        p["repo"],
        int(p["number"]),
        title=body.get("title"),
        body=body.get("body"),
        state=body.get("state"),
        state_reason=body.get("state_reason"),
        labels=None if labels is None else _labels_from_body(req),
        assignees=None if assignees is None else list(assignees),
        base_url=req.base_url,
    )
    if "type" in body:  # an issue type of the owner by name, or null (planning.py)
        svc.state.set_issue_type(p["owner"], p["repo"], int(p["number"]), body["type"])
        issue = svc.state.get_issue(p["owner"], p["repo"], int(p["number"]), base_url=req.base_url)
    return Response(200, issue)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/labels")
def issue_labels(svc: Services, req: Request, p: Params) -> Response:
    issue = svc.state.get_issue(p["owner"], p["repo"], int(p["number"]), base_url=req.base_url)
    return paged_list(req, issue["labels"])


@route("POST", "/repos/{owner}/{repo}/issues/{number}/labels")
def add_issue_labels(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    labels = svc.state.add_labels(
        p["owner"],
        p["repo"],
        int(p["number"]),
        _labels_from_body(req),
        base_url=req.base_url,
        actor=req.require_login(),
    )
    return Response(200, labels)


@route("PUT", "/repos/{owner}/{repo}/issues/{number}/labels")
def set_issue_labels(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    labels = svc.state.set_labels(
        p["owner"],
        p["repo"],
        int(p["number"]),
        _labels_from_body(req),
        base_url=req.base_url,
        actor=req.require_login(),
    )
    return Response(200, labels)


@route("DELETE", "/repos/{owner}/{repo}/issues/{number}/labels")
def clear_issue_labels(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    svc.state.set_labels(p["owner"], p["repo"], int(p["number"]), [], actor=req.require_login())
    return Response(204)


@route("DELETE", "/repos/{owner}/{repo}/issues/{number}/labels/{name+}")
def remove_issue_label(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    labels = svc.state.remove_label(
        p["owner"],
        p["repo"],
        int(p["number"]),
        p["name"],
        base_url=req.base_url,
        actor=req.require_login(),
    )
    return Response(200, labels)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/events")
def issue_events(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    events = svc.state.issue_events(p["owner"], p["repo"], int(p["number"]), base_url=req.base_url)
    return paged_list(req, events)


@route("GET", "/repos/{owner}/{repo}/issues/comments")
def list_repo_issue_comments(svc: Services, req: Request, p: Params) -> Response:
    """GitHub ignores `direction` without `sort`: oldest first then."""
    sort = req.arg("sort")
    try:
        comments = svc.state.list_repo_issue_comments(
            p["owner"],
            p["repo"],
            since=req.since_arg(),
            sort=sort or "created",
            direction=(req.arg("direction") or "asc") if sort else "asc",
            base_url=req.base_url,
        )
    except ValueError as exc:
        raise validation_failed("IssueComment", "since", "invalid", str(exc)) from exc
    return paged_list(req, comments)


@route("GET", "/repos/{owner}/{repo}/issues/{number}/comments")
def list_issue_comments(svc: Services, req: Request, p: Params) -> Response:
    comments = svc.state.list_issue_comments(
        p["owner"],
        p["repo"],
        int(p["number"]),
        since=req.since_arg(),
        base_url=req.base_url,
    )
    return paged_list(req, comments)


@route("POST", "/repos/{owner}/{repo}/issues/{number}/comments")
def create_issue_comment(svc: Services, req: Request, p: Params) -> Response:
    comment = svc.state.add_issue_comment(
        p["owner"],
        p["repo"],
        int(p["number"]),
        user=req.require_login(),
        body=req.json_object().get("body") or "",
        base_url=req.base_url,
    )
    return Response(201, comment)


# ----- repository labels -----------------------------------------------------------------------


@route("GET", "/repos/{owner}/{repo}/labels")
def list_labels(svc: Services, req: Request, p: Params) -> Response:
    return paged_list(req, svc.state.list_labels(p["owner"], p["repo"], base_url=req.base_url))


@route("POST", "/repos/{owner}/{repo}/labels")
def create_label(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    label = svc.state.create_label(
        p["owner"],
        p["repo"],
        str(body.get("name") or ""),
        color=str(body.get("color") or "ededed"),
        description=str(body.get("description") or ""),
        base_url=req.base_url,
    )
    return Response(201, label, {"Location": label["url"]})


@route("GET", "/repos/{owner}/{repo}/labels/{name+}")
def get_label(svc: Services, req: Request, p: Params) -> Response:
    return Response(
        200, svc.state.get_label(p["owner"], p["repo"], p["name"], base_url=req.base_url)
    )


@route("PATCH", "/repos/{owner}/{repo}/labels/{name+}")
def update_label(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    label = svc.state.update_label(
        p["owner"],
        p["repo"],
        p["name"],
        new_name=body.get("new_name") or body.get("name"),
        color=body.get("color"),
        description=body.get("description"),
        base_url=req.base_url,
    )
    return Response(200, label)


@route("DELETE", "/repos/{owner}/{repo}/labels/{name+}")
def delete_label(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    svc.state.delete_label(p["owner"], p["repo"], p["name"])
    return Response(204)


# ----- git refs and branches -------------------------------------------------------------------


@route("GET", "/repos/{owner}/{repo}/branches")
def list_branches(svc: Services, req: Request, p: Params) -> Response:
    branches = svc.state.list_branches(p["owner"], p["repo"], base_url=req.base_url)
    return paged_list(req, branches)


@route("GET", "/repos/{owner}/{repo}/branches/{branch+}")
def get_branch(svc: Services, req: Request, p: Params) -> Response:
    return Response(
        200, svc.state.get_branch(p["owner"], p["repo"], p["branch"], base_url=req.base_url)
    )


@route("GET", "/repos/{owner}/{repo}/git/refs")
def list_refs(svc: Services, req: Request, p: Params) -> Response:
    return paged_list(req, svc.state.list_refs(p["owner"], p["repo"], base_url=req.base_url))


@route("GET", "/repos/{owner}/{repo}/git/matching-refs/{ref+}")
def matching_refs(svc: Services, req: Request, p: Params) -> Response:
    refs = svc.state.list_refs(p["owner"], p["repo"], p["ref"], base_url=req.base_url)
    return paged_list(req, refs)


@route("GET", "/repos/{owner}/{repo}/git/ref/{ref+}")
def get_ref(svc: Services, req: Request, p: Params) -> Response:
    return Response(200, svc.state.get_ref(p["owner"], p["repo"], p["ref"], base_url=req.base_url))


@route("GET", "/repos/{owner}/{repo}/git/refs/{ref+}")
def get_refs_prefix(svc: Services, req: Request, p: Params) -> Response:
    """The legacy plural form: exact ref as an object, otherwise every ref with that prefix."""
    try:
        return get_ref(svc, req, p)
    except LookupError:
        refs = svc.state.list_refs(p["owner"], p["repo"], p["ref"], base_url=req.base_url)
        if not refs:
            raise
        return Response(200, refs)


@route("POST", "/repos/{owner}/{repo}/git/refs")
def create_ref(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    if not body.get("ref") or not body.get("sha"):
        raise ApiError(422, 'Invalid request.\n\n"ref" and "sha" wasn\'t supplied.')
    ref = svc.state.create_ref(
        p["owner"],
        p["repo"],
        str(body["ref"]),
        str(body["sha"]),
        pusher=req.require_login(),
        base_url=req.base_url,
    )
    return Response(201, ref, {"Location": ref["url"]})


@route("PATCH", "/repos/{owner}/{repo}/git/refs/{ref+}")
def update_ref(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    sha = str(body.get("sha") or "")
    if not sha:
        raise ApiError(422, 'Invalid request.\n\n"sha" wasn\'t supplied.')
    ref = svc.state.update_ref(
        p["owner"],
        p["repo"],
        p["ref"],
        sha,
        force=body.get("force") is True,
        pusher=login,
        base_url=req.base_url,
    )
    return Response(200, ref)


@route("DELETE", "/repos/{owner}/{repo}/git/refs/{ref+}")
def delete_ref(svc: Services, req: Request, p: Params) -> Response:
    svc.state.delete_ref(p["owner"], p["repo"], p["ref"], pusher=req.require_login())
    return Response(204)


@route("GET", "/repos/{owner}/{repo}/compare/{basehead+}")
def compare(svc: Services, req: Request, p: Params) -> Response:
    """Without `page`/`per_page` GitHub lists the first COMPARE_COMMITS commits; with them,
    that page of the commits (and the Link header)."""
    summary, ahead = svc.state.compare(p["owner"], p["repo"], p["basehead"], base_url=req.base_url)
    if "page" not in req.query and "per_page" not in req.query:
        return Response(200, {**summary, "commits": ahead[:COMPARE_COMMITS]})
    page, per_page = page_args(req)
    start = (page - 1) * per_page
    answer = Response(200, {**summary, "commits": ahead[start : start + per_page]})
    link = link_header(req, page, per_page, len(ahead))
    if link:
        answer.headers["Link"] = link
    return answer


# ----- pull requests ---------------------------------------------------------------------------


@route("GET", "/repos/{owner}/{repo}/pulls")
def list_pulls(svc: Services, req: Request, p: Params) -> Response:
    page, per_page = page_args(req)
    items, total = svc.state.list_pulls(
        p["owner"],
        p["repo"],
        state=req.arg("state") or "open",
        head=req.arg("head"),
        base=req.arg("base"),
        sort=req.arg("sort") or "created",
        direction=req.arg("direction"),
        page=page,
        per_page=per_page,
        base_url=req.base_url,
    )
    return paged(req, items, total, page, per_page)


@route("POST", "/repos/{owner}/{repo}/pulls")
def create_pull(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    if not body.get("head") or not body.get("base"):
        raise validation_failed(
            "PullRequest", "head" if not body.get("head") else "base", "missing_field"
        )
    pull = svc.state.create_pull(
        p["owner"],
        p["repo"],
        title=body.get("title") or "",
        head=str(body["head"]),
        base=str(body["base"]),
        body=body.get("body") or "",
        user=login,
        draft=bool(body.get("draft", False)),
        base_url=req.base_url,
    )
    return Response(201, pull)


@route("GET", "/repos/{owner}/{repo}/pulls/{number}")
def get_pull(svc: Services, req: Request, p: Params) -> Response:
    pull = svc.state.get_pull(p["owner"], p["repo"], int(p["number"]), base_url=req.base_url)
    return Response(200, pull)


@route("PATCH", "/repos/{owner}/{repo}/pulls/{number}")
def update_pull(svc: Services, req: Request, p: Params) -> Response:
    req.require_login()
    body = req.json_object()
    pull = svc.state.update_pull(
        p["owner"],
        p["repo"],
        int(p["number"]),
        title=body.get("title"),
        body=body.get("body"),
        state=body.get("state"),
        base=body.get("base"),
        base_url=req.base_url,
    )
    return Response(200, pull)


@route("GET", "/repos/{owner}/{repo}/pulls/{number}/merge")
def is_merged(svc: Services, req: Request, p: Params) -> Response:
    if svc.state.is_merged(p["owner"], p["repo"], int(p["number"])):
        return Response(204)
    raise ApiError(404, "Not Found")


@route("PUT", "/repos/{owner}/{repo}/pulls/{number}/merge")
def merge_pull(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    result = svc.state.merge_pull(
        p["owner"],
        p["repo"],
        int(p["number"]),
        user=login,
        sha=body.get("sha"),
        commit_title=body.get("commit_title"),
    )
    return Response(200, result)


@route("GET", "/repos/{owner}/{repo}/pulls/{number}/reviews")
def list_reviews(svc: Services, req: Request, p: Params) -> Response:
    reviews = svc.state.list_reviews(
        p["owner"], p["repo"], int(p["number"]), viewer=req.login, base_url=req.base_url
    )
    return paged_list(req, reviews)


@route("POST", "/repos/{owner}/{repo}/pulls/{number}/reviews")
def create_review(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    review = svc.state.add_review(
        p["owner"],
        p["repo"],
        int(p["number"]),
        user=login,
        body=body.get("body") or "",
        # Without an event GitHub leaves the review PENDING.
        state=str(body.get("event") or "PENDING"),
        commit_id=body.get("commit_id"),
        base_url=req.base_url,
    )
    for comment in body.get("comments") or []:
        svc.state.add_review_comment(
            p["owner"],
            p["repo"],
            int(p["number"]),
            user=login,
            body=str(comment.get("body") or ""),
            path=str(comment.get("path") or ""),
            line=int(comment.get("line") or comment.get("position") or 1),
            review_id=review["id"],
        )
    return Response(200, review)


@route("GET", "/repos/{owner}/{repo}/pulls/{number}/comments")
def list_review_comments(svc: Services, req: Request, p: Params) -> Response:
    comments = svc.state.list_review_comments(
        p["owner"],
        p["repo"],
        int(p["number"]),
        since=req.since_arg(),
        base_url=req.base_url,
    )
    return paged_list(req, comments)


@route("POST", "/repos/{owner}/{repo}/pulls/{number}/comments")
def create_review_comment(svc: Services, req: Request, p: Params) -> Response:
    login = req.require_login()
    body = req.json_object()
    line = body.get("line") or body.get("position") or 1
    comment = svc.state.add_review_comment(
        p["owner"],
        p["repo"],
        int(p["number"]),
        user=login,
        body=body.get("body") or "",
        path=str(body.get("path") or ""),
        line=int(line),
        side=str(body.get("side") or "RIGHT"),
        commit_id=body.get("commit_id"),
        in_reply_to=body.get("in_reply_to"),
        base_url=req.base_url,
    )
    return Response(201, comment)


# ----- GraphQL (the label mutations; see graphql.py) --------------------------------------------


@route("POST", "/graphql")
def graphql_endpoint(svc: Services, req: Request, p: Params) -> Response:
    from . import graphql

    return graphql.handle(svc, req)
