"""GitHub's GraphQL endpoint, reduced to the label mutations the broker sends; queries go to
graphql_query.py (pull requests and their checks) and graphql_queries.py (issues and their
relationships).

`POST /graphql` takes ``{"query": ..., "variables": ...}``. Implemented: mutation documents
whose root fields are ``addLabelsToLabelable`` and ``removeLabelsFromLabelable`` (aliases
allowed, run in order like GitHub's serial mutations), with ``input`` given inline or as a
variable, selecting ``clientMutationId`` and ``labelable { __typename }``.
Answers have GitHub's shapes: a document that does not validate gets only ``errors``
(nothing runs); an id that resolves to nothing nulls that field with a ``NOT_FOUND`` error
while the other fields still run. Removing a label the issue does not carry is a silent
no-op, as on GitHub. Charged to the ``graphql`` rate-limit bucket (see gateway.py).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from .messages import ApiError, NotFound, Request, Response

if TYPE_CHECKING:
    from .gateway import Services

logger = logging.getLogger(__name__)
#: A query about pull requests, their refs and checks (graphql_query.py); any other query is
#: about issues and their relationships (graphql_queries.py).
_PULL_QUERY = re.compile(r"\b(?:pullRequests?|ref|rateLimit)\s*[({]")

#: The route key the pipeline charges to the graphql bucket.
ROUTE_KEY = "POST /graphql"
MUTATIONS = {
    "addLabelsToLabelable": "AddLabelsToLabelableInput",
    "removeLabelsFromLabelable": "RemoveLabelsFromLabelableInput",
}
_TOKEN = re.compile(
    r'\s+|#[^\n]*|,|(?P<str>"(?:[^"\\]|\\.)*")|(?P<num>-?\d+(?:\.\d+)?)'
    r"|(?P<name>[_A-Za-z][_0-9A-Za-z]*)|(?P<punct>\.\.\.|[!$():=@\[\]{}|])"
)


class GraphQLError(Exception):
    """A document GitHub would refuse before running anything."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def handle(svc: Services, req: Request) -> Response:
    if req.login is None:
        raise ApiError(401, "This endpoint requires you to be authenticated.")
    body = req.json_object()
    query = body.get("query")
    variables = body.get("variables") or {}
    if not isinstance(query, str) or not isinstance(variables, dict):
        return _errors("A query attribute must be specified and must be a string.")
    if not query.lstrip().startswith("mutation"):
        if _PULL_QUERY.search(query):
            from . import graphql_query  # pull requests and their checks

            return graphql_query.handle(svc, query, variables)
        from .graphql_queries import handle_query  # queries over issues and their links

        return handle_query(svc, req, query, variables)
    try:
        fields = Parser(query).mutation()
        calls = [_resolve_call(f, variables) for f in fields]
    except GraphQLError as e:
        return _errors(str(e), e.code)
    data: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for alias, name, node_id, label_ids, mutation_id, selection in calls:
        try:
            data[alias] = _run(
                svc, name, node_id, label_ids, mutation_id, selection, actor=req.login
            )
        except _Unresolved as e:
            data[alias] = None
            errors.append(
                {
                    "type": "NOT_FOUND",
                    "path": [alias],
                    "locations": [{"line": 1, "column": 1}],
                    "message": f"Could not resolve to a node with the global id of '{e.node_id}'.",
                }
            )
    payload: dict[str, Any] = {"data": data}
    if errors:
        payload["errors"] = errors
    return Response(200, payload)


def _errors(message: str, code: str | None = None) -> Response:
    error: dict[str, Any] = {"message": message, "locations": [{"line": 1, "column": 1}]}
    if code:
        error["extensions"] = {"code": code}
    return Response(200, {"errors": [error]})


# ----- execution ----------------------------------------------------------------------------


class _Unresolved(Exception):
    def __init__(self, node_id: str) -> None:
        super().__init__(node_id)
        self.node_id = node_id


Call = tuple[str, str, str, list[str], Any, list[tuple[str, str, Any]]]


def _resolve_call(field: _Field, variables: dict[str, Any]) -> Call:
    if field.name not in MUTATIONS:
        raise GraphQLError(
            f"Field '{field.name}' doesn't exist on type 'Mutation'", "undefinedField"
        )
    input_type = MUTATIONS[field.name]
    value = _value(field.args.get("input"), variables)
    if not isinstance(value, dict):
        raise GraphQLError(
            f"Field '{field.name}' is missing required arguments: input",
            "missingRequiredArguments",
        )
    for attr, kind in (("labelableId", "ID!"), ("labelIds", "[ID!]!")):
        if value.get(attr) is None:
            raise GraphQLError(
                f"Argument '{attr}' on InputObject '{input_type}' is required. "
                f"Expected type {kind}",
                "missingRequiredInputObjectAttribute",
            )
    labels = value["labelIds"]
    if isinstance(labels, str):
        labels = [labels]  # GraphQL coerces a single value to a list
    if not isinstance(value["labelableId"], str) or not all(isinstance(x, str) for x in labels):
        raise GraphQLError(
            f"Argument 'input' on Field '{field.name}' has an invalid value.",
            "argumentLiteralsIncompatible",
        )
    for _, name, sub in field.selection:
        if name not in ("clientMutationId", "labelable"):
            payload = input_type.removesuffix("Input") + "Payload"
            raise GraphQLError(
                f"Field '{name}' doesn't exist on type '{payload}'", "undefinedField"
            )
        for _, inner, _ in sub:
            # Labelable is an interface: Issue's own fields need a fragment (not simulated).
            if inner != "__typename":
                raise GraphQLError(
                    f"Field '{inner}' doesn't exist on type 'Labelable'", "undefinedField"
                )
    return (
        field.alias,
        field.name,
        value["labelableId"],
        list(labels),
        value.get("clientMutationId"),
        field.selection,
    )


def _run(
    svc: Services,
    name: str,
    node_id: str,
    label_ids: list[str],
    mutation_id: Any,
    selection: list[tuple[str, str, Any]],
    *,
    actor: str,
) -> dict[str, Any]:
    state = svc.state
    with state.lock:
        owner, repo_name, number, kind = _labelable(svc, node_id)
        repo = state.repo(owner, repo_name)
        by_id = {f"LA_{rec['id']}": rec["name"] for rec in repo.labels.values()}
        names = []
        for label_id in label_ids:
            if label_id not in by_id:
                raise _Unresolved(label_id)
            names.append(by_id[label_id])
        if name == "addLabelsToLabelable":
            state.add_labels(owner, repo_name, number, names, actor=actor)
        else:
            for label in names:
                try:
                    state.remove_label(owner, repo_name, number, label, actor=actor)
                except NotFound:
                    pass
                except ApiError as e:
                    if e.status != 404:
                        raise
    out: dict[str, Any] = {}
    for alias, field, sub in selection:
        if field == "clientMutationId":
            out[alias] = mutation_id
        else:
            out[alias] = {a: kind for a, _, _ in sub}
    return out


def _labelable(svc: Services, node_id: str) -> tuple[str, str, int, str]:
    """(owner, repo, number, type) of an issue or pull request node id."""
    state = svc.state
    for full_name in state.repo_names():
        owner, _, name = full_name.partition("/")
        repo = state.repo(owner, name)
        m = re.fullmatch(r"I_(\d+)_(\d+)", node_id)
        if m and int(m.group(1)) == repo.id:
            rec = repo.issues.get(int(m.group(2)))
            if rec is not None and rec.get("node_id") == node_id:
                return owner, name, rec["number"], "Issue"
        elif node_id.startswith("PR_"):
            for number, rec in repo.issues.items():
                if rec.get("node_id") == node_id:
                    return owner, name, number, "PullRequest" if rec.get("pull") else "Issue"
    raise _Unresolved(node_id)


def _value(value: Any, variables: dict[str, Any]) -> Any:
    if isinstance(value, _Var):
        return variables.get(value.name)
    if isinstance(value, list):
        return [_value(v, variables) for v in value]
    if isinstance(value, dict):
        return {k: _value(v, variables) for k, v in value.items()}
    return value


# ----- parsing (the operation subset above) -------------------------------------------------


class _Var:
    def __init__(self, name: str) -> None:
        self.name = name


class _Field:
    def __init__(
        self, alias: str, name: str, args: dict[str, Any], selection: list[tuple[str, str, Any]]
    ) -> None:
        self.alias, self.name, self.args, self.selection = alias, name, args, selection


class Parser:
    """Tokens and literals of a GraphQL document (graphql_queries.py parses queries on it)."""

    def __init__(self, text: str) -> None:
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise GraphQLError(f'Parse error on "{text[pos]}" at [1, {pos + 1}]')
            if m.lastgroup:
                self.tokens.append(m.group(m.lastgroup))
            pos = m.end()
        self.i = 0

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _next(self) -> str:
        tok = self._peek()
        if tok is None:
            raise GraphQLError("Parse error on end of input")
        self.i += 1
        return tok

    def _expect(self, tok: str) -> None:
        got = self._next()
        if got != tok:
            raise GraphQLError(f'Parse error on "{got}"; expected "{tok}"')

    def mutation(self) -> list[_Field]:
        head = self._next()
        if head != "mutation":
            raise GraphQLError(
                "This simulator implements mutation documents only (addLabelsToLabelable, "
                "removeLabelsFromLabelable)",
                "undefinedField",
            )
        if self._peek() not in ("{", "(", None):
            self._next()  # operation name
        if self._peek() == "(":
            self._next()
            while self._peek() != ")":
                self._expect("$")
                self._next()
                self._expect(":")
                self._type()
                if self._peek() == "=":
                    self._next()
                    self._literal()
            self._next()
        fields = self._selection_set(root=True)
        if self._peek() is not None:
            raise GraphQLError(f'Parse error on "{self._peek()}": one operation per document')
        return fields

    def _type(self) -> None:
        if self._peek() == "[":
            self._next()
            self._type()
            self._expect("]")
        else:
            self._next()
        if self._peek() == "!":
            self._next()

    def field_head(self) -> tuple[str, str, dict[str, Any]]:
        """A field's alias, name and arguments (its selection set follows when `{` comes)."""
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
        return alias, name, args

    def _selection_set(self, root: bool = False) -> list[Any]:
        self._expect("{")
        out: list[Any] = []
        while self._peek() != "}":
            alias, name, args = self.field_head()
            sub = self._selection_set() if self._peek() == "{" else []
            out.append(_Field(alias, name, args, sub) if root else (alias, name, sub))
        self._next()
        if not out:
            raise GraphQLError('Parse error on "}" (RCURLY)')
        return out

    def _literal(self) -> Any:
        tok = self._next()
        if tok == "$":
            return _Var(self._next())
        if tok == "[":
            items = []
            while self._peek() != "]":
                items.append(self._literal())
            self._next()
            return items
        if tok == "{":
            obj = {}
            while self._peek() != "}":
                key = self._next()
                self._expect(":")
                obj[key] = self._literal()
            self._next()
            return obj
        if tok.startswith('"'):
            return re.sub(r"\\(.)", r"\1", tok[1:-1])
        if tok in ("true", "false"):
            return tok == "true"
        if tok == "null":
            return None
        return tok
