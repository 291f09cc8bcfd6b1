"""The simulator's checks over real HTTP: check runs and suites, commit statuses and the
combined status, branch protection, mergeability and merges refused, Actions runs waiting for
approval, the GraphQL rollup, the fake CI; answers checked against GitHub's REST description
(`fixtures/github_openapi_checks.json`, cut from @octokit/openapi) and deliveries against
@octokit/webhooks-schemas (`fixtures/webhook_schemas/checks_schema.json`)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import requests
from jsonschema import Draft7Validator

from github_broker.simulator import Simulator
from github_broker.simulator.fake_ci import FakeCI
from github_broker.simulator.messages import Response
from tests.test_conformance import leaves, openapi_to_jsonschema
from tests.test_webhooks import SECRET, Capture
from tests.waiting import wait_until

OWNER, NAME = "acme", "widgets"
API = f"/repos/{OWNER}/{NAME}"
SPEC = json.loads((Path(__file__).parent / "fixtures" / "github_openapi_checks.json").read_text())
COMPONENTS = openapi_to_jsonschema(SPEC["components"])
HOOKS = json.loads(
    (Path(__file__).parent / "fixtures" / "webhook_schemas" / "checks_schema.json").read_text()
)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    seed = {"repositories": [{"owner": OWNER, "name": NAME}]}
    with Simulator(seed) as simulator:
        yield simulator


@pytest.fixture
def http(sim: Simulator) -> Iterator[requests.Session]:
    session = requests.Session()
    session.headers["Authorization"] = "token t"
    session.headers["User-Agent"] = "test"
    yield session
    session.close()


def url(sim: Simulator, path: str) -> str:
    return f"{sim.base_url}{API}{path}"


#: Refusals GitHub makes that its description does not list (it documents 201 alone there).
UNDOCUMENTED = {
    ("POST", "/repos/{owner}/{repo}/check-runs", 422),
    ("POST", "/repos/{owner}/{repo}/statuses/{sha}", 422),
}


def _template(method: str, path: str) -> tuple[str, dict[str, Any]]:
    # The longest template first: `branches/{branch}` would take `.../protection`.
    for template, ops in sorted(SPEC["paths"].items(), key=lambda kv: -len(kv[0])):
        pattern = "^" + template.replace("{branch}", "[^?]+?").replace("{ref}", "[^/]+")
        for name in ("owner", "repo", "check_run_id", "sha", "run_id", "pull_number"):
            pattern = pattern.replace("{" + name + "}", "[^/]+")
        if re.match(pattern + "$", path) and method in ops:
            return template, ops[method]
    raise AssertionError(f"{method} {path}: not in the fixture")


def violations(method: str, path: str, status: int, body: Any) -> list[str]:
    template, op = _template(method.lower(), path)
    declared = op["responses"].get(str(status))
    if declared is None and (method, template, status) in UNDOCUMENTED:
        return []
    if declared is None:
        return [f"{method} {path} -> {status}: not documented for {template}"]
    while "$ref" in declared:
        declared = SPEC["components"]["responses"][declared["$ref"].rsplit("/", 1)[1]]
    content = (declared.get("content") or {}).get("application/json")
    if content is None:
        return [] if body in (None, {}, "") else [f"{method} {path}: a body GitHub has not"]
    schema = {**openapi_to_jsonschema(content["schema"]), "components": COMPONENTS}
    return [
        f"{method} {path} -> {status}: /{'/'.join(map(str, e.absolute_path))}: {e.message[:160]}"
        for top in Draft7Validator(schema).iter_errors(body)
        for e in leaves(top)
    ]


@pytest.fixture
def recorded(sim: Simulator) -> Iterator[list[tuple[str, str, int, Any]]]:
    exchanges: list[tuple[str, str, int, Any]] = []
    inner = sim._gateway.process

    def process(
        method: str, target: str, headers: Mapping[str, str], raw: bytes, base: str
    ) -> Response:
        response = inner(method, target, headers, raw, base)
        path = target.split("?", 1)[0]
        if not path.startswith("/_sim") and path != "/graphql":
            data = json.loads(response.encode()) if response.status not in (204, 304) else None
            exchanges.append((method, path, response.status, data))
        return response

    sim._gateway.process = process  # type: ignore[method-assign]
    yield exchanges


def test_check_runs_statuses_protection_and_actions_answer_as_github_documents(
    sim: Simulator, http: requests.Session, recorded: list[tuple[str, str, int, Any]]
) -> None:
    sha = sim.state.push(OWNER, NAME, "feature/x", files={"a.py": "1"})["after"]
    pr = sim.state.create_pull(OWNER, NAME, title="x", head="feature/x")["number"]
    made = http.post(url(sim, "/check-runs"), json={"name": "ci/test", "head_sha": sha})
    assert made.status_code == 201 and made.json()["status"] == "queued"
    run_id = made.json()["id"]
    output = {
        "title": "1 failed",
        "summary": "boom",
        "annotations": [
            {
                "path": "a.py",
                "start_line": 1,
                "end_line": 1,
                "annotation_level": "failure",
                "message": "boom",
            }
        ],
    }
    done = http.patch(
        url(sim, f"/check-runs/{run_id}"), json={"conclusion": "failure", "output": output}
    )
    assert done.json()["status"] == "completed" and done.json()["conclusion"] == "failure"
    assert done.json()["pull_requests"][0]["number"] == pr
    assert http.get(url(sim, f"/check-runs/{run_id}")).status_code == 200
    notes = http.get(url(sim, f"/check-runs/{run_id}/annotations")).json()
    assert [n["message"] for n in notes] == ["boom"]
    listed = http.get(url(sim, f"/commits/{sha}/check-runs")).json()
    assert listed["total_count"] == 1
    suites = http.get(url(sim, f"/commits/{sha}/check-suites")).json()
    assert suites["check_suites"][0]["conclusion"] == "failure"
    assert (
        http.post(url(sim, "/check-runs"), json={"name": "x", "head_sha": "0" * 40}).status_code
        == 422
    )
    assert (
        http.post(
            url(sim, f"/statuses/{sha}"), json={"state": "pending", "context": "lint"}
        ).status_code
        == 201
    )
    assert http.post(url(sim, f"/statuses/{sha}"), json={"state": "bogus"}).status_code == 422
    combined = http.get(url(sim, f"/commits/{sha}/status")).json()
    assert combined["state"] == "pending" and combined["total_count"] == 1
    assert len(http.get(url(sim, f"/commits/{sha}/statuses")).json()) == 1
    assert http.get(url(sim, "/branches/main/protection")).status_code == 404
    assert http.put(url(sim, "/branches/main/protection"), json={}).status_code == 422
    rule = {
        "required_status_checks": {"strict": False, "contexts": ["ci/test"]},
        "enforce_admins": False,
        "required_pull_request_reviews": None,
        "restrictions": None,
    }
    assert http.put(url(sim, "/branches/main/protection"), json=rule).status_code == 200
    got = http.get(url(sim, "/branches/main/protection")).json()
    assert got["required_status_checks"]["contexts"] == ["ci/test"]
    branch = http.get(url(sim, "/branches/main")).json()
    assert branch["protected"] is True
    assert branch["protection"]["required_status_checks"]["contexts"] == ["ci/test"]
    http.get(url(sim, f"/pulls/{pr}"))
    refused = http.put(url(sim, f"/pulls/{pr}/merge"), json={})
    assert refused.status_code == 405 and '"ci/test" is failing' in refused.json()["message"]
    run = sim.state.request_approval(OWNER, NAME, sha, workflow="CI", actor="newcomer")
    waiting = http.get(url(sim, "/actions/runs"), params={"status": "action_required"}).json()
    assert [r["id"] for r in waiting["workflow_runs"]] == [run["id"]]
    assert http.post(url(sim, f"/actions/runs/{run['id']}/approve")).status_code == 201
    assert http.post(url(sim, f"/actions/runs/{run['id']}/approve")).status_code == 403
    assert http.delete(url(sim, "/branches/main/protection")).status_code == 204
    problems = [p for m, path, status, body in recorded for p in violations(m, path, status, body)]
    assert not problems, "\n".join(problems)


def test_mergeability_is_null_while_worked_out_then_a_conflict_refuses_the_merge(
    sim: Simulator, http: requests.Session
) -> None:
    sim.state.merge_compute_s = 0.3
    sim.state.push(OWNER, NAME, "feature/x", files={"a.py": "ours"})
    pr = sim.state.create_pull(OWNER, NAME, title="x", head="feature/x")["number"]
    assert http.get(url(sim, f"/pulls/{pr}")).json()["mergeable"] is True
    sim.state.push(OWNER, NAME, "main", files={"a.py": "theirs"})
    first = http.get(url(sim, f"/pulls/{pr}")).json()
    assert first["mergeable"] is None and first["mergeable_state"] == "unknown"
    later = wait_until(
        lambda: (p := http.get(url(sim, f"/pulls/{pr}")).json())["mergeable"] is not None and p,
        5,
        "GitHub to compute mergeability",
    )
    assert later["mergeable"] is False and later["mergeable_state"] == "dirty"
    refused = http.put(url(sim, f"/pulls/{pr}/merge"), json={})
    assert (
        refused.status_code == 405 and refused.json()["message"] == "Pull Request is not mergeable"
    )
    sim.state.push(OWNER, NAME, "feature/x", files={"b.py": "more"}, merge="main")
    wait_until(
        lambda: http.get(url(sim, f"/pulls/{pr}")).json()["mergeable_state"] == "clean",
        5,
        "the merged PR clean",
    )


def test_graphql_reads_pull_requests_their_rollup_and_refuses_unknown_fields(
    sim: Simulator, http: requests.Session
) -> None:
    sha = sim.state.push(OWNER, NAME, "feature/x", files={"a.py": "1", "b.py": "2"})["after"]
    pr = sim.state.create_pull(OWNER, NAME, title="x", head="feature/x")["number"]
    sim.state.protect(OWNER, NAME, "main", ["ci/test"])
    sim.state.create_check_run(
        OWNER, NAME, {"name": "ci/test", "head_sha": sha, "conclusion": "failure"}, app="ci"
    )
    query = """query($o: String!, $n: String!, $b: String!, $pr: Int!) {
      repository(owner: $o, name: $n) {
      a: pullRequest(number: $pr) { number mergeable mergeStateStatus files(first: 10) {
        totalCount nodes { path } } commits(last: 1) { nodes { commit { oid statusCheckRollup {
        state contexts(first: 10) { nodes { __typename ... on CheckRun { name conclusion
        isRequired(pullRequestNumber: $pr) } } } } } } } }
      b: pullRequests(headRefName: $b, states: OPEN, first: 1) { nodes { number } }
      c: pullRequest(number: 999) { number } } }"""
    answer = http.post(
        f"{sim.base_url}/graphql",
        json={"query": query, "variables": {"o": OWNER, "n": NAME, "b": "feature/x", "pr": pr}},
    ).json()
    repo = answer["data"]["repository"]
    assert repo["a"]["mergeStateStatus"] == "BLOCKED" and repo["a"]["files"]["totalCount"] == 2
    rollup = repo["a"]["commits"]["nodes"][0]["commit"]["statusCheckRollup"]
    assert rollup["state"] == "FAILURE"
    assert rollup["contexts"]["nodes"] == [
        {"__typename": "CheckRun", "name": "ci/test", "conclusion": "FAILURE", "isRequired": True}
    ]
    assert repo["b"]["nodes"] == [{"number": pr}] and repo["c"] is None
    assert answer["errors"][0]["type"] == "NOT_FOUND"
    bad = http.post(
        f"{sim.base_url}/graphql",
        json={
            "query": '{ repository(owner: "acme", name: "widgets") { pullRequests { nodes { '
            "number } } } }"
        },
    ).json()
    assert "data" not in bad and "first" in bad["errors"][0]["message"]


def test_fake_ci_fails_while_the_marker_is_in_the_branch_and_deliveries_match_githubs_schemas(
    sim: Simulator,
) -> None:
    capture = Capture()
    try:
        sim.state.ci = FakeCI(delay_s=0.05, approval_for=["newcomer"])
        sim.webhooks.add_hook(
            sim.state, {"url": capture.url, "secret": SECRET, "repository": f"{OWNER}/{NAME}"}
        )
        red = sim.state.push(OWNER, NAME, "feature/x", files={".ci-fail/x": "forgot a case"})
        sim.state.create_status(
            OWNER, NAME, red["after"], {"state": "success", "context": "lint"}, creator="ci"
        )
        _settle(sim, red["after"], "failure")
        green = sim.state.push(OWNER, NAME, "feature/x", files={".ci-fail/x": None})
        _settle(sim, green["after"], "success")
        waits = sim.state.push(OWNER, NAME, "feature/y", author="newcomer")
        [run] = sim.state.workflow_runs(OWNER, NAME, head_sha=waits["after"])
        assert run["conclusion"] == "action_required"
        sim.state.approve_workflow_run(OWNER, NAME, run["id"], login="maintainer")
        _settle(sim, waits["after"], "success")
        assert sim.webhooks.wait_idle()
    finally:
        capture.close()
    seen = set()
    for event, payload in capture.events():
        if event not in ("check_run", "check_suite", "status", "workflow_run"):
            continue
        name = f"{event}${payload.get('action') or 'event'}"
        seen.add(name)
        validator = Draft7Validator({**HOOKS, "$ref": f"#/definitions/{name}"})
        errors = [
            f"{list(e.absolute_path)}: {e.message[:160]}" for e in validator.iter_errors(payload)
        ]
        assert not errors, f"{name}: {errors[:5]}"
    assert seen == {
        "check_run$created",
        "check_run$completed",
        "check_suite$completed",
        "status$event",
        "workflow_run$requested",
        "workflow_run$completed",
    }


def _settle(sim: Simulator, sha: str, conclusion: str) -> None:
    def completed() -> list[dict[str, Any]]:
        runs = sim.state.check_runs_for_ref(OWNER, NAME, sha)
        return runs if runs and runs[0]["status"] == "completed" else []

    runs = wait_until(completed, 5, f"a completed check on {sha}", every_s=0.02)
    assert runs[0]["conclusion"] == conclusion
