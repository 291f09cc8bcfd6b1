"""The simulator's pushes, compare, collaborator permissions, comment reactions and merges:
what the broker reads for progress tracking and maintainers' comment commands, driven over
real HTTP (PyGithub and plain requests), with the signed webhook deliveries they cause.

Answers are checked against GitHub's REST description (`fixtures/github_openapi_progress.json`,
cut from @octokit/openapi) and deliveries against @octokit/webhooks-schemas.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import github
import pytest
import requests
from jsonschema import Draft7Validator

from github_broker.simulator import Simulator, apply_seed
from github_broker.simulator.commits import ZERO_SHA
from tests.openapi_answers import Described, recorded
from tests.test_webhooks import SCHEMAS, SECRET, Capture, sign

OWNER, NAME = "acme", "widgets"
REPO = f"{OWNER}/{NAME}"
API = f"/repos/{REPO}"
TOKENS = {"t-bot": "broker-bot", "t-alice": "alice", "t-dave": "dave", "t-dev": "dev-bot"}
SEED: dict[str, Any] = {
    "repositories": [
        {
            "owner": OWNER,
            "name": NAME,
            "branches": ["feature/login"],
            "collaborators": {
                "alice": "write",
                "carol": "maintain",
                "bob": "triage",
                "dave": "read",
            },
            "issues": [
                {
                    "number": 1,
                    "title": "Add login",
                    "comments": [{"user": "alice", "body": "/broker retry"}],
                },
                {"number": 2, "title": "Fix logout", "user": "erin"},
            ],
        },
        {"owner": OWNER, "name": "secret", "private": True},
    ]
}
T0 = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(SEED, tokens=TOKENS) as simulator:
        yield simulator


@pytest.fixture
def capture(sim: Simulator) -> Iterator[Capture]:
    """Deliveries of acme/widgets' hook, the ping left out."""
    c = Capture()
    sim.webhooks.add_hook(sim.state, {"url": c.url, "secret": SECRET, "repository": REPO})
    assert sim.webhooks.wait_idle()
    c.deliveries.clear()
    yield c
    c.close()


@pytest.fixture
def gh(sim: Simulator) -> Iterator[github.Github]:
    client = github.Github(
        auth=github.Auth.Token("t-bot"),
        base_url=sim.base_url,
        retry=None,
        seconds_between_requests=0,
        seconds_between_writes=0,
    )
    yield client
    client.close()


def call(sim: Simulator, verb: str, path: str, token: str | None = "t-bot", **kw: Any) -> Any:
    headers = {"User-Agent": "progress-test", **kw.pop("headers", {})}
    if token is not None:
        headers["Authorization"] = f"token {token}"
    return requests.request(verb, sim.base_url + path, headers=headers, timeout=5, **kw)


def control(sim: Simulator, verb: str, path: str, **kw: Any) -> Any:
    return requests.request(verb, f"{sim.base_url}/_sim{path}", timeout=5, **kw)


def delivered(sim: Simulator, capture: Capture) -> list[tuple[str, dict[str, Any]]]:
    """Every delivery so far as (event$action, payload), each checked for its signature and
    against GitHub's published schema for that event."""
    assert sim.webhooks.wait_idle()
    found = []
    for headers, data in capture.deliveries:
        assert headers["x-hub-signature-256"] == sign(data)
        event, payload = headers["x-github-event"], json.loads(data)
        name = f"{event}${payload.get('action', 'event')}"
        validator = Draft7Validator({**SCHEMAS, "$ref": f"#/definitions/{name}"})
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(payload)]
        assert not errors, f"{name}: {errors[:5]}"
        found.append((name, payload))
    capture.deliveries.clear()
    return found


def tip(sim: Simulator, branch: str) -> str:
    return str(sim.state.branches(OWNER, NAME)[branch])


# ----- pushes ------------------------------------------------------------------------------------


def test_push_adds_a_commit_on_the_tip_and_sends_githubs_push_event(
    sim: Simulator, capture: Capture
) -> None:
    before = tip(sim, "feature/login")
    pushed = sim.state.push(OWNER, NAME, "feature/login", message="Add form", author="dev-bot")
    after = tip(sim, "feature/login")
    assert pushed == {
        "ref": "refs/heads/feature/login",
        "before": before,
        "after": after,
        "created": False,
        "forced": False,
    }
    assert after != before
    compared = call(sim, "GET", f"{API}/compare/{before}...{after}").json()
    assert compared["status"] == "ahead" and compared["ahead_by"] == 1
    assert compared["commits"][0]["parents"][0]["sha"] == before
    [(name, push)] = delivered(sim, capture)
    assert name == "push$event"
    assert push["ref"] == "refs/heads/feature/login"
    assert (push["before"], push["after"]) == (before, after)
    assert (push["created"], push["deleted"], push["forced"]) == (False, False, False)
    assert [(c["id"], c["message"], c["author"]["username"]) for c in push["commits"]] == [
        (after, "Add form", "dev-bot")
    ]
    assert push["commits"][0]["distinct"] is True
    assert push["head_commit"]["id"] == after
    assert push["compare"].endswith(f"/compare/{before[:12]}...{after[:12]}")
    assert push["pusher"]["name"] == "dev-bot" and push["sender"]["login"] == "dev-bot"
    assert push["repository"]["full_name"] == REPO
    assert isinstance(push["repository"]["pushed_at"], int)
    assert push["repository"]["master_branch"] == "main"


def test_control_api_pushes_a_new_branch_with_several_commits(
    sim: Simulator, capture: Capture
) -> None:
    main = tip(sim, "main")
    spec = {"branch": "feature/issue-2", "message": "Step", "author": "dev-bot", "count": 2}
    answer = control(sim, "POST", f"/repos/{REPO}/push", json=spec)
    assert answer.status_code == 201
    assert answer.json()["created"] is True and answer.json()["before"] == ZERO_SHA
    after = answer.json()["after"]
    assert call(sim, "GET", f"{API}/git/ref/heads/feature/issue-2").json()["object"]["sha"] == after
    [(_, push)] = delivered(sim, capture)
    assert push["created"] is True and push["before"] == ZERO_SHA and push["base_ref"] is None
    assert [c["message"] for c in push["commits"]] == ["Step (1/2)", "Step (2/2)"]
    assert all(c["distinct"] for c in push["commits"])
    assert push["compare"].endswith(f"/commit/{after[:12]}")
    compared = call(sim, "GET", f"{API}/compare/main...feature/issue-2").json()
    assert (compared["status"], compared["ahead_by"]) == ("ahead", 2)
    assert compared["merge_base_commit"]["sha"] == main


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        ({"branch": "bad..name"}, 422),
        ({"branch": "main/sub"}, 422),  # a ref cannot hold another one
        ({"branch": "x", "base": "nope"}, 404),
        ({"branch": "x", "parent": "0" * 40}, 422),
        ({"branch": "x", "count": 0}, 422),
        ({"message": "no branch"}, 400),
    ],
)
def test_control_push_github_would_refuse_is_refused(
    sim: Simulator, spec: dict[str, Any], status: int
) -> None:
    branches = sim.state.branches(OWNER, NAME)
    assert control(sim, "POST", f"/repos/{REPO}/push", json=spec).status_code == status
    assert sim.state.branches(OWNER, NAME) == branches


def test_control_push_to_an_unknown_repository_is_404(sim: Simulator) -> None:
    assert control(sim, "POST", "/repos/acme/nope/push", json={"branch": "x"}).status_code == 404


def test_created_ref_sends_push_created_at_the_tip_it_copies(
    sim: Simulator, capture: Capture, gh: github.Github
) -> None:
    main = tip(sim, "main")
    gh.get_repo(REPO).create_git_ref("refs/heads/feature/issue-1", main)
    [(_, push)] = delivered(sim, capture)
    assert (push["ref"], push["before"], push["after"]) == (
        "refs/heads/feature/issue-1",
        ZERO_SHA,
        main,
    )
    assert push["created"] is True and push["commits"] == []
    assert push["head_commit"]["id"] == main and push["base_ref"] == "refs/heads/main"
    assert push["sender"]["login"] == "broker-bot"


def test_moving_a_ref_needs_a_fast_forward_unless_forced(
    sim: Simulator, capture: Capture, gh: github.Github
) -> None:
    old = tip(sim, "feature/login")
    sim.state.push(OWNER, NAME, "feature/login", message="one", author="dev-bot")
    new = tip(sim, "feature/login")
    path = f"{API}/git/refs/heads/feature/login"
    back = call(sim, "PATCH", path, json={"sha": old})
    assert back.status_code == 422 and back.json()["message"] == "Update is not a fast forward"
    unknown = call(sim, "PATCH", path, json={"sha": "1" * 40})
    assert unknown.status_code == 422 and unknown.json()["message"] == "Object does not exist"
    missing = call(sim, "PATCH", f"{API}/git/refs/heads/nope", json={"sha": new})
    assert missing.status_code == 422 and missing.json()["message"] == "Reference does not exist"
    assert tip(sim, "feature/login") == new
    ref = gh.get_repo(REPO).get_git_ref("heads/feature/login")
    ref.edit(old, force=True)
    assert tip(sim, "feature/login") == old
    pushes = [p for _, p in delivered(sim, capture)]
    assert [(p["before"], p["after"], p["forced"]) for p in pushes] == [
        (old, new, False),
        (new, old, True),
    ]
    assert pushes[1]["commits"] == [] and pushes[1]["head_commit"]["id"] == old


def test_rewritten_history_is_a_forced_push(sim: Simulator, capture: Capture) -> None:
    base = tip(sim, "main")
    sim.state.push(OWNER, NAME, "feature/login", message="first try", author="dev-bot")
    rewritten = sim.state.push(
        OWNER, NAME, "feature/login", message="second try", author="dev-bot", parent=base
    )
    assert rewritten["forced"] is True
    compared = call(sim, "GET", f"{API}/compare/main...feature/login").json()
    assert [c["commit"]["message"] for c in compared["commits"]] == ["second try"]
    assert [p["forced"] for _, p in delivered(sim, capture)] == [False, True]


def test_deleted_ref_sends_push_deleted(sim: Simulator, capture: Capture) -> None:
    before = tip(sim, "feature/login")
    assert call(sim, "DELETE", f"{API}/git/refs/heads/feature/login").status_code == 204
    [(_, push)] = delivered(sim, capture)
    assert (push["before"], push["after"], push["deleted"]) == (before, ZERO_SHA, True)
    assert push["head_commit"] is None and push["commits"] == []


def test_push_to_an_open_pull_requests_head_synchronizes_it(
    sim: Simulator, capture: Capture
) -> None:
    moment = [T0]
    sim.state.clock = lambda: moment[0]
    pr = sim.state.create_pull(OWNER, NAME, title="Login", head="feature/login", user="dev-bot")
    closed = sim.state.create_pull(OWNER, NAME, title="Old", head="feature/old", user="dev-bot")
    sim.state.update_pull(OWNER, NAME, closed["number"], state="closed")
    delivered(sim, capture)
    moment[0] = T0 + timedelta(minutes=5)
    before = tip(sim, "feature/login")
    sim.state.push(OWNER, NAME, "feature/login", message="Address review", author="dev-bot")
    sim.state.push(OWNER, NAME, "feature/old", message="Late", author="dev-bot")
    after = tip(sim, "feature/login")
    events = delivered(sim, capture)
    assert [name for name, _ in events] == ["push$event", "pull_request$synchronize", "push$event"]
    sync = events[1][1]
    assert (sync["number"], sync["before"], sync["after"]) == (pr["number"], before, after)
    assert sync["pull_request"]["head"]["sha"] == after
    assert sync["sender"]["login"] == "dev-bot"
    fetched = call(sim, "GET", f"{API}/pulls/{pr['number']}").json()
    assert fetched["head"]["sha"] == after
    assert fetched["updated_at"] == "2026-11-01T12:05:00Z"
    old = call(sim, "GET", f"{API}/pulls/{closed['number']}").json()
    assert old["head"]["sha"] == closed["head"]["sha"]  # a closed PR keeps its head


# ----- the ref's conditional read ------------------------------------------------------------


def test_branch_ref_answers_304_for_free_until_a_push_moves_it(sim: Simulator) -> None:
    path = f"{API}/git/ref/heads/feature/login"
    first = call(sim, "GET", path)
    etag = first.headers["ETag"]
    remaining = int(first.headers["X-RateLimit-Remaining"])
    cost = sim.stats.snapshot()["rate_limited_cost"]
    again = call(sim, "GET", path, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert int(again.headers["X-RateLimit-Remaining"]) == remaining
    assert sim.stats.snapshot()["rate_limited_cost"] == cost
    sim.state.push(OWNER, NAME, "feature/login", message="more", author="dev-bot")
    moved = call(sim, "GET", path, headers={"If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["ETag"] != etag
    assert (
        moved.json()["object"]["sha"] == tip(sim, "feature/login") != first.json()["object"]["sha"]
    )
    assert int(moved.headers["X-RateLimit-Remaining"]) == remaining - 1
    assert call(sim, "GET", f"{API}/git/ref/heads/nope").status_code == 404


# ----- compare -----------------------------------------------------------------------------------


def test_compare_reports_ahead_behind_identical_and_diverged(
    sim: Simulator, gh: github.Github
) -> None:
    repo = gh.get_repo(REPO)
    root, start = tip(sim, "main"), tip(sim, "feature/login")  # feature/login: one commit
    same = repo.compare("feature/login", "feature/login")
    assert (same.status, same.ahead_by, same.behind_by, same.total_commits) == (
        "identical",
        0,
        0,
        0,
    )
    ahead = repo.compare("main", "feature/login")
    assert (ahead.status, ahead.ahead_by, ahead.behind_by) == ("ahead", 1, 0)
    assert [c.sha for c in ahead.commits] == [start]
    behind = repo.compare("feature/login", "main")
    assert (behind.status, behind.ahead_by, behind.behind_by) == ("behind", 0, 1)
    sim.state.push(OWNER, NAME, "main", message="hotfix", author="alice")
    sim.state.push(OWNER, NAME, "feature/login", message="a", author="dev-bot", count=2)
    diverged = repo.compare("main", "feature/login")
    assert (diverged.status, diverged.ahead_by, diverged.behind_by) == ("diverged", 3, 1)
    assert diverged.total_commits == 3
    messages = [c.commit.message for c in diverged.commits]  # oldest first, as on GitHub
    assert messages == ["Start feature/login", "a (1/2)", "a (2/2)"]
    assert diverged.merge_base_commit.sha == root
    assert diverged.base_commit.sha == tip(sim, "main")
    assert diverged.commits[-1].author.login == "dev-bot"
    short = call(sim, "GET", f"{API}/compare/{start[:7]}...acme:feature/login").json()
    assert (short["status"], short["ahead_by"]) == ("ahead", 2)


def test_compare_pages_its_commits_when_asked(sim: Simulator) -> None:
    sim.state.push(OWNER, NAME, "feature/login", message="c", author="dev-bot", count=4)
    paged = call(sim, "GET", f"{API}/compare/main...feature/login?per_page=2&page=2")
    body = paged.json()
    assert body["total_commits"] == 5 and [c["commit"]["message"] for c in body["commits"]] == [
        "c (2/4)",
        "c (3/4)",
    ]
    assert 'rel="next"' in paged.headers["Link"] and 'rel="prev"' in paged.headers["Link"]


@pytest.mark.parametrize(
    "basehead",
    ["main...nope", "nope...main", "main..feature/login", "main", "other:main...feature/login"],
)
def test_compare_with_an_unknown_ref_is_404(sim: Simulator, basehead: str) -> None:
    answer = call(sim, "GET", f"{API}/compare/{basehead}")
    assert answer.status_code == 404 and answer.json()["message"] == "Not Found"


def test_compare_without_a_common_ancestor_is_404(sim: Simulator) -> None:
    orphan = sim.state.commit(sim.state.repo(OWNER, NAME), [], message="orphan", author="x")
    sim.state.create_ref(OWNER, NAME, "refs/heads/orphan", orphan["sha"])
    answer = call(sim, "GET", f"{API}/compare/main...orphan")
    assert answer.status_code == 404
    assert answer.json()["message"] == "No common ancestor between main and orphan."


# ----- collaborator permissions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("login", "permission", "role"),
    [
        ("acme", "admin", "admin"),  # the owner
        ("alice", "write", "write"),
        ("carol", "write", "maintain"),
        ("bob", "read", "triage"),
        ("dave", "read", "read"),
        ("ERIN", "read", "read"),  # not a collaborator: anyone reads a public repository
    ],
)
def test_permission_reports_the_base_permission_and_the_role(
    sim: Simulator, login: str, permission: str, role: str
) -> None:
    answer = call(sim, "GET", f"{API}/collaborators/{login}/permission")
    assert answer.status_code == 200
    body = answer.json()
    assert (body["permission"], body["role_name"]) == (permission, role)
    assert body["user"]["login"].lower() == login.lower() and body["user"]["role_name"] == role
    flags = body["user"]["permissions"]
    assert flags["push"] is (permission in ("write", "admin"))
    assert flags["admin"] is (permission == "admin") and flags["pull"] is True


def test_permission_on_a_private_repository_is_none_for_outsiders(sim: Simulator) -> None:
    body = call(sim, "GET", "/repos/acme/secret/collaborators/alice/permission").json()
    assert (body["permission"], body["role_name"]) == ("none", "")
    assert not any(body["user"]["permissions"].values())


def test_permission_of_an_unknown_account_is_404_and_a_reader_may_not_ask(
    sim: Simulator, gh: github.Github
) -> None:
    assert call(sim, "GET", f"{API}/collaborators/nobody-here/permission").status_code == 404
    refused = call(sim, "GET", f"{API}/collaborators/alice/permission", token="t-dave")
    assert refused.status_code == 403
    assert refused.json()["message"] == "Must have push access to view collaborator permission."
    assert call(sim, "GET", f"{API}/collaborators/dave/permission", "t-alice").status_code == 200
    anonymous = call(sim, "GET", f"{API}/collaborators/dave/permission", token=None)
    assert anonymous.status_code == 401
    repo = gh.get_repo(REPO)
    assert repo.get_collaborator_permission("carol") == "write"
    assert repo.get_collaborator_role_name("carol") == "maintain"


def test_collaborators_are_set_and_removed_through_the_control_api(sim: Simulator) -> None:
    path = f"/repos/{REPO}/collaborators"
    assert control(sim, "PUT", f"{path}/erin", json={"permission": "push"}).status_code == 200
    listed = control(sim, "GET", path).json()["collaborators"]
    assert listed["erin"] == "write" and listed["alice"] == "write"
    assert call(sim, "GET", f"{API}/collaborators/erin/permission").json()["permission"] == "write"
    assert control(sim, "PUT", f"{path}/erin", json={"permission": "owner"}).status_code == 422
    assert control(sim, "DELETE", f"{path}/erin").status_code == 204
    assert control(sim, "DELETE", f"{path}/erin").status_code == 404
    assert call(sim, "GET", f"{API}/collaborators/erin/permission").json()["permission"] == "read"


def test_seed_with_an_unknown_role_is_refused_with_its_name() -> None:
    with Simulator() as sim:
        bad = {"repositories": [{"owner": "o", "name": "r", "collaborators": {"x": "boss"}}]}
        with pytest.raises(ValueError, match="collaborator 'x' of o/r"):
            apply_seed(sim.state, bad)


# ----- reactions on issue comments -------------------------------------------------------------


def comment_id(sim: Simulator) -> int:
    comments = call(sim, "GET", f"{API}/issues/1/comments").json()
    return int(comments[0]["id"])


def test_reaction_is_created_once_per_user_and_content(sim: Simulator) -> None:
    path = f"{API}/issues/comments/{comment_id(sim)}/reactions"
    first = call(sim, "POST", path, json={"content": "eyes"})
    assert first.status_code == 201
    assert first.json()["content"] == "eyes" and first.json()["user"]["login"] == "broker-bot"
    again = call(sim, "POST", path, json={"content": "eyes"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert call(sim, "POST", path, "t-alice", json={"content": "eyes"}).status_code == 201
    assert call(sim, "POST", path, json={"content": "+1"}).status_code == 201
    listed = call(sim, "GET", path).json()
    assert [(r["user"]["login"], r["content"]) for r in listed] == [
        ("broker-bot", "eyes"),
        ("alice", "eyes"),
        ("broker-bot", "+1"),
    ]
    only = call(sim, "GET", path, params={"content": "+1"}).json()
    assert [r["content"] for r in only] == ["+1"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"content": "thumbsup"}, "Invalid request.\n\nFor 'properties/content', \"thumbsup\""),
        ({"content": ":+1:"}, "Invalid request.\n\nFor 'properties/content', \":+1:\""),
        ({}, 'Invalid request.\n\n"content" wasn\'t supplied.'),
    ],
)
def test_reaction_with_unknown_content_is_422(
    sim: Simulator, body: dict[str, Any], message: str
) -> None:
    path = f"{API}/issues/comments/{comment_id(sim)}/reactions"
    answer = call(sim, "POST", path, json=body)
    assert answer.status_code == 422 and answer.json()["message"].startswith(message)
    assert call(sim, "GET", path).json() == []


def test_reaction_on_a_missing_comment_is_404_and_anonymous_is_401(sim: Simulator) -> None:
    missing = f"{API}/issues/comments/999999/reactions"
    assert call(sim, "POST", missing, json={"content": "heart"}).status_code == 404
    assert call(sim, "GET", missing).status_code == 404
    path = f"{API}/issues/comments/{comment_id(sim)}/reactions"
    assert call(sim, "POST", path, token=None, json={"content": "heart"}).status_code == 401


def test_comment_reactions_summary_counts_them(sim: Simulator, gh: github.Github) -> None:
    comment = gh.get_repo(REPO).get_issue(1).get_comment(comment_id(sim))
    assert comment.create_reaction("heart").content == "heart"
    alice = call(
        sim,
        "POST",
        f"{API}/issues/comments/{comment.id}/reactions",
        "t-alice",
        json={"content": "heart"},
    )
    assert alice.status_code == 201
    comment.create_reaction("rocket")
    summary = call(sim, "GET", f"{API}/issues/comments/{comment.id}").json()["reactions"]
    assert (summary["total_count"], summary["heart"], summary["rocket"], summary["+1"]) == (
        3,
        2,
        1,
        0,
    )
    listed = call(sim, "GET", f"{API}/issues/1/comments").json()[0]["reactions"]
    assert listed == summary
    assert sorted(r.content for r in comment.get_reactions()) == ["heart", "heart", "rocket"]


def test_reaction_is_a_charged_write_that_a_secondary_limit_refuses(sim: Simulator) -> None:
    path = f"{API}/issues/comments/{comment_id(sim)}/reactions"
    made = call(sim, "POST", path, json={"content": "hooray"})
    used = int(made.headers["X-RateLimit-Used"])
    second = call(sim, "POST", path, json={"content": "laugh"})
    assert int(second.headers["X-RateLimit-Used"]) == used + 1
    sim.faults.add_secondary_rate_limit(count=1, retry_after=9, method="POST")
    limited = call(sim, "POST", path, json={"content": "confused"})
    assert limited.status_code == 403 and limited.headers["Retry-After"] == "9"
    assert "secondary rate limit" in limited.json()["message"]
    assert [r["content"] for r in call(sim, "GET", path).json()] == ["hooray", "laugh"]


def test_new_comment_delivery_carries_the_reactions_summary(
    sim: Simulator, capture: Capture
) -> None:
    sim.state.add_issue_comment(OWNER, NAME, 1, user="alice", body="/broker pause")
    [(name, payload)] = delivered(sim, capture)
    assert name == "issue_comment$created"
    summary = payload["comment"]["reactions"]
    assert summary["total_count"] == 0 and summary["url"].endswith("/reactions")


def test_repository_comments_are_listed_by_update_time_since_a_moment_pull_requests_too(
    sim: Simulator,
) -> None:
    pr = sim.state.create_pull(OWNER, NAME, title="t", head="feature/login", body="Closes #1")
    made = []
    for seconds, n in ((3, 2), (1, 1), (2, pr["number"])):
        sim.state.clock = lambda s=seconds: T0 + timedelta(seconds=s)
        made.append(sim.state.add_issue_comment(OWNER, NAME, n, user="alice", body=f"c{n}"))
    since = (T0 + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def listed(query: str) -> list[str]:
        answer = call(sim, "GET", f"{API}/issues/comments?{query}")
        assert answer.status_code == 200, answer.text
        return [c["body"] for c in answer.json() if c["id"] in {m["id"] for m in made}]

    assert listed(f"sort=updated&direction=asc&since={since}") == [f"c{pr['number']}", "c2"]
    assert listed("sort=updated&direction=desc") == ["c2", f"c{pr['number']}", "c1"]
    assert listed("direction=desc") == ["c1", f"c{pr['number']}", "c2"]  # ignored unsorted
    assert call(sim, "GET", f"{API}/issues/comments?direction=up&sort=created").status_code == 422


# ----- merging -----------------------------------------------------------------------------------


def test_merge_closes_the_pull_request_merged_and_the_issue_it_closes(
    sim: Simulator, capture: Capture, gh: github.Github
) -> None:
    repo = gh.get_repo(REPO)
    pr = repo.create_pull(base="main", head="feature/login", title="Login", body="Closes #1")
    delivered(sim, capture)
    head = tip(sim, "feature/login")
    status = repo.get_pull(pr.number).merge()
    assert status.merged
    events = delivered(sim, capture)
    assert [name for name, _ in events] == ["push$event", "pull_request$closed", "issues$closed"]
    push, closed, issue = (payload for _, payload in events)
    assert push["ref"] == "refs/heads/main" and push["after"] == status.sha
    assert [c["id"] for c in push["commits"]] == [head, status.sha]
    assert push["commits"][0]["distinct"] is False  # already on feature/login
    assert closed["pull_request"]["merged"] is True and closed["number"] == pr.number
    assert closed["pull_request"]["merge_commit_sha"] == status.sha
    assert issue["issue"]["number"] == 1 and issue["issue"]["state_reason"] == "completed"
    assert repo.get_issue(1).state == "closed" and tip(sim, "main") == status.sha
    compared = call(sim, "GET", f"{API}/compare/feature/login...main").json()
    assert compared["status"] == "ahead" and compared["ahead_by"] == 1


def test_merge_of_a_head_the_caller_did_not_review_is_409(sim: Simulator) -> None:
    pr = sim.state.create_pull(OWNER, NAME, title="Login", head="feature/login", user="dev-bot")
    reviewed = pr["head"]["sha"]
    sim.state.push(OWNER, NAME, "feature/login", message="late", author="dev-bot")
    path = f"{API}/pulls/{pr['number']}/merge"
    stale = call(sim, "PUT", path, json={"sha": reviewed})
    assert stale.status_code == 409
    assert stale.json()["message"] == "Head branch was modified. Review and try the merge again."
    assert call(sim, "PUT", path, json={"sha": tip(sim, "feature/login")}).status_code == 200
    assert call(sim, "PUT", path, json={}).status_code == 405


# ----- the answers are GitHub's shapes ----------------------------------------------------------

DESCRIBED = Described("github_openapi_progress.json", greedy=("{ref}", "{basehead}"))
violations = DESCRIBED.violations
_template = DESCRIBED.template


def test_every_answer_conforms_to_githubs_description(sim: Simulator) -> None:
    seen = recorded(sim)
    main = tip(sim, "main")
    ref = call(sim, "GET", f"{API}/git/ref/heads/main")
    call(sim, "GET", f"{API}/git/ref/heads/main", headers={"If-None-Match": ref.headers["ETag"]})
    call(sim, "GET", f"{API}/git/ref/heads/nope")
    call(sim, "POST", f"{API}/git/refs", json={"ref": "refs/heads/feature/x", "sha": main})
    call(sim, "POST", f"{API}/git/refs", json={"ref": "refs/heads/feature/x", "sha": main})
    sim.state.push(OWNER, NAME, "feature/x", message="work", author="dev-bot")
    call(sim, "PATCH", f"{API}/git/refs/heads/feature/x", json={"sha": main})
    call(sim, "PATCH", f"{API}/git/refs/heads/feature/x", json={"sha": main, "force": True})
    call(sim, "DELETE", f"{API}/git/refs/heads/feature/x")
    sim.state.push(OWNER, NAME, "feature/login", message="more", author="dev-bot", count=2)
    call(sim, "GET", f"{API}/compare/main...feature/login")
    call(sim, "GET", f"{API}/compare/main...feature/login?per_page=1")
    call(sim, "GET", f"{API}/compare/main...nope")
    for login in ("acme", "alice", "bob", "erin", "nobody-here"):
        call(sim, "GET", f"{API}/collaborators/{login}/permission")
    call(sim, "GET", "/repos/acme/secret/collaborators/alice/permission")
    cid = sim.state.list_issue_comments(OWNER, NAME, 1)[0]["id"]
    call(sim, "GET", f"{API}/issues/comments/{cid}")
    call(sim, "GET", f"{API}/issues/comments/999999")
    for content in ("heart", "heart", "nope"):
        call(sim, "POST", f"{API}/issues/comments/{cid}/reactions", json={"content": content})
    call(sim, "GET", f"{API}/issues/comments/{cid}/reactions")
    call(sim, "GET", f"{API}/issues/comments/999999/reactions")
    call(sim, "POST", f"{API}/issues/1/comments", json={"body": "/broker help"})
    call(sim, "POST", f"{API}/issues/1/comments", json={})
    listing = call(sim, "GET", f"{API}/issues/comments?sort=updated&since=2020-01-01T00:00:00Z")
    etag = {"If-None-Match": listing.headers["ETag"]}
    call(sim, "GET", f"{API}/issues/comments?sort=updated&since=2020-01-01T00:00:00Z", headers=etag)
    call(sim, "GET", f"{API}/issues/comments?sort=sideways")
    pr = sim.state.create_pull(OWNER, NAME, title="t", head="feature/login", body="Closes #1")
    call(sim, "GET", f"{API}/pulls/{pr['number']}")
    call(sim, "PUT", f"{API}/pulls/{pr['number']}/merge", json={"sha": main})
    call(sim, "PUT", f"{API}/pulls/{pr['number']}/merge")
    call(sim, "PUT", f"{API}/pulls/{pr['number']}/merge")
    problems = [p for exchange in seen for p in violations(*exchange)]
    assert not problems, "\n".join(problems)
    statuses = {status for *_, status, _ in seen}
    assert {200, 201, 204, 304, 404, 405, 409, 422} <= statuses
    covered = {(m, _template(m.lower(), path)) for m, path, *_ in seen}
    assert len(covered) == sum(len(ops) for ops in DESCRIBED.spec["paths"].values())
