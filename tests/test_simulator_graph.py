"""The simulator's issue relationships and planning data as GitHub serves them: dependencies,
sub-issues, issue types and fields over real HTTP, their refusals, GitHub's two traps, the
GraphQL read and the webhook deliveries.

Answers are checked against GitHub's REST description (`fixtures/github_openapi_graph.json`,
cut from @octokit/openapi) and deliveries against @octokit/openapi-webhooks (schema.json).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from jsonschema import Draft7Validator

from github_broker.simulator import Simulator
from tests.openapi_answers import Described, recorded
from tests.test_webhooks import SCHEMAS, SECRET, Capture, sign

W = ("acme", "widgets")
API = "/repos/acme/widgets"
SEED: dict[str, Any] = {
    "repositories": [
        {"owner": "acme", "name": "widgets", "issues": [
            {"number": n, "title": f"Task {n}"} for n in range(1, 8)]},
        {"owner": "acme", "name": "gadgets", "issues": [{"number": 1, "title": "Gadget"}]},
        {"owner": "other", "name": "elsewhere", "issues": [{"number": 1, "title": "Far"}]},
        {"owner": "acme", "name": "secret", "private": True, "collaborators": {"alice": "write"},
         "issues": [{"number": 1, "title": "Hidden"}]},
    ]
}
violations = Described("github_openapi_graph.json").violations


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(SEED, tokens={"t-bot": "broker-bot", "t-alice": "alice"}) as s:
        yield s


def call(sim: Simulator, verb: str, path: str, token: str = "t-bot", **kw: Any) -> Any:
    headers = {"User-Agent": "graph-test", "Authorization": f"token {token}",
               **kw.pop("headers", {})}
    return requests.request(verb, sim.base_url + path, headers=headers, timeout=5, **kw)


def iid(sim: Simulator, n: int, repo: tuple[str, str] = W) -> int:
    return sim.state.issue_id(*repo, n)


def graphql(sim: Simulator, query: str, token: str = "t-bot") -> dict[str, Any]:
    answer = call(sim, "POST", "/graphql", token, json={"query": query, "variables": {}})
    assert answer.status_code == 200
    return dict(answer.json())


# ----- the answers are GitHub's shapes ----------------------------------------------------------


def test_every_relationship_answer_conforms_to_githubs_description(sim: Simulator) -> None:
    seen = recorded(sim, ("/_sim", "/graphql"))
    deps = f"{API}/issues/2/dependencies/blocked_by"
    assert call(sim, "POST", deps, json={"issue_id": iid(sim, 1)}).status_code == 201
    gadget = iid(sim, 1, ("acme", "gadgets"))
    assert call(sim, "POST", deps, json={"issue_id": gadget}).status_code == 201
    for refused in ({"issue_id": iid(sim, 2)}, {"issue_id": iid(sim, 1)}, {"issue_id": 99999},
                    {}, {"issue_id": "x"}):
        assert call(sim, "POST", deps, json=refused).status_code == 422, refused
    assert [i["number"] for i in call(sim, "GET", deps).json()] == [1, 1]
    assert [i["number"] for i in call(sim, "GET", f"{API}/issues/1/dependencies/blocking").json()
            ] == [2]
    assert call(sim, "DELETE", f"{deps}/{gadget}").status_code == 200
    assert call(sim, "DELETE", f"{deps}/{gadget}").status_code == 404
    subs = f"{API}/issues/3/sub_issues"
    for n in (4, 5, 6):
        assert call(sim, "POST", subs, json={"sub_issue_id": iid(sim, n)}).status_code == 201
    far = iid(sim, 1, ("other", "elsewhere"))
    assert call(sim, "POST", subs, json={"sub_issue_id": far}).status_code == 422
    assert call(sim, "POST", f"{API}/issues/7/sub_issues",
                json={"sub_issue_id": iid(sim, 4)}).status_code == 422  # has a parent
    assert call(sim, "POST", f"{API}/issues/4/sub_issues",
                json={"sub_issue_id": iid(sim, 3)}).status_code == 422  # its own parent
    moved = call(sim, "PATCH", f"{subs}/priority",
                 json={"sub_issue_id": iid(sim, 6), "before_id": iid(sim, 4)})
    assert moved.status_code == 200
    assert [i["number"] for i in call(sim, "GET", subs).json()] == [6, 4, 5]
    assert call(sim, "PATCH", f"{subs}/priority", json={"sub_issue_id": iid(sim, 6)}
                ).status_code == 422
    assert call(sim, "GET", f"{API}/issues/4/parent").json()["number"] == 3
    assert call(sim, "GET", f"{API}/issues/3/parent").status_code == 404
    assert call(sim, "DELETE", f"{API}/issues/3/sub_issue",
                json={"sub_issue_id": iid(sim, 5)}).status_code == 200
    parent = call(sim, "GET", f"{API}/issues/3").json()
    assert parent["sub_issues_summary"] == {"total": 2, "completed": 0, "percent_completed": 0}
    blocked = call(sim, "GET", f"{API}/issues/2").json()["issue_dependencies_summary"]
    assert blocked == {"blocked_by": 1, "total_blocked_by": 1, "blocking": 0, "total_blocking": 0}
    assert call(sim, "PATCH", f"{API}/issues/2", json={"type": "Bug"}).json()["type"]["name"] == (
        "Bug")
    assert call(sim, "PATCH", f"{API}/issues/2", json={"type": "Nope"}).status_code == 422
    assert [t["name"] for t in call(sim, "GET", "/orgs/acme/issue-types").json()] == [
        "Task", "Bug", "Feature"]
    field = sim.state.priority_field("acme")
    values = f"{API}/issues/2/issue-field-values"
    body = {"issue_field_values": [{"field_id": field["id"], "value": "High"}]}
    assert call(sim, "POST", values, json=body).json()[0]["single_select_option"]["name"] == "High"
    call(sim, "GET", values)
    call(sim, "GET", "/orgs/acme/issue-fields")
    call(sim, "GET", f"{API}/issues?state=all")
    found = [v for m, p, s, b in seen for v in violations(m, p, s, b)]
    assert not found, found[:10]
    assert len(seen) >= 30


# ----- GitHub's two traps -----------------------------------------------------------------------


def test_links_leave_updated_at_alone_so_a_since_listing_does_not_return_them(
    sim: Simulator,
) -> None:
    before = {n: sim.state.get_issue(*W, n)["updated_at"] for n in (1, 2, 3)}
    sim.state.clock = lambda: __import__("datetime").datetime(2030, 1, 1, tzinfo=None)
    sim.state.block(*W, 2, by=(*W, 1))
    sim.state.nest(*W, 3, (*W, 1))
    assert {n: sim.state.get_issue(*W, n)["updated_at"] for n in (1, 2, 3)} == before
    since = call(sim, "GET", f"{API}/issues?state=all&since=2029-01-01T00:00:00Z").json()
    assert since == []
    # The summaries on the issue objects tell, as on GitHub.
    assert sim.state.get_issue(*W, 2)["issue_dependencies_summary"]["total_blocked_by"] == 1


def test_the_blocked_by_lists_etag_follows_the_blocked_issue_not_its_blockers(
    sim: Simulator,
) -> None:
    sim.state.block(*W, 2, by=(*W, 1))
    path = f"{API}/issues/2/dependencies/blocked_by"
    first = call(sim, "GET", path)
    assert first.json()[0]["state"] == "open"
    sim.state.update_issue(*W, 1, state="closed")
    again = call(sim, "GET", path, headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304  # the blocker closed, the cached list says open
    assert call(sim, "GET", path).json()[0]["state"] == "closed"
    sim.state.block(*W, 2, by=(*W, 3))  # a link changes the list's ETag
    assert call(sim, "GET", path, headers={"If-None-Match": first.headers["ETag"]}
                ).status_code == 200


# ----- the GraphQL read -------------------------------------------------------------------------


def test_graphql_reads_many_issues_links_in_one_request_and_hides_what_the_viewer_cannot_read(
    sim: Simulator,
) -> None:
    sim.state.block(*W, 2, by=(*W, 1))
    sim.state.block(*W, 2, by=("acme", "secret", 1))
    sim.state.update_issue(*W, 1, state="closed", state_reason="not_planned")
    sim.state.nest(*W, 3, (*W, 5))
    sim.state.nest(*W, 3, (*W, 4))
    query = """query { repository(owner: "acme", name: "widgets") {
      a: issue(number: 2) { number blockedBy(first: 50) { totalCount nodes { number state
        stateReason(enableDuplicate: true) repository { nameWithOwner } } } }
      b: issue(number: 3) { createdAt subIssues(first: 100) { totalCount nodes { number } } }
      c: issue(number: 99) { number } } }"""
    before = sim.stats.snapshot()["total"]
    answer = graphql(sim, query)
    assert sim.stats.snapshot()["total"] == before + 1
    data = answer["data"]["repository"]
    assert data["a"]["blockedBy"]["totalCount"] == 2
    assert data["a"]["blockedBy"]["nodes"] == [
        {"number": 1, "state": "CLOSED", "stateReason": "NOT_PLANNED",
         "repository": {"nameWithOwner": "acme/widgets"}}]
    assert [n["number"] for n in data["b"]["subIssues"]["nodes"]] == [5, 4]
    assert data["c"] is None and answer["errors"][0]["type"] == "NOT_FOUND"
    # alice may read acme/secret: she sees both blockers.
    alice = graphql(sim, query, "t-alice")["data"]["repository"]["a"]["blockedBy"]["nodes"]
    assert len(alice) == 2
    refused = graphql(sim, '{ repository(owner: "acme", name: "widgets") { issue(number: 2) '
                           "{ nope } } }")
    assert refused["errors"][0]["extensions"]["code"] == "undefinedField" and "data" not in refused
    unbounded = graphql(sim, '{ repository(owner: "acme", name: "widgets") { issue(number: 2) '
                             "{ blockedBy { totalCount } } } }")
    assert unbounded["errors"][0]["type"] == "MISSING_PAGINATION_BOUNDARIES"


# ----- deliveries -------------------------------------------------------------------------------


def test_relationship_and_type_deliveries_match_githubs_published_schemas(sim: Simulator) -> None:
    capture = Capture()
    try:
        sim.webhooks.add_hook(sim.state, {"url": capture.url, "secret": SECRET})
        assert sim.webhooks.wait_idle()
        capture.deliveries.clear()
        st = sim.state
        st.block(*W, 2, by=("acme", "gadgets", 1))
        st.unblock(*W, 2, by=("acme", "gadgets", 1))
        st.nest(*W, 3, (*W, 4))
        st.remove_sub_issue(*W, 3, iid(sim, 4))
        st.set_issue_type(*W, 2, "Bug")
        st.set_issue_type(*W, 2, None)
        st.set_field(*W, 2, "Priority", "Low")
        assert sim.webhooks.wait_idle()
        seen = []
        for headers, data in capture.deliveries:
            assert headers["x-hub-signature-256"] == sign(data)
            event, payload = headers["x-github-event"], json.loads(data)
            name = f"{event}${payload['action']}"
            seen.append((name, payload["repository"]["full_name"]))
            if name in SCHEMAS["definitions"]:
                validator = Draft7Validator({**SCHEMAS, "$ref": f"#/definitions/{name}"})
                errors = [f"{list(e.absolute_path)}: {e.message}"
                          for e in validator.iter_errors(payload)]
                assert not errors, f"{name}: {errors[:5]}"
    finally:
        capture.close()
    assert seen == [
        ("issue_dependencies$blocked_by_added", "acme/widgets"),
        ("issue_dependencies$blocking_added", "acme/gadgets"),
        ("issue_dependencies$blocked_by_removed", "acme/widgets"),
        ("issue_dependencies$blocking_removed", "acme/gadgets"),
        ("sub_issues$sub_issue_added", "acme/widgets"),
        ("sub_issues$parent_issue_added", "acme/widgets"),
        ("sub_issues$sub_issue_removed", "acme/widgets"),
        ("sub_issues$parent_issue_removed", "acme/widgets"),
        ("issues$typed", "acme/widgets"),
        ("issues$untyped", "acme/widgets"),
        ("issues$field_added", "acme/widgets"),
    ]
