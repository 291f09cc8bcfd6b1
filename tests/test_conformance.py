"""Every answer the simulator gives the gateway conforms to GitHub's published REST description.

The broker's gateway is driven against the simulator as the broker drives it (reads, conditional
reads, writes and their refusals); each answer is then checked against the operation's responses
in `fixtures/github_openapi.json` (cut from @octokit/openapi by
`fixtures/extract_github_openapi.py`): the status must be one GitHub documents, the documented
headers must have their types, and the body must validate against the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft7Validator, ValidationError

from github_broker.errors import GitHubRefused
from github_broker.gateway import GitHubGateway
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.simulator.messages import Response
from tests.factories import body
from tests.test_github_app import APP_ID, INSTALLATION, pem_pair

SPEC = json.loads((Path(__file__).parent / "fixtures" / "github_openapi.json").read_text())
REPO = "acme/widgets"
TOKENS = {"t-broker": "broker-bot", "t-alice": "alice", "t-dev": "dev-bot"}


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    headers: dict[str, str]
    body: Any


def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 schemas as JSON Schema: `nullable: true` becomes "or null"."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


COMPONENTS = openapi_to_jsonschema(SPEC["components"])
TEMPLATES = [
    (re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$"), path) for path in SPEC["paths"]
]


def operation(method: str, path: str) -> tuple[str, dict[str, Any]]:
    for pattern, template in TEMPLATES:
        if pattern.match(path) and method in SPEC["paths"][template]:
            return template, SPEC["paths"][template][method]
    # A ref or label name may contain '/': the template's last parameter takes the rest.
    for pattern, template in TEMPLATES:
        loose = re.compile(pattern.pattern.replace("/[^/]+$", "/.+$"))
        if template.endswith(("{ref}", "{name}")) and loose.match(path):
            return template, SPEC["paths"][template][method]
    raise AssertionError(f"{method.upper()} {path}: an endpoint missing from the fixture")


def leaves(error: ValidationError) -> Iterator[ValidationError]:
    """The errors that say what is wrong, not "not valid under any of the given schemas"."""
    if not error.context:
        yield error
        return
    for sub in error.context:
        if sub.schema != {"type": "null"}:  # the "or null" branch of a nullable field
            yield from leaves(sub)


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        _, _, kind, name = node["$ref"].split("/", 3)
        node = SPEC["components"][kind][name]
    return node


def violations(exchange: Exchange) -> list[str]:
    """Why `exchange` does not conform to GitHub's description (empty when it does)."""
    where = f"{exchange.method} {exchange.path} -> {exchange.status}"
    template, op = operation(exchange.method.lower(), exchange.path)
    responses = op["responses"]
    declared = responses.get(str(exchange.status)) or responses.get("default")
    if exchange.status == 304 and exchange.method == "GET":
        # Any conditional GET may be answered 304 (RFC 9110), documented or not; no body.
        return [] if exchange.body is None else [f"{where}: a 304 with a body"]
    if declared is None:
        return [f"{where}: status not documented for {template} ({sorted(responses)})"]
    declared = resolve(declared)
    found = []
    headers = {k.lower(): v for k, v in exchange.headers.items()}
    for name, spec in (declared.get("headers") or {}).items():
        header = resolve(spec)
        value = headers.get(name.lower())
        if value is None:
            if header.get("required"):
                found.append(f"{where}: required header {name} missing")
            continue
        kind = resolve(header.get("schema", {})).get("type")
        if kind == "integer" and not value.isdigit():
            found.append(f"{where}: header {name}={value!r} is not an integer")
    content = (declared.get("content") or {}).get("application/json")
    if content is None:
        if exchange.body not in (None, b"", ""):
            found.append(f"{where}: a body where GitHub documents none")
        return found
    schema = {**openapi_to_jsonschema(content["schema"]), "components": COMPONENTS}
    for top in Draft7Validator(schema).iter_errors(exchange.body):
        for error in leaves(top):
            path = "/".join(str(p) for p in error.absolute_path)
            found.append(f"{where}: /{path}: {error.message[:200]}")
    return found


@pytest.fixture
def recorded() -> Iterator[tuple[Simulator, list[Exchange]]]:
    issues = [
        {"number": n, "title": f"t{n}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for n in range(1, 4)
    ]
    seed = {
        "repositories": [
            {
                "owner": "acme",
                "name": "widgets",
                "issues": issues,
                "labels": [{"name": "P1", "color": "ff0000", "description": "urgent"}],
            }
        ]
    }
    _, public = keys = pem_pair()
    with Simulator(seed, tokens=TOKENS, apps={APP_ID: public}) as sim:
        exchanges: list[Exchange] = []
        inner = sim._gateway.process

        def process(
            method: str, target: str, headers: Mapping[str, str], raw: bytes, base: str
        ) -> Response:
            response = inner(method, target, headers, raw, base)
            path = sim.state.path_by_name(target.split("?", 1)[0])
            data = json.loads(response.encode()) if response.status not in (204, 304) else None
            exchanges.append(Exchange(method, path, response.status, response.headers, data))
            return response

        sim._gateway.process = process  # type: ignore[method-assign]
        sim.keys = keys  # type: ignore[attr-defined]
        yield sim, exchanges


def drive(sim: Simulator, gateway: GitHubGateway) -> None:
    """The gateway's calls, as sync, review upkeep and the write queue make them."""
    gateway.repository(REPO)
    first = gateway.issues_page(REPO, {"state": "all", "sort": "updated"}, page=1)
    gateway.issues_page(REPO, {"state": "all", "sort": "updated"}, page=1, etag=first.etag)
    gateway.issues_page(REPO, {"state": "all", "since": "2020-01-01T00:00:00Z"}, page=2)
    assert gateway.issue(REPO, 1) is not None and gateway.issue(REPO, 999) is None
    gateway.add_labels(REPO, 1, ["in-progress", "dev-1"])
    gateway.remove_label(REPO, 1, "dev-1")
    gateway.remove_label(REPO, 1, "dev-1")  # 404: already gone
    assert gateway.create_branch(REPO, "feature/issue-1", "main") is True
    assert gateway.create_branch(REPO, "feature/issue-1", "main") is False  # 304 + 422
    with pytest.raises(GitHubRefused):
        gateway.create_branch(REPO, "bad name..x", "main")
    assert gateway.ensure_label(REPO, "needs-review", "0e8a16", "a PR is open") is True
    assert gateway.ensure_label(REPO, "needs-review", "0e8a16", "") is False
    with pytest.raises(GitHubRefused):
        gateway.ensure_label(REPO, "P9", "invalid", "")
    pr = sim.state.create_pull(
        "acme", "widgets", title="t1", head="feature/issue-1", body="Closes #1", user="dev-bot"
    )["number"]
    sim.state.add_review("acme", "widgets", pr, user="alice", body="Needs work", state="COMMENT")
    sim.state.add_review("acme", "widgets", pr, user="alice", state="APPROVE")
    sim.state.add_review_comment(
        "acme", "widgets", pr, user="alice", body="Rename", path="a.py", line=3
    )
    sim.state.add_issue_comment("acme", "widgets", pr, user="alice", body="Also docs")
    assert [p["number"] for p in gateway.open_pulls(REPO)] == [pr]
    reviews, inline, conversation = gateway.pull_feedback(REPO, pr)
    # The lone inline comment comes wrapped in a review of its own, as on GitHub.
    assert len(reviews) == 3 and len(inline) == 1 and len(conversation) == 1
    gateway.pull_feedback(REPO, pr)  # conditional: 304s
    assert gateway.login() == "broker-bot"
    # Comment commands: who may steer, new comments, the answers.
    assert gateway.permission(REPO, "acme") == "admin"  # the owner
    assert gateway.permission(REPO, "alice") == "read"  # not a collaborator, a public repository
    assert gateway.permission(REPO, "alice") == "read"  # conditional: a 304
    assert gateway.permission(REPO, "nobody-at-all") == "none"  # 404
    listing = gateway.comments_page(REPO, "2020-01-01T00:00:00Z", page=1)
    again = gateway.comments_page(REPO, "2020-01-01T00:00:00Z", page=1, etag=listing.etag)
    assert again.status == 304
    comment_id = int(listing.items[-1]["id"])
    gateway.react(REPO, comment_id, "+1")
    gateway.react(REPO, comment_id, "+1")  # 200: the same reaction
    gateway.comment(REPO, pr, "Done.")
    gateway.ping()


def test_every_gateway_answer_conforms_to_githubs_description(
    recorded: tuple[Simulator, list[Exchange]], make_settings: Callable[..., Settings]
) -> None:
    sim, exchanges = recorded
    gateway = GitHubGateway(
        make_settings(github={"base_url": sim.base_url, "token": "t-broker"}).github
    )
    try:
        drive(sim, gateway)
    finally:
        gateway.close()
    private = sim.keys[0]  # type: ignore[attr-defined]
    app = GitHubGateway(
        make_settings(
            github={
                "base_url": sim.base_url,
                "token": None,
                "app_id": APP_ID,
                "app_installation_id": INSTALLATION,
                "app_private_key": private,
            }
        ).github
    )
    try:
        app.repository(REPO)  # mints an installation token first
    finally:
        app.close()
    problems = [p for exchange in exchanges for p in violations(exchange)]
    covered = {operation(e.method.lower(), e.path)[0] + " " + e.method for e in exchanges}
    statuses = {e.status for e in exchanges}
    assert not problems, "\n".join(problems)
    assert len(covered) == sum(len(ops) for ops in SPEC["paths"].values())
    assert {200, 201, 304, 404, 422} <= statuses
