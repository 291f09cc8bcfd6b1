"""GitHub's GraphQL queries about pull requests and their checks (graphql.py hands query
documents here).

Implemented: `query` documents (named or not, with variables) whose root selects
`repository(owner:, name:)` and `rateLimit` (its `cost` by GitHub's rule: one request per
connection times the page sizes of the connections around it, over 100, at least 1); inside
a repository `pullRequest(number:)`, `pullRequests(states:, headRefName:, baseRefName:,
first:|last:)`, `ref(qualifiedName:)` with its `target` and `associatedPullRequests(states:)`
(the pull requests whose head it is), and `issue(number:)` with `closedByPullRequestsReferences
(includeClosedPrs:)` (the pull requests whose body closes it: the progress read);
a pull request's head and base, `mergeable` and `mergeStateStatus` (UNKNOWN for a moment
after a push, as the REST answer's null), its files, its last commit's `statusCheckRollup`
(check runs with annotations and `isRequired`, status contexts) and `checkSuites` (with
the workflow run of an Actions suite). Aliases, inline fragments (`... on CheckRun`) and
`__typename` work as on GitHub; connections need `first` or `last` (at most 100). A field
GitHub does not have is refused before anything runs (`errors` only); a pull request or
repository that does not exist nulls its field with a NOT_FOUND error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import commits
from .checks import ACTIONS_APP
from .graphql import GraphQLError, _Var
from .graphql import Parser as MutationParser
from .messages import ApiError, Response
from .model import Record, Repo
from .state import closed_by

if TYPE_CHECKING:
    from .gateway import Services
    from .state import SimState

logger = logging.getLogger(__name__)

#: Most nodes a connection hands out per page (GitHub's limit).
MAX_PAGE = 100
#: REST `mergeable_state` -> GraphQL `mergeStateStatus`.
MERGE_STATES = {
    "dirty": "DIRTY",
    "blocked": "BLOCKED",
    "behind": "BEHIND",
    "unstable": "UNSTABLE",
    "clean": "CLEAN",
    "draft": "DRAFT",
    "unknown": "UNKNOWN",
}
_FAILING_CONCLUSIONS = {"failure", "timed_out", "cancelled", "action_required", "startup_failure"}


class QueryError(GraphQLError):
    """A document GitHub refuses before running anything."""

    def __init__(self, message: str, code: str = "undefinedField") -> None:
        super().__init__(message, code)


class Missing(Exception):
    """An object the query names that does not exist: its field is null, with an error."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def handle(svc: Services, query: str, variables: dict[str, Any]) -> Response:
    try:
        fields = Parser(query).document()
    except GraphQLError as e:
        return _errors(str(e), e.code or "parseError")
    state = svc.state
    data: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    try:
        with state.lock:
            root = _query_root(state, points(fields, variables))
            for f in fields:
                data[f.alias] = _resolve(root, f, variables, [f.alias], errors)
    except QueryError as e:
        return _errors(str(e), e.code or "undefinedField")
    body: dict[str, Any] = {"data": data}
    if errors:
        body["errors"] = errors
    return Response(200, body)


def _errors(message: str, code: str) -> Response:
    error = {"message": message, "locations": [{"line": 1, "column": 1}], "extensions": {}}
    error["extensions"] = {"code": code}
    return Response(200, {"errors": [error]})


# ----- execution ------------------------------------------------------------------------------

#: An object: its GraphQL type name and a resolver per field (args -> value).
Resolver = Callable[[dict[str, Any]], Any]


@dataclass
class Obj:
    typename: str
    fields: dict[str, Resolver]


def _resolve(
    node: Obj, f: Field, variables: dict[str, Any], path: list[Any], errors: list[dict[str, Any]]
) -> Any:
    if f.name == "__typename":
        return node.typename
    resolver = node.fields.get(f.name)
    if resolver is None:
        raise QueryError(f"Field '{f.name}' doesn't exist on type '{node.typename}'")
    args = {k: _value(v, variables) for k, v in f.args.items()}
    try:
        value = resolver(args)
    except Missing as e:
        errors.append(
            {
                "type": "NOT_FOUND",
                "path": path,
                "locations": [{"line": 1, "column": 1}],
                "message": e.message,
            }
        )
        return None
    return _shape(value, f, variables, path, errors)


def _shape(
    value: Any, f: Field, variables: dict[str, Any], path: list[Any], errors: list[dict[str, Any]]
) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_shape(v, f, variables, [*path, i], errors) for i, v in enumerate(value)]
    if not isinstance(value, Obj):
        if f.selection:
            raise QueryError(f"Selections can't be made on scalars (field '{f.name}')")
        return value
    if not f.selection:
        raise QueryError(f"Field must have selections (field '{f.name}' returns {value.typename})")
    out: dict[str, Any] = {}
    for sub in _selected(value, f.selection):
        out[sub.alias] = _resolve(value, sub, variables, [*path, sub.alias], errors)
    return out


def _selected(node: Obj, selection: list[Field | Fragment]) -> list[Field]:
    """The fields of `selection` that apply to `node` (inline fragments on its type)."""
    out: list[Field] = []
    for item in selection:
        if isinstance(item, Fragment):
            if item.on in (node.typename, "Node", "StatusCheckRollupContext"):
                out += _selected(node, item.selection)
        else:
            out.append(item)
    return out


def _value(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, _Var):
        return variables.get(value.name)
    if isinstance(value, list):
        return [_value(v, variables) for v in value]
    return value


def _page(items: list[Any], args: dict[str, Any], name: str, typename: str) -> Obj:
    first, last = args.get("first"), args.get("last")
    if first is None and last is None:
        raise QueryError(
            f"You must provide a `first` or `last` value to properly paginate the `{name}` "
            "connection.",
            "missingRequiredArguments",
        )
    for limit_name, limit in (("first", first), ("last", last)):
        if limit is not None and int(limit) > MAX_PAGE:
            raise QueryError(
                f"Requesting {limit} records on the `{name}` connection exceeds the "
                f"`{limit_name}` limit of {MAX_PAGE} records.",
                "argumentLimit",
            )
    shown = items[: int(first)] if first is not None else items
    if last is not None:
        shown = shown[-int(last) :] if int(last) else []
    more = len(shown) < len(items)
    return Obj(
        typename,
        {
            "totalCount": lambda _: len(items),
            "nodes": lambda _: shown,
            "pageInfo": lambda _: Obj(
                "PageInfo",
                {
                    "hasNextPage": lambda _: more and first is not None,
                    "hasPreviousPage": lambda _: more and last is not None,
                    "endCursor": lambda _: None,
                    "startCursor": lambda _: None,
                },
            ),
        },
    )


# ----- the types ------------------------------------------------------------------------------


def points(fields: Sequence[Field | Fragment], variables: dict[str, Any], around: int = 1) -> int:
    """GitHub's rate-limit cost of a query: each connection counts one request per node of
    the connections around it (their `first` or `last`); the sum over 100, rounded, and at
    least 1 (docs.github.com, "Rate limits and node limits for the GraphQL API")."""
    return max(1, round(_requests(fields, variables, around) / 100))


def _requests(fields: Sequence[Field | Fragment], variables: dict[str, Any], around: int) -> int:
    total = 0
    for f in fields:
        inner = around
        if isinstance(f, Field):
            size = _value(f.args.get("first", f.args.get("last")), variables)
            if isinstance(size, int):
                total += around
                inner = around * size
        total += _requests(f.selection, variables, inner)
    return total


def _query_root(state: SimState, cost: int) -> Obj:
    return Obj(
        "Query",
        {
            "repository": lambda a: _repository(state, str(a.get("owner")), str(a.get("name"))),
            "rateLimit": lambda _: Obj(
                "RateLimit",
                {
                    "cost": lambda _: cost,
                    "limit": lambda _: 5000,
                    "remaining": lambda _: 5000 - cost,
                },
            ),
        },
    )


def _repository(state: SimState, owner: str, name: str) -> Obj:
    try:
        r = state.repo(owner, name)
    except ApiError as e:
        raise Missing(f"Could not resolve to a Repository with the name '{owner}/{name}'.") from e
    return Obj(
        "Repository",
        {
            "name": lambda _: r.name,
            "nameWithOwner": lambda _: r.full_name,
            "pullRequest": lambda a: _pull_by_number(state, r, int(a.get("number") or 0)),
            "pullRequests": lambda a: _pull_list(state, r, a),
            "ref": lambda a: _ref(state, r, str(a.get("qualifiedName") or "")),
            "issue": lambda a: _issue(state, r, int(a.get("number") or 0)),
        },
    )


def _issue(state: SimState, repo: Repo, number: int) -> Obj:
    rec = repo.issues.get(number)
    if rec is None or rec["pull"] is not None:
        raise Missing(f"Could not resolve to an Issue with the number of {number}.")

    def closing(args: dict[str, Any]) -> Obj:
        wanted = {"OPEN", "CLOSED", "MERGED"} if args.get("includeClosedPrs") else {"OPEN"}
        found = [
            _pull(state, repo, pull)
            for n in sorted(repo.pulls)
            if (pull := repo.issues.get(n)) is not None
            and _pull_state(pull) in wanted
            and number in closed_by(pull["body"])
        ]
        return _page(found, args, "closedByPullRequestsReferences", "PullRequestConnection")

    return Obj(
        "Issue",
        {
            "number": lambda _: number,
            "id": lambda _: rec["node_id"],
            "closedByPullRequestsReferences": closing,
        },
    )


def _pull_by_number(state: SimState, repo: Repo, number: int) -> Obj:
    rec = repo.issues.get(number)
    if rec is None or rec["pull"] is None:
        raise Missing(f"Could not resolve to a PullRequest with the number of {number}.")
    return _pull(state, repo, rec)


def _pull_list(state: SimState, repo: Repo, args: dict[str, Any]) -> Obj:
    wanted = args.get("states") or ["OPEN", "CLOSED", "MERGED"]
    # GraphQL coerces a single value to a list.
    states = {str(s).upper() for s in ([wanted] if isinstance(wanted, str) else wanted)}
    out = []
    for n in sorted(repo.pulls):
        rec = repo.issues.get(n)
        if rec is None:
            continue
        pr = rec["pull"]
        if _pull_state(rec) not in states:
            continue
        if args.get("headRefName") not in (None, pr["head"]):
            continue
        if args.get("baseRefName") not in (None, pr["base"]):
            continue
        out.append(_pull(state, repo, rec))
    return _page(out, args, "pullRequests", "PullRequestConnection")


def _pull_state(rec: Record) -> str:
    if rec["pull"]["merged"]:
        return "MERGED"
    return "OPEN" if rec["state"] == "open" else "CLOSED"


def _pull(state: SimState, repo: Repo, rec: Record) -> Obj:
    pr = rec["pull"]
    seen: dict[str, Any] = {}
    state.pull_read(repo, rec, seen)
    mergeable = seen.get("mergeable")
    merge_state = MERGE_STATES[seen.get("mergeable_state", "unknown")]
    files = state.pull_files(repo, rec)
    number = rec["number"]
    base_tip = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
    return Obj(
        "PullRequest",
        {
            "id": lambda _: pr["node_id"],
            "number": lambda _: number,
            "title": lambda _: rec["title"],
            "body": lambda _: rec["body"] or "",
            "url": lambda _: f"{state.ctx(None).html(repo)}/pull/{number}",
            "state": lambda _: _pull_state(rec),
            "merged": lambda _: pr["merged"],
            "isDraft": lambda _: pr["draft"],
            "createdAt": lambda _: rec["created_at"],
            "updatedAt": lambda _: rec["updated_at"],
            "author": lambda _: Obj("User", {"login": lambda _: rec["user"]}),
            "headRefName": lambda _: pr["head"],
            "headRefOid": lambda _: pr["head_sha"],
            "baseRefName": lambda _: pr["base"],
            "baseRefOid": lambda _: base_tip,
            "mergeable": lambda _: (
                "UNKNOWN" if mergeable is None else ("MERGEABLE" if mergeable else "CONFLICTING")
            ),
            "mergeStateStatus": lambda _: merge_state,
            "additions": lambda _: sum(f[1] for f in files),
            "deletions": lambda _: sum(f[2] for f in files),
            "changedFiles": lambda _: len(files),
            "files": lambda a: _page(
                [_file(*f) for f in files], a, "files", "PullRequestChangedFileConnection"
            ),
            "commits": lambda a: _page(
                [
                    Obj(
                        "PullRequestCommit",
                        {"commit": lambda _: _commit(state, repo, pr["head_sha"], rec)},
                    )
                ],
                a,
                "commits",
                "PullRequestCommitConnection",
            ),
        },
    )


def _file(path: str, additions: int, deletions: int, kind: str) -> Obj:
    return Obj(
        "PullRequestChangedFile",
        {
            "path": lambda _: path,
            "additions": lambda _: additions,
            "deletions": lambda _: deletions,
            "changeType": lambda _: kind,
        },
    )


def _ref(state: SimState, repo: Repo, name: str) -> Obj | None:
    full = name if name.startswith("refs/") else f"refs/heads/{name}"
    sha = repo.refs.get(full)
    if sha is None:
        return None  # GitHub answers null for a ref that does not exist
    branch = full.removeprefix("refs/heads/")

    def associated(args: dict[str, Any]) -> Obj:
        wanted = args.get("states") or ["OPEN", "CLOSED", "MERGED"]
        states = {str(s).upper() for s in ([wanted] if isinstance(wanted, str) else wanted)}
        found = [
            _pull(state, repo, pull)
            for n in sorted(repo.pulls)
            if (pull := repo.issues.get(n)) is not None
            and pull["pull"]["head"] == branch
            and _pull_state(pull) in states
        ]
        return _page(found, args, "associatedPullRequests", "PullRequestConnection")

    return Obj(
        "Ref",
        {
            "name": lambda _: full.rsplit("/", 1)[-1],
            "prefix": lambda _: full.rsplit("/", 1)[0] + "/",
            "target": lambda _: _commit(state, repo, sha, None),
            "associatedPullRequests": associated,
        },
    )


def _commit(state: SimState, repo: Repo, sha: str, pull: Record | None) -> Obj:
    return Obj(
        "Commit",
        {
            "oid": lambda _: sha,
            "message": lambda _: commits.get(repo, sha)["message"],
            "statusCheckRollup": lambda _: _rollup(state, repo, sha, pull),
            "checkSuites": lambda a: _page(
                [_suite(state, repo, s) for s in state.suites_at(repo, sha)],
                a,
                "checkSuites",
                "CheckSuiteConnection",
            ),
        },
    )


def _rollup(state: SimState, repo: Repo, sha: str, pull: Record | None) -> Obj | None:
    runs = state.runs_at(repo, sha)
    statuses = state.latest_statuses(repo, sha)
    if not runs and not statuses:
        return None
    required = set(state.required_contexts(repo, pull["pull"]["base"])) if pull else set()
    contexts = [_check_run(state, repo, run, pull, required) for run in runs]
    contexts += [_status_context(rec, pull, required) for rec in statuses]
    return Obj(
        "StatusCheckRollup",
        {
            "state": lambda _: _rollup_state(runs, statuses),
            "contexts": lambda a: _page(
                contexts, a, "contexts", "StatusCheckRollupContextConnection"
            ),
        },
    )


def _rollup_state(runs: list[Record], statuses: list[Record]) -> str:
    if any(s["state"] == "error" for s in statuses):
        return "ERROR"
    if any(r["conclusion"] in _FAILING_CONCLUSIONS for r in runs) or any(
        s["state"] == "failure" for s in statuses
    ):
        return "FAILURE"
    if any(r["status"] != "completed" for r in runs) or any(
        s["state"] == "pending" for s in statuses
    ):
        return "PENDING"
    return "SUCCESS"


def _is_required(pull: Record | None, required: set[str], name: str) -> Resolver:
    def resolve(args: dict[str, Any]) -> bool:
        if args.get("pullRequestNumber") is None and args.get("pullRequestId") is None:
            raise QueryError(
                "isRequired needs pullRequestNumber or pullRequestId", "missingRequiredArguments"
            )
        if pull is None:
            return False
        asked = args.get("pullRequestNumber")
        if asked is not None and int(asked) != pull["number"]:
            return False
        return name in required

    return resolve


def _check_run(
    state: SimState, repo: Repo, run: Record, pull: Record | None, required: set[str]
) -> Obj:
    out = run["output"]
    suite = state.checks_of(repo).suites[run["suite_id"]]
    return Obj(
        "CheckRun",
        {
            "id": lambda _: f"CR_{run['id']}",
            "databaseId": lambda _: run["id"],
            "name": lambda _: run["name"],
            "status": lambda _: run["status"].upper(),
            "conclusion": lambda _: run["conclusion"].upper() if run["conclusion"] else None,
            "detailsUrl": lambda _: (
                run["details_url"] or f"{state.ctx(None).html(repo)}/runs/{run['id']}"
            ),
            "startedAt": lambda _: run["started_at"],
            "completedAt": lambda _: run["completed_at"],
            "title": lambda _: out.get("title"),
            "summary": lambda _: out.get("summary"),
            "text": lambda _: out.get("text"),
            "isRequired": _is_required(pull, required, run["name"]),
            "annotations": lambda a: _page(
                [_annotation(item) for item in out.get("annotations") or []],
                a,
                "annotations",
                "CheckAnnotationConnection",
            ),
            "checkSuite": lambda _: _suite(state, repo, suite),
        },
    )


def _annotation(item: Record) -> Obj:
    def position(line: int, column: Any) -> Obj:
        return Obj("CheckAnnotationPosition", {"line": lambda _: line, "column": lambda _: column})

    start = int(item["start_line"])
    end = int(item.get("end_line") or start)
    return Obj(
        "CheckAnnotation",
        {
            "path": lambda _: item["path"],
            "message": lambda _: item["message"],
            "title": lambda _: item.get("title"),
            "rawDetails": lambda _: item.get("raw_details"),
            "annotationLevel": lambda _: str(item.get("annotation_level", "failure")).upper(),
            "location": lambda _: Obj(
                "CheckAnnotationSpan",
                {
                    "start": lambda _: position(start, item.get("start_column")),
                    "end": lambda _: position(end, item.get("end_column")),
                },
            ),
        },
    )


def _status_context(rec: Record, pull: Record | None, required: set[str]) -> Obj:
    return Obj(
        "StatusContext",
        {
            "id": lambda _: f"SC_{rec['id']}",
            "context": lambda _: rec["context"],
            "state": lambda _: rec["state"].upper(),
            "description": lambda _: rec["description"],
            "targetUrl": lambda _: rec["target_url"],
            "createdAt": lambda _: rec["created_at"],
            "isRequired": _is_required(pull, required, rec["context"]),
        },
    )


def _suite(state: SimState, repo: Repo, suite: Record) -> Obj:
    runs = state.checks_of(repo).workflow_runs.values()
    wf = next((w for w in runs if w["suite_id"] == suite["id"]), None)
    html = state.ctx(None).html(repo)
    workflow_run = (
        Obj(
            "WorkflowRun",
            {
                "databaseId": lambda _: wf["id"],
                "url": lambda _: f"{html}/actions/runs/{wf['id']}",
                "event": lambda _: "pull_request",
                "workflow": lambda _: Obj("Workflow", {"name": lambda _: wf["name"]}),
            },
        )
        if wf is not None and suite["app"] == ACTIONS_APP
        else None
    )
    app = suite["app"].removesuffix("[bot]")
    return Obj(
        "CheckSuite",
        {
            "databaseId": lambda _: suite["id"],
            "status": lambda _: suite["status"].upper(),
            "conclusion": lambda _: suite["conclusion"].upper() if suite["conclusion"] else None,
            "app": lambda _: Obj("App", {"slug": lambda _: app, "name": lambda _: app}),
            "workflowRun": lambda _: workflow_run,
            "url": lambda _: f"{html}/commit/{suite['head_sha']}/checks",
        },
    )


# ----- parsing --------------------------------------------------------------------------------


@dataclass
class Field:
    alias: str
    name: str
    args: dict[str, Any]
    selection: list[Field | Fragment]


@dataclass
class Fragment:
    on: str
    selection: list[Field | Fragment]


class Parser(MutationParser):
    """graphql.py's tokens and types, with query documents, inline fragments and numbers."""

    def document(self) -> list[Field]:
        if self._peek() == "query":
            self._next()
            if self._peek() not in ("{", "("):
                self._next()  # operation name
            if self._peek() == "(":
                self._variables()
        selection = self._query_set()
        if self._peek() is not None:
            raise QueryError(f'Parse error on "{self._peek()}": one operation per document')
        fields = [f for f in selection if isinstance(f, Field)]
        if len(fields) != len(selection):
            raise QueryError("Fragments on the root are not supported by this simulator")
        return fields

    def _variables(self) -> None:
        self._expect("(")
        while self._peek() != ")":
            self._expect("$")
            self._next()
            self._expect(":")
            self._type()
            if self._peek() == "=":
                self._next()
                self._literal()
        self._next()

    def _query_set(self) -> list[Field | Fragment]:
        self._expect("{")
        out: list[Field | Fragment] = []
        while self._peek() != "}":
            if self._peek() == "...":
                self._next()
                self._expect("on")
                out.append(Fragment(self._next(), self._query_set()))
                continue
            name = self._next()
            alias = name
            if self._peek() == ":":
                self._next()
                name = self._next()
            args: dict[str, Any] = {}
            if self._peek() == "(":
                self._next()
                while self._peek() != ")":
                    arg = self._next()
                    self._expect(":")
                    args[arg] = self._literal()
                self._next()
            sub = self._query_set() if self._peek() == "{" else []
            out.append(Field(alias, name, args, sub))
        self._next()
        if not out:
            raise QueryError('Parse error on "}" (RCURLY)', "parseError")
        return out

    def _literal(self) -> Any:
        tok = self._peek() or ""
        if re.fullmatch(r"-?\d+", tok):
            self._next()
            return int(tok)
        return super()._literal()
