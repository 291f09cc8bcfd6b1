"""GitHub's GraphQL queries over issues and their relationships, as far as the broker asks.

`POST /graphql` with a `query` document (graphql.py hands those here): one operation, no
fragments; root field `repository(owner:, name:)`, its `issue(number:)` (aliases allowed: the
broker reads many issues in one request) and on an issue `number`, `id`, `databaseId`,
`title`, `state`, `stateReason(enableDuplicate:)`, `createdAt`, `updatedAt`, `closedAt`,
`url`, `repository { nameWithOwner }`, `parent`, `issueType`, `issueDependenciesSummary`,
`subIssuesSummary` and the connections `blockedBy`, `blocking`, `subIssues` (`first`/`last`
required and at most 100, `after`; `totalCount`, `nodes`, `pageInfo`). A field the schema
lacks refuses the whole document before anything runs (`undefinedField`); a repository or
issue that does not resolve nulls its field with a `NOT_FOUND` error while the rest still
runs; issues the viewer may not read are left out of a connection's `nodes` but counted in
its `totalCount`. Charged like the mutations (one request, the `graphql` bucket).
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import graphql
from .graph import Node, node_of
from .graphql import GraphQLError
from .graphql import _Var as Var
from .messages import NotFound, Request, Response
from .model import Repo

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)

#: Most nodes one connection returns (GitHub's `first`/`last` limit).
MAX_PAGE = 100
_SCALARS = {"String", "Int", "Boolean", "ID", "DateTime", "URI", "IssueState", "IssueStateReason"}
#: type -> field -> (its type, its arguments). `[T]` is a list of T.
SCHEMA: dict[str, dict[str, tuple[str, frozenset[str]]]] = {
    "Query": {"repository": ("Repository", frozenset({"owner", "name"}))},
    "Repository": {
        "id": ("ID", frozenset()),
        "databaseId": ("Int", frozenset()),
        "nameWithOwner": ("String", frozenset()),
        "issue": ("Issue", frozenset({"number"})),
    },
    "Issue": {
        **{name: (kind, frozenset()) for name, kind in (
            ("id", "ID"), ("databaseId", "Int"), ("number", "Int"), ("title", "String"),
            ("state", "IssueState"), ("createdAt", "DateTime"), ("updatedAt", "DateTime"),
            ("closedAt", "DateTime"), ("url", "URI"), ("repository", "Repository"),
            ("parent", "Issue"), ("issueType", "IssueType"),
            ("issueDependenciesSummary", "IssueDependenciesSummary"),
            ("subIssuesSummary", "SubIssuesSummary"),
        )},
        "stateReason": ("IssueStateReason", frozenset({"enableDuplicate"})),
        **{name: ("IssueConnection", frozenset({"first", "last", "after", "before"}))
           for name in ("blockedBy", "blocking", "subIssues")},
    },
    "IssueConnection": {
        "totalCount": ("Int", frozenset()),
        "nodes": ("[Issue]", frozenset()),
        "pageInfo": ("PageInfo", frozenset()),
    },
    "PageInfo": {name: ("String", frozenset()) for name in (
        "hasNextPage", "hasPreviousPage", "startCursor", "endCursor")},
    "IssueDependenciesSummary": {name: ("Int", frozenset()) for name in (
        "blockedBy", "totalBlockedBy", "blocking", "totalBlocking")},
    "SubIssuesSummary": {name: ("Int", frozenset()) for name in (
        "total", "completed", "percentCompleted")},
    "IssueType": {name: ("String", frozenset()) for name in (
        "id", "name", "description", "color")},
}


@dataclass
class Field:
    alias: str
    name: str
    args: dict[str, Any]
    selection: list[Field] = field(default_factory=list)


def handle_query(svc: Services, req: Request, query: str, variables: dict[str, Any]) -> Response:
    """Run one query document; GitHub's answer shapes (see the module docstring)."""
    try:
        fields = _Parser(query).document()
        _validate("Query", fields, [])
    except GraphQLError as e:
        error: dict[str, Any] = {"message": str(e), "locations": [{"line": 1, "column": 1}]}
        if e.code:
            error["extensions"] = {"code": e.code}
        return Response(200, {"errors": [error]})
    run = _Run(svc, req.login, variables)
    with svc.state.lock:
        data = {f.alias: run.repository(f, [f.alias]) for f in fields}
    payload: dict[str, Any] = {"data": data}
    if run.errors:
        payload["errors"] = run.errors
    return Response(200, payload)


def _validate(type_name: str, fields: list[Field], path: list[str]) -> None:
    for f in fields:
        if f.name == "__typename":
            continue
        spec = SCHEMA[type_name].get(f.name)
        if spec is None:
            raise GraphQLError(
                f"Field '{f.name}' doesn't exist on type '{type_name}'", "undefinedField"
            )
        kind, allowed = spec
        for arg in f.args:
            if arg not in allowed:
                raise GraphQLError(
                    f"Field '{f.name}' doesn't accept argument '{arg}'", "argumentNotAccepted"
                )
        inner = kind.strip("[]")
        if inner in _SCALARS and f.selection:
            raise GraphQLError(f"Selections can't be made on scalars (field '{f.name}')",
                               "selectionMismatch")
        if inner not in _SCALARS:
            if not f.selection:
                raise GraphQLError(
                    f"Field must have selections (field '{f.name}' returns {inner} but has no "
                    "selections)", "selectionMismatch")
            _validate(inner, f.selection, [*path, f.alias])


class _Run:
    """One execution: resolves fields over the simulator's records, gathering errors."""

    def __init__(self, svc: Services, viewer: str | None, variables: dict[str, Any]) -> None:
        self.state = svc.state
        self.viewer = viewer
        self.variables = variables
        self.errors: list[dict[str, Any]] = []

    def arg(self, f: Field, name: str, default: Any = None) -> Any:
        value = f.args.get(name, default)
        return self.variables.get(value.name, default) if isinstance(value, Var) else value

    def fail(self, path: list[Any], kind: str, message: str) -> None:
        self.errors.append({"type": kind, "path": path, "locations": [{"line": 1, "column": 1}],
                            "message": message})

    def repository(self, f: Field, path: list[Any]) -> dict[str, Any] | None:
        owner, name = str(self.arg(f, "owner", "")), str(self.arg(f, "name", ""))
        try:
            repo = self.state.repo(owner, name)
        except NotFound:
            self.fail(path, "NOT_FOUND",
                      f"Could not resolve to a Repository with the name '{owner}/{name}'.")
            return None
        return self.repo_object(repo, f.selection, path)

    def repo_object(self, repo: Repo, fields: list[Field], path: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields:
            where = [*path, f.alias]
            if f.name == "issue":
                out[f.alias] = self.issue(repo, f, where)
            else:
                out[f.alias] = {
                    "__typename": "Repository", "id": f"R_{repo.id}", "databaseId": repo.id,
                    "nameWithOwner": repo.full_name,
                }[f.name]
        return out

    def issue(self, repo: Repo, f: Field, path: list[Any]) -> dict[str, Any] | None:
        number = self.arg(f, "number")
        rec = repo.issues.get(number) if isinstance(number, int) else None
        if rec is None or rec["pull"] is not None:
            self.fail(path, "NOT_FOUND",
                      f"Could not resolve to an Issue with the number of {number}.")
            return None
        return self.issue_object(node_of(repo, rec), f.selection, path)

    def issue_object(self, node: Node, fields: list[Field], path: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields:
            out[f.alias] = self.issue_field(node, f, [*path, f.alias])
        return out

    def issue_field(self, node: Node, f: Field, path: list[Any]) -> Any:
        rec, name = node.rec, f.name
        if name in ("blockedBy", "blocking", "subIssues"):
            linked = {"blockedBy": node.blockers, "blocking": node.blocking,
                      "subIssues": node.subs}[name]
            return self.connection(linked, f, path)
        if name == "parent":
            up = node.parent if node.parent is not None and node.parent.alive else None
            return self.issue_object(up, f.selection, path) if up is not None else None
        if name == "repository":
            return self.repo_object(node.repo, f.selection, path)
        if name == "stateReason":
            return _state_reason(rec.get("state_reason"), bool(self.arg(f, "enableDuplicate")))
        if name in ("issueDependenciesSummary", "subIssuesSummary", "issueType"):
            return _summary(node, name, f.selection)
        return _issue_scalar(node, name)

    def connection(self, linked: list[Node], f: Field, path: list[Any]) -> dict[str, Any] | None:
        first, last = self.arg(f, "first"), self.arg(f, "last")
        if first is None and last is None:
            self.fail(path, "MISSING_PAGINATION_BOUNDARIES",
                      f"You must provide a `first` or `last` value to properly paginate the "
                      f"`{f.name}` connection.")
            return None
        size = first if first is not None else last
        if not isinstance(size, int) or size > MAX_PAGE or size < 0:
            self.fail(path, "EXCESSIVE_PAGINATION",
                      f"Requesting {size} records on the `{f.name}` connection exceeds the "
                      f"`{'first' if first is not None else 'last'}` limit of {MAX_PAGE} records.")
            return None
        alive = [n for n in linked if n.alive]
        start = _cursor_index(self.arg(f, "after")) + 1 if self.arg(f, "after") else 0
        window = alive[start:start + size] if first is not None else alive[-size:]
        offset = start if first is not None else max(0, len(alive) - size)
        shown = [n for n in window if self.state.visible(n, self.viewer)]
        out: dict[str, Any] = {}
        for sub in f.selection:
            if sub.name == "totalCount":
                out[sub.alias] = len(alive)
            elif sub.name == "nodes":
                out[sub.alias] = [self.issue_object(n, sub.selection, [*path, sub.alias])
                                  for n in shown]
            elif sub.name == "pageInfo":
                end = offset + len(window) - 1
                info = {"hasNextPage": end + 1 < len(alive), "hasPreviousPage": offset > 0,
                        "startCursor": _cursor(offset) if window else None,
                        "endCursor": _cursor(end) if window else None}
                out[sub.alias] = {s.alias: info[s.name] for s in sub.selection}
            else:
                out[sub.alias] = "IssueConnection"
        return out


def _issue_scalar(node: Node, name: str) -> Any:
    rec, repo = node.rec, node.repo
    return {
        "__typename": "Issue",
        "id": rec["node_id"],
        "databaseId": rec["id"],
        "number": rec["number"],
        "title": rec["title"],
        "state": rec["state"].upper(),
        "createdAt": rec["created_at"],
        "updatedAt": rec["updated_at"],
        "closedAt": rec["closed_at"],
        "url": f"https://github.com/{repo.full_name}/issues/{rec['number']}",
    }[name]


def _summary(node: Node, name: str, fields: list[Field]) -> dict[str, Any] | None:
    def alive(nodes: list[Node]) -> list[Node]:
        return [n for n in nodes if n.alive]

    def opened(nodes: list[Node]) -> int:
        return sum(1 for n in alive(nodes) if n.rec["state"] == "open")

    if name == "issueType":
        kind = node.rec.get("type")
        if kind is None:
            return None
        values = {"__typename": "IssueType", "id": kind["node_id"], "name": kind["name"],
                  "description": kind["description"], "color": (kind["color"] or "").upper()}
    elif name == "issueDependenciesSummary":
        values = {"blockedBy": opened(node.blockers), "totalBlockedBy": len(alive(node.blockers)),
                  "blocking": opened(node.blocking), "totalBlocking": len(alive(node.blocking))}
    else:
        subs = alive(node.subs)
        done = sum(1 for n in subs if n.rec["state"] == "closed")
        values = {"total": len(subs), "completed": done,
                  "percentCompleted": done * 100 // len(subs) if subs else 0}
    return {f.alias: values.get(f.name, name) for f in fields}


def _state_reason(reason: str | None, duplicate: bool) -> str | None:
    if reason is None:
        return None
    if reason == "duplicate" and not duplicate:
        return "NOT_PLANNED"
    return reason.upper()


def _cursor(index: int) -> str:
    return base64.b64encode(f"cursor:{index}".encode()).decode()


def _cursor_index(cursor: Any) -> int:
    try:
        return int(base64.b64decode(str(cursor)).decode().split(":", 1)[1])
    except (ValueError, IndexError) as e:
        raise GraphQLError(f"`{cursor}` does not appear to be a valid cursor.") from e


class _Parser(graphql.Parser):
    """One query operation (see the module docstring); GraphQLError names what is wrong. The
    tokens, names and literals are graphql.py's; fields keep their arguments at any depth."""

    def document(self) -> list[Field]:
        if self._peek() == "query":
            self._next()
            if self._peek() not in ("{", "("):
                self._next()  # operation name
            if self._peek() == "(":
                while self._next() != ")":
                    pass  # variable definitions: values come by name
        elif self._peek() != "{":
            raise GraphQLError(f'Parse error on "{self._peek()}": one query operation expected')
        fields = self._fields()
        if self._peek() is not None:
            raise GraphQLError(f'Parse error on "{self._peek()}": one operation per document')
        return fields

    def _fields(self) -> list[Field]:
        self._expect("{")
        out: list[Field] = []
        while self._peek() != "}":
            if self._peek() == "...":
                raise GraphQLError("Fragments are not simulated", "undefinedField")
            alias, name, args = self.field_head()
            out.append(Field(alias, name, args, self._fields() if self._peek() == "{" else []))
        self._next()
        if not out:
            raise GraphQLError('Parse error on "}" (RCURLY)')
        return out

    def _literal(self) -> Any:
        token = self._peek()
        if token is not None and re.fullmatch(r"-?\d+", token):
            return int(self._next())
        return super()._literal()
