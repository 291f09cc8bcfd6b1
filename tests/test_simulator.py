"""Tests for the GitHub REST simulator, driven through real PyGithub and raw HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import github
import pytest
import requests

from github_broker.simulator import (
    DEMO_SEED_PATH,
    Simulator,
    generate_issues,
    load_seed,
)

OWNER, REPO = "acme", "widgets"
AUTH = {"Authorization": "token t"}
SEED: dict[str, Any] = {
    "repositories": [
        {
            "owner": OWNER,
            "name": REPO,
            "labels": [{"name": "P0", "color": "b60205"}, {"name": "P1"}, {"name": "BACKENDCODER"}],
            "issues": [
                {
                    "number": 1,
                    "title": "Add login",
                    "body": "## Deliverables\n- login page\n\nBranch: feature/login\n",
                    "labels": ["P1", "BACKENDCODER"],
                    "created_at": "2025-01-01T00:00:00Z",
                },
                {
                    "number": 2,
                    "title": "Fix logout",
                    "labels": ["P0", "BACKENDCODER"],
                    "created_at": "2025-01-02T00:00:00Z",
                },
                {
                    "number": 3,
                    "title": "Old closed task",
                    "labels": ["P1"],
                    "state": "closed",
                    "created_at": "2025-01-03T00:00:00Z",
                },
            ],
        }
    ]
}


def make_client(sim: Simulator, token: str = "t", per_page: int = 30) -> github.Github:
    # PyGithub throttles itself by default (0.25 s per request, 1 s per write): off for tests.
    return github.Github(
        auth=github.Auth.Token(token),
        base_url=sim.base_url,
        retry=None,
        per_page=per_page,
        seconds_between_requests=0,
        seconds_between_writes=0,
    )


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with Simulator(SEED) as simulator:
        yield simulator


@pytest.fixture
def gh(sim: Simulator) -> Iterator[github.Github]:
    client = make_client(sim)
    yield client
    client.close()


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.headers.update(AUTH)
        yield session


def url(sim: Simulator, path: str) -> str:
    return f"{sim.base_url}{path}"


# ----- listing and pagination -----------------------------------------------------------------


def test_pygithub_lists_1000_issues_across_pages() -> None:
    seed = {"repositories": [{"owner": OWNER, "name": REPO, "issues": generate_issues(1000)}]}
    with Simulator(seed) as sim:
        client = make_client(sim, per_page=100)
        try:
            issues = list(client.get_repo(f"{OWNER}/{REPO}").get_issues(state="open"))
        finally:
            client.close()
        assert sorted(i.number for i in issues) == list(range(1, 1001))
        assert [i.number for i in issues[:3]] == [1000, 999, 998]  # created desc by default
        assert issues[0].labels[0].name in ("P0", "P1", "P2")
        assert sim.stats.snapshot()["by_route"]["GET /repos/{owner}/{repo}/issues"] == 10


def test_paging_10000_issues_over_http_lists_each_issue_once() -> None:
    """Its speed is the bench's (`make bench`, sync group), not a timed assertion here."""
    seed = {"repositories": [{"owner": OWNER, "name": REPO, "issues": generate_issues(10_000)}]}
    with Simulator(seed) as sim, requests.Session() as http:
        http.headers.update(AUTH)
        next_url: str | None = url(sim, f"/repos/{OWNER}/{REPO}/issues?per_page=100")
        numbers: list[int] = []
        pages = 0
        while next_url:
            page = http.get(next_url)
            pages += 1
            numbers += [issue["number"] for issue in page.json()]
            next_url = page.links.get("next", {}).get("url")
    assert pages == 100
    assert len(numbers) == 10_000 and len(set(numbers)) == 10_000


def test_urls_follow_the_host_the_client_used(sim: Simulator) -> None:
    port = sim.base_url.rsplit(":", 1)[1]
    client = github.Github(
        auth=github.Auth.Token("t"),
        base_url=f"http://localhost:{port}",
        retry=None,
        per_page=1,
        seconds_between_requests=0,
        seconds_between_writes=0,
    )
    try:
        issues = list(client.get_repo(f"{OWNER}/{REPO}").get_issues())  # follows Link URLs
        assert [i.number for i in issues] == [2, 1]
        assert issues[0].url.startswith(f"http://localhost:{port}/repos/")
        issues[0].edit(title="Renamed")  # PyGithub refuses URLs on a different host
    finally:
        client.close()
    assert sim.state.get_issue(OWNER, REPO, 2)["title"] == "Renamed"
    assert sim.state.get_issue(OWNER, REPO, 2)["url"].startswith(sim.base_url)


def test_concurrent_writes_are_all_applied(sim: Simulator) -> None:
    def add_label(i: int) -> int:
        target = url(sim, f"/repos/{OWNER}/{REPO}/issues/1/labels")
        with requests.post(target, json=[f"batch-{i}"], headers=AUTH) as answer:
            return answer.status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert set(pool.map(add_label, range(40))) == {200}
    assert len(sim.state.issue_labels(OWNER, REPO, 1)) == 42


def test_link_header_has_github_layout(sim: Simulator, http: requests.Session) -> None:
    for n in range(4, 26):
        sim.state.create_issue(OWNER, REPO, title=f"Issue {n}")
    first = http.get(url(sim, f"/repos/{OWNER}/{REPO}/issues"), params={"per_page": 10})
    assert first.status_code == 200
    assert len(first.json()) == 10
    assert set(first.links) == {"next", "last"}
    assert first.links["next"]["url"].startswith(f"{sim.base_url}/repos/{OWNER}/{REPO}/issues?")
    assert "page=3" in first.links["last"]["url"]

    middle = http.get(first.links["next"]["url"])
    assert set(middle.links) == {"prev", "next", "last", "first"}
    assert 'rel="prev"' in middle.headers["Link"].split(", ")[0]
    last = http.get(first.links["last"]["url"])
    assert set(last.links) == {"prev", "first"}
    assert len(last.json()) == 4  # 24 open issues, 10 per page


def test_issue_listing_includes_pull_requests(sim: Simulator, gh: github.Github) -> None:
    pr = sim.state.create_pull(OWNER, REPO, title="Add login page", head="feature/login")
    assert pr["number"] == 4  # issues and pulls share one number space
    listed = {i.number: i for i in gh.get_repo(f"{OWNER}/{REPO}").get_issues()}
    assert listed[4].pull_request is not None
    assert listed[4].pull_request.url.endswith(f"/repos/{OWNER}/{REPO}/pulls/4")
    assert listed[1].pull_request is None
    pulls = gh.get_repo(f"{OWNER}/{REPO}").get_pulls(head=f"{OWNER}:feature/login")
    assert [p.number for p in pulls] == [4]


def test_state_labels_since_and_sort_filters(sim: Simulator, gh: github.Github) -> None:
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    assert {i.number for i in repo.get_issues()} == {1, 2}
    assert {i.number for i in repo.get_issues(state="closed")} == {3}
    assert {i.number for i in repo.get_issues(state="all")} == {1, 2, 3}
    assert {i.number for i in repo.get_issues(labels=["BACKENDCODER"])} == {1, 2}
    assert {i.number for i in repo.get_issues(labels=["p1", "BACKENDCODER"])} == {1}

    before = datetime.now(UTC) - timedelta(seconds=2)
    sim.state.update_issue(OWNER, REPO, 2, body="updated")
    assert [i.number for i in repo.get_issues(since=before)] == [2]
    assert next(iter(repo.get_issues(sort="updated"))).number == 2
    assert [i.number for i in repo.get_issues(direction="asc")] == [1, 2]


def test_conditional_get_returns_304_without_spending_quota(
    sim: Simulator, http: requests.Session
) -> None:
    target = url(sim, f"/repos/{OWNER}/{REPO}/issues/1")
    first = http.get(target)
    etag = first.headers["ETag"]
    assert etag.startswith('"') and first.headers["X-RateLimit-Resource"] == "core"
    remaining = int(first.headers["X-RateLimit-Remaining"])

    again = http.get(target, headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    assert int(again.headers["X-RateLimit-Remaining"]) == remaining

    sim.state.update_issue(OWNER, REPO, 1, title="Add login (v2)")
    changed = http.get(target, headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    assert int(changed.headers["X-RateLimit-Remaining"]) == remaining - 1
    snapshot = sim.stats.snapshot()
    assert snapshot["by_status"] == {"200": 2, "304": 1}
    assert snapshot["rate_limited_cost"] == 2


def test_pygithub_update_uses_etag(sim: Simulator, gh: github.Github) -> None:
    issue = gh.get_repo(f"{OWNER}/{REPO}").get_issue(1)
    assert issue.update() is False
    sim.state.add_labels(OWNER, REPO, 1, ["in-progress"])
    assert issue.update() is True
    assert "in-progress" in [label.name for label in issue.labels]


# ----- issues and labels ------------------------------------------------------------------------


def test_issue_create_edit_close(sim: Simulator, gh: github.Github) -> None:
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    created = repo.create_issue("New task", body="Branch: feature/new", labels=["P1", "TESTER"])
    assert created.number == 4 and created.user.login == "broker-bot"
    assert {label.name for label in repo.get_labels()} >= {"TESTER"}  # auto-created
    created.edit(state="closed")
    fetched = repo.get_issue(4)
    assert fetched.state == "closed" and fetched.closed_at is not None
    assert fetched.updated_at >= fetched.created_at
    assert sim.state.get_issue(OWNER, REPO, 4)["state_reason"] == "completed"


def test_labels_add_set_remove(sim: Simulator, gh: github.Github) -> None:
    issue = gh.get_repo(f"{OWNER}/{REPO}").get_issue(1)
    issue.add_to_labels("in-progress", "needs/review")
    assert sim.state.issue_labels(OWNER, REPO, 1) == [
        "P1",
        "BACKENDCODER",
        "in-progress",
        "needs/review",
    ]
    issue.remove_from_labels("needs/review")  # PyGithub keeps '/' unescaped in this path
    issue.remove_from_labels("in-progress")
    assert sim.state.issue_labels(OWNER, REPO, 1) == ["P1", "BACKENDCODER"]
    with pytest.raises(github.GithubException) as missing:
        issue.remove_from_labels("in-progress")
    assert missing.value.status == 404
    assert missing.value.data["message"] == "Label does not exist"
    issue.set_labels("P0")
    assert sim.state.issue_labels(OWNER, REPO, 1) == ["P0"]
    issue.delete_labels()
    assert sim.state.issue_labels(OWNER, REPO, 1) == []


def test_repo_labels_crud_and_duplicate(gh: github.Github, http: requests.Session) -> None:
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    label = repo.create_label("needs review", "fbca04", "Waiting for a human")
    assert repo.get_label("needs review").color == "fbca04"
    with pytest.raises(github.GithubException) as dup:
        repo.create_label("Needs Review", "000000")
    assert dup.value.status == 422
    assert dup.value.data["errors"][0]["code"] == "already_exists"
    label.edit("reviewing", "0e8a16")
    assert repo.get_label("reviewing").color == "0e8a16"
    repo.get_label("reviewing").delete()
    assert http.get(f"{repo.url}/labels/reviewing").status_code == 404


def test_missing_repo_issue_and_deleted_issue(sim: Simulator, gh: github.Github) -> None:
    with pytest.raises(github.UnknownObjectException):
        gh.get_repo("acme/nope")
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    with pytest.raises(github.UnknownObjectException):
        repo.get_issue(999)
    sim.state.delete_issue(OWNER, REPO, 2)
    with pytest.raises(github.GithubException) as gone:
        repo.get_issue(2)
    assert gone.value.status == 410
    assert {i.number for i in repo.get_issues()} == {1}


# ----- refs, pulls, reviews, comments -----------------------------------------------------------


def test_git_refs_and_branches(sim: Simulator, gh: github.Github) -> None:
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    main_sha = repo.get_branch("main").commit.sha
    ref = repo.create_git_ref("refs/heads/feature/issue-1", main_sha)
    assert ref.ref == "refs/heads/feature/issue-1" and ref.object.sha == main_sha
    assert repo.get_git_ref("heads/feature/issue-1").object.sha == main_sha
    assert repo.get_branch("feature/issue-1").name == "feature/issue-1"
    assert sim.state.branches(OWNER, REPO) == {"main": main_sha, "feature/issue-1": main_sha}
    with pytest.raises(github.GithubException) as dup:
        repo.create_git_ref("refs/heads/feature/issue-1", main_sha)
    assert dup.value.status == 422 and dup.value.data["message"] == "Reference already exists"
    with pytest.raises(github.UnknownObjectException):
        repo.get_branch("feature/missing")


def test_pull_reviews_and_comments_round_trip(sim: Simulator, gh: github.Github) -> None:
    repo = gh.get_repo(f"{OWNER}/{REPO}")
    pr = repo.create_pull(base="main", head="feature/login", title="Add login", body="Closes #1")
    assert pr.head.ref == "feature/login" and pr.base.ref == "main" and not pr.merged
    pr.create_review(body="Please add tests", event="REQUEST_CHANGES")
    pr.create_review_comment("Rename this", pr.head.sha, "app/login.py", line=12)
    pr.create_issue_comment("Working on it")
    sim.state.add_review(OWNER, REPO, pr.number, user="alice", body="LGTM", state="APPROVED")
    sim.state.add_review_comment(OWNER, REPO, pr.number, user="alice", body="nit", line=3)
    sim.state.add_issue_comment(OWNER, REPO, pr.number, user="alice", body="Thanks")

    fetched = repo.get_pull(pr.number)
    reviews = list(fetched.get_reviews())
    assert [(r.user.login, r.state, r.body) for r in reviews] == [
        ("broker-bot", "CHANGES_REQUESTED", "Please add tests"),
        ("broker-bot", "COMMENTED", ""),  # GitHub wraps a lone review comment in a review
        ("alice", "APPROVED", "LGTM"),
        ("alice", "COMMENTED", ""),
    ]
    comments = list(fetched.get_review_comments())
    assert [(c.user.login, c.path, c.line, c.body) for c in comments] == [
        ("broker-bot", "app/login.py", 12, "Rename this"),
        ("alice", "README.md", 3, "nit"),
    ]
    assert comments[0].pull_request_review_id == reviews[1].id
    assert [c.body for c in fetched.get_issue_comments()] == ["Working on it", "Thanks"]
    assert fetched.comments == 2 and fetched.review_comments == 2

    with pytest.raises(github.GithubException) as dup:
        repo.create_pull(base="main", head="feature/login", title="Again")
    assert dup.value.status == 422
    fetched.merge()
    assert repo.get_pull(pr.number).merged
    assert repo.get_issue(1).state == "closed"  # "Closes #1" on the default branch


# ----- faults -----------------------------------------------------------------------------------


def test_latency_fault_scoped_by_path(sim: Simulator, http: requests.Session) -> None:
    sim.faults.add_latency(300, path=r"/issues$")
    start = time.monotonic()
    assert http.get(url(sim, f"/repos/{OWNER}/{REPO}/issues")).status_code == 200
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    assert http.get(url(sim, f"/repos/{OWNER}/{REPO}")).status_code == 200
    assert time.monotonic() - start < 0.3
    sim.faults.clear()
    assert not sim.faults


def test_error_fault_for_next_n_requests(sim: Simulator, http: requests.Session) -> None:
    sim.faults.add_error(503, count=2, method="GET")
    target = url(sim, f"/repos/{OWNER}/{REPO}/issues/1")
    assert http.patch(target, json={"body": "x"}).status_code == 200  # other methods unaffected
    statuses = [http.get(target).status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    sim.faults.add_error(502, probability=1.0)
    failed = http.get(target)
    assert failed.status_code == 502 and "message" in failed.json()
    sim.faults.clear()
    assert http.get(target).status_code == 200
    assert sim.stats.snapshot()["by_status"]["503"] == 2


def test_error_fault_surfaces_in_pygithub(sim: Simulator, gh: github.Github) -> None:
    sim.faults.add_error(502)
    with pytest.raises(github.GithubException) as err:
        gh.get_repo(f"{OWNER}/{REPO}")
    assert err.value.status == 502
    sim.faults.clear()
    assert gh.get_repo(f"{OWNER}/{REPO}").default_branch == "main"


def test_timeout_fault_makes_client_time_out(sim: Simulator, http: requests.Session) -> None:
    sim.faults.add_timeout(5, count=1)
    target = url(sim, f"/repos/{OWNER}/{REPO}")
    with pytest.raises(requests.exceptions.ReadTimeout):
        http.get(target, timeout=0.3)
    sim.faults.clear()  # also wakes the hanging request
    assert http.get(target, timeout=2).status_code == 200


def test_primary_rate_limit_fault(sim: Simulator, gh: github.Github) -> None:
    reset_at = int(time.time()) + 120
    sim.faults.add_primary_rate_limit(reset_at=reset_at)
    with pytest.raises(github.RateLimitExceededException) as limited:
        gh.get_repo(f"{OWNER}/{REPO}")
    headers = limited.value.headers or {}
    assert limited.value.status == 403
    assert headers["x-ratelimit-remaining"] == "0"
    assert headers["x-ratelimit-reset"] == str(reset_at)
    assert limited.value.data["message"].startswith("API rate limit exceeded for user")
    sim.faults.clear()
    assert gh.get_repo(f"{OWNER}/{REPO}").name == REPO
    assert sim.stats.snapshot()["rate_limited"] == 1


def test_secondary_rate_limit_fault(sim: Simulator, http: requests.Session) -> None:
    sim.faults.add_secondary_rate_limit(count=2, retry_after=7)
    target = url(sim, f"/repos/{OWNER}/{REPO}")
    for _ in range(2):
        limited = http.get(target)
        assert limited.status_code == 403 and limited.headers["Retry-After"] == "7"
        assert limited.json()["message"].startswith("You have exceeded a secondary rate limit")
        assert int(limited.headers["X-RateLimit-Remaining"]) > 0
    assert http.get(target).status_code == 200


# ----- quota, auth, stats -----------------------------------------------------------------------


def test_quota_exhaustion_and_reset_header() -> None:
    with Simulator(SEED, rate_limit=3) as sim, requests.Session() as http:
        http.headers.update(AUTH)
        target = url(sim, f"/repos/{OWNER}/{REPO}")
        remaining = [http.get(target).headers["X-RateLimit-Remaining"] for _ in range(3)]
        assert remaining == ["2", "1", "0"]
        refused = http.get(target)
        assert refused.status_code == 403
        assert refused.headers["X-RateLimit-Remaining"] == "0"
        assert int(refused.headers["X-RateLimit-Reset"]) > time.time()
        assert refused.json()["message"].startswith("API rate limit exceeded")
        assert http.get(url(sim, "/rate_limit")).json()["resources"]["core"]["remaining"] == 0
        other = http.get(target, headers={"Authorization": "token other"})
        assert other.status_code == 200  # quotas are per token
        client = make_client(sim)
        try:
            with pytest.raises(github.RateLimitExceededException):
                client.get_repo(f"{OWNER}/{REPO}")
        finally:
            client.close()


def test_tokens_map_to_logins() -> None:
    with Simulator(SEED, tokens={"good": "agent-1"}) as sim:
        client = make_client(sim, token="good")
        bad = make_client(sim, token="bad")
        try:
            assert client.get_user().login == "agent-1"
            issue = client.get_repo(f"{OWNER}/{REPO}").create_issue("From agent")
            assert issue.user.login == "agent-1"
            with pytest.raises(github.BadCredentialsException):
                bad.get_repo(f"{OWNER}/{REPO}")
        finally:
            client.close()
            bad.close()


def test_stats_by_route_status_and_reset(sim: Simulator, http: requests.Session) -> None:
    http.get(url(sim, f"/repos/{OWNER}/{REPO}/issues/1"))
    http.get(url(sim, f"/repos/{OWNER}/{REPO}/issues/2"))
    http.get(url(sim, f"/repos/{OWNER}/{REPO}/issues/404"))
    http.post(url(sim, f"/repos/{OWNER}/{REPO}/issues/1/labels"), json=["P0"])
    snapshot = sim.stats.snapshot()
    assert snapshot["total"] == 4
    assert snapshot["by_route"] == {
        "GET /repos/{owner}/{repo}/issues/{number}": 3,
        "POST /repos/{owner}/{repo}/issues/{number}/labels": 1,
    }
    assert snapshot["by_status"] == {"200": 3, "404": 1}
    assert snapshot["by_method"] == {"GET": 3, "POST": 1}
    sim.stats.reset()
    assert sim.stats.snapshot()["total"] == 0


# ----- control API, seeds, CLI ------------------------------------------------------------------


def test_control_api_over_http(sim: Simulator, http: requests.Session) -> None:
    control = url(sim, "/_sim")
    created = http.post(
        f"{control}/issues",
        json={"owner": OWNER, "repo": REPO, "title": "Via control", "labels": ["P0"]},
    )
    assert created.status_code == 201 and created.json()["number"] == 4
    patched = http.patch(f"{control}/issues/{OWNER}/{REPO}/4", json={"state": "closed"})
    assert patched.json()["state"] == "closed"

    http.post(f"{control}/faults", json={"type": "error", "status": 503, "count": 1})
    assert http.get(url(sim, f"/repos/{OWNER}/{REPO}")).status_code == 503
    http.post(f"{control}/faults", json={"faults": [{"type": "error", "status": 500}]})
    assert http.get(f"{control}/faults").json()["faults"][0]["status"] == 500
    assert http.get(url(sim, f"/repos/{OWNER}/{REPO}")).status_code == 500
    assert http.delete(f"{control}/faults").status_code == 200
    assert http.get(url(sim, f"/repos/{OWNER}/{REPO}")).status_code == 200

    stats = http.get(f"{control}/stats").json()
    assert stats["total"] == 3  # control calls are neither counted nor faulted
    assert stats["by_status"] == {"503": 1, "500": 1, "200": 1}
    http.post(f"{control}/stats/reset")
    assert http.get(f"{control}/stats").json()["total"] == 0


def test_load_seed_from_text_and_demo_file(tmp_path: Path) -> None:
    text = "repositories:\n  - owner: a\n    name: b\n    issues:\n      - title: T\n"
    assert load_seed(text)["repositories"][0]["issues"][0]["title"] == "T"
    path = tmp_path / "seed.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_seed(path) == load_seed(str(path))

    demo = load_seed(DEMO_SEED_PATH)
    with Simulator(demo) as sim:
        issues, total = sim.state.list_issues("demo", "sandbox", state="all", per_page=100)
    assert 10 <= total <= 16
    bodies = [i["body"] for i in issues]
    assert any("## 成果物" in b and "作業ブランチ (Feature Branch):" in b for b in bodies)
    assert any("## Deliverables" in b and "Branch: feature/" in b for b in bodies)
    assert sum(1 for b in bodies if "feature/" not in b) >= 2  # the story and an unassignable one
    labels = {name["name"] for issue in issues for name in issue["labels"]}
    assert {"P0", "P1", "P2", "BACKENDCODER", "FRONTENDCODER", "TESTER", "story"} <= labels


def test_generate_issues_shape() -> None:
    issues = generate_issues(6, start=10, roles=["BACKENDCODER", "TESTER"])
    assert [i["number"] for i in issues] == list(range(10, 16))
    assert issues[0]["labels"] == ["P0", "BACKENDCODER"]
    assert issues[1]["labels"] == ["P1", "TESTER"]
    assert "Branch: feature/issue-10" in issues[0]["body"]


def test_cli_serves_and_stops_on_sigterm() -> None:
    command = [sys.executable, "-m", "github_broker.simulator", "--port", "0", "--empty"]
    command += ["--generate", "3", "--repo", "cli/demo", "--log-level", "WARNING"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            base_url = proc.stdout.readline().strip()
            assert base_url.startswith("http://127.0.0.1:")
            with requests.get(f"{base_url}/repos/cli/demo/issues", headers=AUTH) as answer:
                assert [i["number"] for i in answer.json()] == [3, 2, 1]
            with requests.get(f"{base_url}/_sim/stats") as stats:
                assert json.loads(stats.text)["total"] == 1
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0


def test_since_listing_reads_the_update_log_like_a_full_scan() -> None:
    """`since` listings (issues) and pull listings read candidate records from indexes
    (update log, pull numbers) instead of every record; they must list what a full scan
    lists, whatever the order of changes: past-dated creations, a clock that steps back,
    deletions, many changes per issue (the log's rebuild)."""
    import random

    from github_broker.simulator.state import SimState

    rng = random.Random(7)
    moment = [datetime(2026, 1, 1, tzinfo=UTC)]
    state = SimState(clock=lambda: moment[0])
    state.add_repo(OWNER, REPO)
    times: list[datetime] = []

    def brute(since: datetime, kind: str) -> list[int]:
        text = since.strftime("%Y-%m-%dT%H:%M:%SZ")
        recs = state.repo(OWNER, REPO).issues.values()
        keep = [r for r in recs if r["state"] == "open" and r["updated_at"] >= text]
        if kind == "pulls":
            keep = [r for r in recs if r["pull"] is not None and r["state"] == "open"]
            return sorted(r["number"] for r in keep)
        return [r["number"] for r in sorted(keep, key=lambda r: (r["updated_at"], r["number"]))]

    for step in range(600):
        moment[0] += timedelta(seconds=rng.choice([0, 0, 1, 3]))
        if rng.random() < 0.03:
            moment[0] -= timedelta(seconds=5)  # the clock steps back
        times.append(moment[0])
        numbers = list(state.repo(OWNER, REPO).issues)
        roll = rng.random()
        if roll < 0.3 or not numbers:
            past = moment[0] - timedelta(seconds=rng.randint(0, 50)) if rng.random() < 0.2 else None
            state.create_issue(OWNER, REPO, title=f"t{step}", updated_at=past, created_at=past)
        elif roll < 0.35:
            state.create_pull(OWNER, REPO, title=f"p{step}", head=f"b{step}")
        elif roll < 0.4:
            state.delete_issue(OWNER, REPO, rng.choice(numbers))
        else:
            state.update_issue(OWNER, REPO, rng.choice(numbers), body=f"b{step}")
        if step % 7 == 0:
            since = rng.choice(times)
            listed, _ = state.list_issues(
                OWNER, REPO, since=since, sort="updated", direction="asc", per_page=100
            )
            assert [i["number"] for i in listed] == brute(since, "issues")[:100]
            pulls, _ = state.list_pulls(OWNER, REPO, sort="created", direction="asc", per_page=100)
            assert sorted(p["number"] for p in pulls) == brute(since, "pulls")[:100]
    # The log is in use, not bypassed: a listing builds it and a change appends to it.
    state.list_issues(OWNER, REPO, since=moment[0])
    log = state.repo(OWNER, REPO).updates
    assert log is not None
    before = len(log)
    moment[0] += timedelta(seconds=1)
    state.update_issue(OWNER, REPO, next(iter(state.repo(OWNER, REPO).issues)), body="last")
    assert len(log) == before + 1 and state.repo(OWNER, REPO).updates is log
