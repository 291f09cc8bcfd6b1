"""Odd input at the HTTP edge: label-like ids, oversized and malformed bodies, odd tokens and
numbers. Refused with a 4xx in the API's shape, before any Redis work."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from github_broker.api.app import create_app
from github_broker.api.schemas import MAX_LIST_ITEMS, Readiness
from github_broker.errors import ConfigError
from github_broker.gateway import GitHubGateway
from github_broker.leader.sync import Syncer
from github_broker.settings import Settings
from github_broker.simulator import Simulator
from github_broker.store import Store
from github_broker.ui.controls import CONTROLS
from tests.conftest import free_port
from tests.world import ONE_ISSUE, simulated

AGENT_TOKEN = "tok-1-0123456789ab"
AGENT = {"Authorization": f"Bearer {AGENT_TOKEN}"}
ADMIN = {"Authorization": "Bearer adm"}


@pytest.fixture
def sim() -> Iterator[Simulator]:
    with simulated(ONE_ISSUE) as s:
        yield s


def _synced(settings: Settings) -> None:
    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            await Syncer(settings, store, gateway).sync(settings.repositories[0])
        finally:
            await store.close()
            gateway.close()

    asyncio.run(run())


@pytest.fixture
def app(
    sim: Simulator, redis_url: str, make_settings: Callable[..., Settings]
) -> Callable[..., TestClient]:
    def make(sync: bool = True, **overrides: Any) -> TestClient:
        github = {"base_url": sim.base_url, **overrides.pop("github", {})}
        server = {
            "run_poller": False,
            "agent_tokens": {"a1": "tok-1-0123456789ab", "a2": "tok-2-0123456789ab"},
            "admin_token": "adm",
            **overrides.pop("server", {}),
        }
        # Generous Redis bounds: these tests are about HTTP answers, and a worker starved of
        # CPU by the rest of the suite once took over the 1 s connect bound to reach Redis.
        redis_cfg = {"url": redis_url, "connect_timeout_s": 5.0, "socket_timeout_s": 5.0}
        settings = make_settings(redis=redis_cfg, github=github, server=server, **overrides)
        if sync:
            _synced(settings)
        return TestClient(create_app(settings))

    return make


@pytest.fixture
def client(app: Callable[..., TestClient]) -> Iterator[TestClient]:
    with app() as c:
        yield c


#: Connection upkeep the app's background tasks send on their own (the long-poll waker's
#: subscription and pings, client set-up): never work done for a request.
CONNECTION_COMMANDS = ("info", "ping", "subscribe", "unsubscribe", "client", "hello", "select")


def redis_calls(url: str) -> int:
    """Data commands Redis has run so far (scripts included), not connection upkeep."""
    r = redis.Redis.from_url(url)
    try:
        stats = r.info("commandstats")
    finally:
        r.close()
    return sum(
        int(v["calls"])
        for k, v in stats.items()
        if k.removeprefix("cmdstat_").split("|")[0] not in CONNECTION_COMMANDS
    )


def problem(r: Any) -> dict[str, Any]:
    data: dict[str, Any] = r.json()
    assert set(data) == {"detail", "reason"}, data
    return data


# --- agent ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "agent_id",
    ["p0", "P12", "backendcoder", "Needs-Review", "IN-PROGRESS", "Story", "EPIC", "Review-Done"],
)
def test_agent_id_equal_to_a_label_in_any_case_is_refused(
    app: Callable[..., TestClient], agent_id: str
) -> None:
    with app(server={"agent_tokens": {}, "admin_token": None}) as c:
        r = c.post("/request-task", json={"agent_id": agent_id})
    assert r.status_code == 422
    assert "case-insensitively" in problem(r)["detail"]


def test_agent_id_longer_than_a_github_label_is_refused(client: TestClient) -> None:
    r = client.post("/request-task", json={"agent_id": "a" * 51}, headers=AGENT)
    assert r.status_code == 422
    assert problem(r)["reason"] == "invalid_request"


@pytest.mark.parametrize("agent_id", ["p0", "backendcoder", "Needs-Review", "a" * 51, "x y"])
def test_configured_token_ids_that_cannot_be_labels_stop_startup(
    make_settings: Callable[..., Settings], agent_id: str
) -> None:
    with pytest.raises(ConfigError) as err:
        make_settings(server={"agent_tokens": {agent_id: "tok-0123456789abcdef"}})
    # An id that is no agent id at all may be a token written in its place: not quoted.
    assert repr(agent_id) in str(err.value) or "entry 1: the map is agent id -> token" in str(
        err.value
    )


# --- bounds --------------------------------------------------------------------------------------


def test_roles_are_deduplicated_and_bounded_before_any_redis_work(
    client: TestClient, redis_url: str
) -> None:
    many = ["BACKENDCODER"] * MAX_LIST_ITEMS
    started = time.monotonic()
    r = client.post("/request-task", json={"agent_id": "a1", "roles": many}, headers=AGENT)
    elapsed = time.monotonic() - started
    assert r.status_code == 200 and r.json()["issue_id"] == 1
    assert elapsed < 5
    before = redis_calls(redis_url)
    too_many = {"agent_id": "a1", "roles": [*many, "BACKENDCODER"]}
    assert client.post("/request-task", json=too_many, headers=AGENT).status_code == 422
    unknown = {"agent_id": "a1", "roles": ["PAINTER"] * 3}
    assert client.post("/request-task", json=unknown, headers=AGENT).status_code == 422
    repos = {"agent_id": "a1", "repositories": ["acme/widgets"] * (MAX_LIST_ITEMS + 1)}
    assert client.post("/request-task", json=repos, headers=AGENT).status_code == 422
    assert redis_calls(redis_url) == before


def test_explain_refuses_unknown_or_too_many_roles_before_any_redis_work(
    client: TestClient, redis_url: str
) -> None:
    ok = client.get("/explain", params={"roles": ["BACKENDCODER"]}, headers=ADMIN)
    assert ok.status_code == 200 and ok.json()["acme/widgets"]
    before = redis_calls(redis_url)
    unknown = client.get("/explain", params={"roles": ["PAINTER"]}, headers=ADMIN)
    assert unknown.status_code == 422
    assert "unknown roles ['PAINTER']" in problem(unknown)["detail"]
    assert (
        problem(unknown)["detail"]
        == problem(
            client.post(
                "/request-task", json={"agent_id": "a1", "roles": ["PAINTER"]}, headers=AGENT
            )
        )["detail"]
    )
    empty = client.get("/explain?roles=", headers=ADMIN)
    assert empty.status_code == 422
    many = {"roles": ["BACKENDCODER"] * (MAX_LIST_ITEMS + 1)}
    assert client.get("/explain", params=many, headers=ADMIN).status_code == 422
    assert redis_calls(redis_url) == before


@pytest.mark.parametrize("verb", ["heartbeat", "complete", "release"])
def test_lease_calls_refuse_an_agent_id_equal_to_a_label_before_any_redis_work(
    app: Callable[..., TestClient], redis_url: str, verb: str
) -> None:
    with app(server={"agent_tokens": {}, "admin_token": None}) as c:
        before = redis_calls(redis_url)
        r = c.post(f"/tasks/acme/widgets/1/{verb}", json={"agent_id": "Needs-Review", "token": "t"})
        assert redis_calls(redis_url) == before
    assert r.status_code == 422
    assert "case-insensitively" in problem(r)["detail"]


def test_oversized_body_gets_413_before_any_redis_work(client: TestClient, redis_url: str) -> None:
    huge = b'{"agent_id": "a1", "roles": [' + b'"BACKENDCODER",' * 700_000 + b'"X"]}'
    before = redis_calls(redis_url)
    r = client.post(
        "/request-task",
        content=huge,
        headers={**AGENT, "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert problem(r)["reason"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed size counts
        for _ in range(20):
            yield b" " * 100_000
        yield b'{"agent_id": "a1"}'

    r = client.post(
        "/request-task", content=chunks(), headers={**AGENT, "Content-Type": "application/json"}
    )
    assert r.status_code == 413
    assert redis_calls(redis_url) == before


@pytest.mark.parametrize(
    "raw",
    [b'{"agent_id": "a1\xff\xfe"}', b"[" * 100_000 + b"]" * 100_000, b'{"agent_id": '],
    ids=["bad-utf8", "deep", "truncated"],
)
def test_unreadable_json_gets_the_same_422_as_malformed_json(
    client: TestClient, raw: bytes
) -> None:
    r = client.post(
        "/request-task", content=raw, headers={**AGENT, "Content-Type": "application/json"}
    )
    assert r.status_code == 422
    assert problem(r)["reason"] == "invalid_request"


# --- tokens --------------------------------------------------------------------------------------


def test_any_token_that_is_not_configured_is_401(client: TestClient) -> None:
    odd = {"Authorization": "Bearer tök-ünïcode".encode()}
    body = {"agent_id": "a1"}
    assert client.post("/request-task", json=body, headers=odd).status_code == 401  # type: ignore[arg-type]
    assert client.get("/status", headers=odd).status_code == 401  # type: ignore[arg-type]
    unknown = {"Authorization": "Bearer nope"}
    assert problem(client.get("/status", headers=unknown))["detail"].startswith("unknown token")
    assert client.get("/status", headers=unknown).status_code == 401
    assert client.get("/explain", headers=unknown).status_code == 401
    # Configured tokens in the wrong place: 403.
    assert client.get("/status", headers=AGENT).status_code == 403
    assert client.post("/request-task", json=body, headers=ADMIN).status_code == 403
    assert client.get("/status", headers=ADMIN).status_code == 200


# --- numbers, branches, /ready, OpenAPI ----------------------------------------------------------


@pytest.mark.parametrize("number", ["0", "-1", str(2**64), "9007199254740992"])
def test_odd_issue_numbers_are_422_not_expired(
    client: TestClient, redis_url: str, number: str
) -> None:
    before = redis_calls(redis_url)
    for action in ("heartbeat", "complete", "release"):
        r = client.post(
            f"/tasks/acme/widgets/{number}/{action}",
            json={"agent_id": "a1", "token": "t"},
            headers=AGENT,
        )
        assert r.status_code == 422, r.text
        assert problem(r)["reason"] == "invalid_request"
    assert redis_calls(redis_url) == before


def test_fix_branch_follows_the_body_branch_rules(client: TestClient) -> None:
    fix: dict[str, Any] = {
        "repository": "acme/widgets",
        "issue": 1,
        "pr": 5,
        "comments": [{"author": "maint", "body": "please fix"}],
    }
    for bad in ("../../x y", "main", "-x", "a..b", "x.lock"):
        r = client.post("/tasks/fix", json={**fix, "branch": bad}, headers=ADMIN)
        assert r.status_code == 422, (bad, r.text)
        assert "branch" in problem(r)["detail"]
    r = client.post("/tasks/fix", json={**fix, "branch": "feature/issue-1"}, headers=ADMIN)
    assert r.status_code == 202


def test_ready_answers_its_documented_schema_when_not_ready(
    app: Callable[..., TestClient],
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with app(sync=False, github={"base_url": dead, "timeout_s": 1}) as c:
        r = c.get("/ready")
        spec = c.get("/openapi.json").json()
    assert r.status_code == 503
    assert Readiness.model_validate(r.json()).checks["redis"] == "ok"
    ready = spec["paths"]["/ready"]["get"]["responses"]
    assert ready["503"]["content"]["application/json"]["schema"]["$ref"].endswith("/Readiness")
    assert ready["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/Readiness")


def test_openapi_lists_every_status_the_api_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()["paths"]
    assert set(spec["/request-task"]["post"]["responses"]) >= {
        "200",
        "204",
        "401",
        "403",
        "404",
        "413",
        "422",
        "503",
    }
    for action in ("heartbeat", "complete", "release"):
        codes = spec[f"/tasks/{{owner}}/{{repo}}/{{number}}/{action}"]["post"]["responses"]
        assert set(codes) >= {"200", "401", "403", "404", "409", "413", "422", "503"}


#: Each route's statuses beyond its success: 503 where Redis is read, 401/403 where a token is
#: checked (401 alone: the webhook's signature), 413 everywhere (BodyLimit caps every request),
#: 422 where a path, query or body is parsed, 409 where a lease is refused.
EXTRA_STATUSES: dict[tuple[str, str], set[int]] = {
    ("GET", "/health"): {413},
    ("GET", "/ready"): {413, 503},
    ("POST", "/request-task"): {204, 401, 403, 404, 409, 413, 422, 503},
    **{
        ("POST", f"/tasks/{{owner}}/{{repo}}/{{number}}/{verb}"): {
            401,
            403,
            404,
            409,
            413,
            422,
            503,
        }
        for verb in ("heartbeat", "complete", "release")
    },
    ("POST", "/tasks/{owner}/{repo}/{number}/credential"): {401, 403, 404, 409, 413, 422, 503},
    ("POST", "/tasks/fix"): {401, 403, 404, 413, 422, 503},
    ("GET", "/metrics"): {413, 503},
    ("GET", "/status"): {401, 403, 413, 503},
    ("GET", "/explain"): {401, 403, 404, 413, 422, 503},
    ("POST", "/github/webhook"): {401, 404, 413, 422, 503},
    ("GET", "/"): {413},
    ("GET", "/favicon.ico"): {413},
    ("GET", "/ui"): {303, 413, 503},
    ("GET", "/ui/login"): {413},
    ("POST", "/ui/login"): {303, 401, 413, 415, 429, 503},
    ("POST", "/ui/logout"): {413, 503},
    ("POST", "/ui/login/github"): {303, 401, 403, 404, 413, 429, 503},
    ("POST", "/ui/login/github/device"): {200, 404, 413, 429, 503},
    ("POST", "/ui/login/github/device/poll"): {200, 303, 401, 403, 404, 413, 503},
    ("GET", "/ui/agents/{agent_id}"): {303, 413, 422, 503},
    ("GET", "/ui/live"): {401, 413, 422, 503},
    **{
        ("POST", f"/ui/actions/{action}"): {303, 401, 403, 413, 415, 422, 503}
        | ({404} if control.scope in ("issue", "repo") else set())
        for action, control in CONTROLS.items()
    },
    **{
        ("POST", f"/admin/tasks/{{owner}}/{{repo}}/{{number}}/{verb}"): {
            401,
            403,
            404,
            413,
            422,
            503,
        }
        for verb in ("revoke", "reassign", "note", "retry")
    },
    **{
        ("POST", f"/admin/agents/{{agent_id}}/{verb}"): {401, 403, 413, 422, 503}
        for verb in ("pause", "stop", "resume")
    },
    **{
        ("POST", f"/admin/repos/{{owner}}/{{repo}}/{verb}"): {401, 403, 404, 413, 422, 503}
        for verb in ("pause", "resume")
    },
    **{
        ("POST", f"/admin/broker/{verb}"): {401, 403, 413, 422, 503} for verb in ("pause", "resume")
    },
    ("GET", "/admin/audit"): {401, 403, 413, 422, 503},
    ("GET", "/admin/agents"): {401, 403, 413, 503},
}
#: Every GET route answers HEAD alike, without the body.
EXTRA_STATUSES |= {
    ("HEAD", path): codes for (method, path), codes in EXTRA_STATUSES.items() if method == "GET"
}


def _operations(spec: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    return {
        (method.upper(), path): {int(code) for code in op["responses"]}
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    }


def _media_types(spec: dict[str, Any]) -> dict[tuple[str, str], set[tuple[int, str | None]]]:
    """(status, media type) each operation declares; None where a status has no content."""
    return {
        (method.upper(), path): {
            (int(code), media)
            for code, answer in op["responses"].items()
            for media in (answer.get("content") or {None: None})
        }
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
    }


def _answers(c: TestClient, method: str, path: str) -> set[tuple[int, str | None]]:
    """What one route answers to odd and ordinary requests, as (status, media type; None for
    an empty body): no, unknown, agent and admin tokens; no body, a JSON body, a broken one,
    a form, one over the body cap."""
    url = path.format(owner="acme", repo="widgets", number=1, agent_id="a1")
    bodies: list[tuple[bytes | None, str | None]] = [
        (None, None),
        (b'{"agent_id": "a1", "token": "t"}', "application/json"),
        (b"{", "application/json"),
        (b"token=adm", "application/x-www-form-urlencoded"),
        (b" " * (2 * 1024 * 1024), "application/json"),
    ]
    tokens = [{}, {"Authorization": "Bearer nope"}, AGENT, ADMIN]
    seen = set()

    def media(r: Any) -> str | None:
        if not r.content:
            return None
        return str(r.headers.get("content-type", "")).split(";")[0].strip() or None

    for headers in tokens:
        for content, ctype in bodies:
            h = {**headers, **({"content-type": ctype} if ctype else {})}
            r = c.request(method, url, content=content, headers=h, follow_redirects=False)
            seen.add((r.status_code, media(r)))
    if method == "GET":
        odd = {"roles": "PAINTER", "repository": "x/y"}
        r = c.get(url, params=odd, headers=ADMIN, follow_redirects=False)
        seen.add((r.status_code, media(r)))
    return seen


def test_openapi_declares_every_status_each_route_answers(
    app: Callable[..., TestClient],
    make_settings: Callable[..., Settings],
    sim: Simulator,
) -> None:
    """Every route of the app, probed with Redis up and with Redis down: each status it
    answered is declared in the OpenAPI, and so is each known one of EXTRA_STATUSES; each
    answer's media type is declared for its status (none where the body is empty)."""
    with app() as c:
        spec = c.get("/openapi.json").json()
        declared = _operations(spec)
        kinds = {op: _answers(c, *op) for op in declared}
    dead = make_settings(
        redis={"url": f"redis://127.0.0.1:{free_port()}/0", "socket_timeout_s": 0.5},
        github={"base_url": sim.base_url},
        server={"run_poller": False, "agent_tokens": {"a1": AGENT_TOKEN}, "admin_token": "adm"},
    )
    with TestClient(create_app(dead)) as c:
        for op in declared:
            kinds[op] |= _answers(c, *op)
    answered = {op: {status for status, _ in found} for op, found in kinds.items()}
    assert set(declared) == set(EXTRA_STATUSES), "a route was added or removed: list it here"
    missing = {
        f"{method} {path}": sorted(
            (answered[(method, path)] | EXTRA_STATUSES[(method, path)]) - codes
        )
        for (method, path), codes in declared.items()
    }
    assert not {op: codes for op, codes in missing.items() if codes}, missing
    assert 503 in answered[("GET", "/metrics")]
    media = _media_types(spec)
    undeclared = {f"{m} {p}": sorted(found - media[(m, p)]) for (m, p), found in kinds.items()}
    assert not {op: kinds for op, kinds in undeclared.items() if kinds}, undeclared


def test_not_allowed_names_every_method_of_the_path(client: TestClient) -> None:
    """405's `Allow` lists each method the path takes, not only the first route's (GET and
    POST /ui/login are two routes)."""
    r = client.options("/ui/login")
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, HEAD, POST"
    assert problem(r)["detail"] == "Method Not Allowed"
    for path in ("/request-task", "/tasks/acme/widgets/1/heartbeat"):
        r = client.get(path)
        assert (r.status_code, r.headers["allow"]) == (405, "POST")


def test_head_answers_every_get_route_as_get_without_the_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = [p for p, ops in spec["paths"].items() if "get" in ops]
    assert all("head" in spec["paths"][p] for p in paths)
    for path in [*paths, "/docs", "/openapi.json", "/no/such/path"]:
        got = client.get(path, headers=ADMIN, follow_redirects=False)
        head = client.head(path, headers=ADMIN, follow_redirects=False)
        assert head.status_code == got.status_code, path
        assert head.content == b"", path
        for name in ("content-type", "location", "allow"):
            assert head.headers.get(name) == got.headers.get(name), (path, name)
        if path in ("/health", "/ui/login", "/docs", "/openapi.json"):  # the others move
            assert head.headers.get("content-length") == got.headers.get("content-length")
    r = client.head("/request-task")
    assert (r.status_code, r.headers["allow"], r.content) == (405, "POST", b"")


@pytest.mark.parametrize("hot", [True, False], ids=["hot path", "declared route"])
@pytest.mark.parametrize("wait", ["false", "true", '"0"', '"5"', "null"])
def test_wait_seconds_is_a_number_not_a_boolean_or_string(
    client: TestClient, redis_url: str, hot: bool, wait: str
) -> None:
    """The OpenAPI says `number`: `false` or `"5"` are refused, not read as 0 or 5."""
    if not hot:
        client.app.hot = None  # type: ignore[attr-defined]
    before = redis_calls(redis_url)
    r = client.post(
        "/request-task",
        content=f'{{"agent_id": "a1", "wait_seconds": {wait}}}',
        headers={**AGENT, "content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert "wait_seconds" in problem(r)["detail"]
    assert redis_calls(redis_url) == before


def test_fix_numbers_are_numbers_and_branch_is_never_empty(
    client: TestClient, redis_url: str
) -> None:
    fix: dict[str, Any] = {
        "repository": "acme/widgets",
        "issue": 1,
        "pr": 5,
        "comments": [{"author": "maint", "body": "please fix", "line": 3}],
    }
    before = redis_calls(redis_url)
    for odd in (
        {"issue": "1"},
        {"pr": True},
        {"issue": 1.5},
        {"comments": [{**fix["comments"][0], "line": "3"}]},
        {"comments": [{**fix["comments"][0], "line": False}]},
    ):
        r = client.post("/tasks/fix", json={**fix, **odd}, headers=ADMIN)
        assert r.status_code == 422, (odd, r.text)
        assert "valid integer" in problem(r)["detail"], odd
    assert redis_calls(redis_url) == before
    spec = client.get("/openapi.json").json()
    branch = spec["components"]["schemas"]["FixRequest"]["properties"]["branch"]["anyOf"][0]
    assert branch["minLength"] == 1  # "" is refused: say so
    line = spec["components"]["schemas"]["FixComment"]["properties"]["line"]["anyOf"][0]
    assert (line["type"], line["minimum"], line["maximum"]) == ("integer", 1, 2**53 - 1)
    whole = {**fix, "pr": 5.0, "comments": [{**fix["comments"][0], "line": 3.0}]}
    assert client.post("/tasks/fix", json=whole, headers=ADMIN).status_code == 202  # integers


def test_openapi_names_the_roles_and_repositories_a_request_may_name(client: TestClient) -> None:
    """An unknown role or repository is a 422 (below), so the OpenAPI lists the valid ones
    (this deployment's agents.yml and repositories) and the bounds of /explain's `roles`, as
    for the body's."""
    spec = client.get("/openapi.json").json()
    roles = client.app.state.services.settings.roles  # type: ignore[attr-defined]
    body = spec["components"]["schemas"]["TaskRequest"]["properties"]
    assert body["roles"]["anyOf"][0]["items"]["enum"] == roles
    assert body["repositories"]["anyOf"][0]["items"]["enum"] == ["acme/widgets"]
    (query,) = [p for p in spec["paths"]["/explain"]["get"]["parameters"] if p["name"] == "roles"]
    array = query["schema"]["anyOf"][0]
    assert array["maxItems"] == MAX_LIST_ITEMS
    assert (array["items"]["minLength"], array["items"]["maxLength"]) == (1, 100)
    assert array["items"]["enum"] == roles


def test_openapi_bounds_are_json_schema_keywords(client: TestClient) -> None:
    """Pydantic writes a bound it cannot place as its own `ge`/`le` (a validator in the way),
    which no client reads: every bound is `minimum`/`maximum` and friends."""
    leaked = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if not where.endswith(".properties"):  # there the keys are field names
                leaked.extend(f"{where}.{k}" for k in ("ge", "le", "gt", "lt") if k in node)
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    spec = client.get("/openapi.json").json()
    walk(spec["components"]["schemas"], "schemas")
    walk(spec["paths"], "paths")
    assert not leaked, leaked


def test_every_422_carries_the_invalid_request_reason(client: TestClient) -> None:
    """Refusals found after parsing (unknown role or repository) answer like the parser's."""
    for body in (
        {"agent_id": "a1", "roles": ["PAINTER"]},
        {"agent_id": "a1", "repositories": ["nobody/else"]},
        {"agent_id": "a1", "wait_seconds": 99},
    ):
        r = client.post("/request-task", json=body, headers=AGENT)
        assert (r.status_code, problem(r)["reason"]) == (422, "invalid_request"), body
    r = client.get("/explain", params={"roles": ["PAINTER"]}, headers=ADMIN)
    assert (r.status_code, problem(r)["reason"]) == (422, "invalid_request")


@pytest.mark.parametrize("raw", [b'{"agent_id": ', b"   ", b'{"agent_id": "a1", "token": "t"} x'])
def test_malformed_json_on_a_lease_call_says_where(client: TestClient, raw: bytes) -> None:
    """Not "`3`: JSON decode error": the message names the body and what is wrong there."""
    r = client.post(
        "/tasks/acme/widgets/1/heartbeat",
        content=raw,
        headers={**AGENT, "content-type": "application/json"},
    )
    assert r.status_code == 422
    detail = problem(r)["detail"]
    assert detail.startswith("invalid request: `body`: invalid JSON at character "), detail


#: Bodies and content types the hot path must answer exactly as the declared route does.
PARITY_CASES: list[tuple[str, bytes, str | None]] = [
    ("json", b'{"agent_id": "a1", "wait_seconds": 0}', "application/json"),
    ("no content-type", b'{"agent_id": "a1"}', None),
    ("+json subtype", b'{"agent_id": "a1"}', "application/vnd.agent+json"),
    ("utf-8 byte-order mark", b'\xef\xbb\xbf{"agent_id": "a1"}', "application/json"),
    ("utf-16", '{"agent_id": "a1"}'.encode("utf-16"), "application/json"),
    ("text/plain", b'{"agent_id": "a1"}', "text/plain"),
    ("form", b"agent_id=a1", "application/x-www-form-urlencoded"),
    ("wrong type", b'{"agent_id": 5}', "application/json"),
    ("label-like id", b'{"agent_id": "P1"}', "application/json"),
]


@pytest.mark.parametrize(("case", "body", "ctype"), PARITY_CASES, ids=[c[0] for c in PARITY_CASES])
def test_hot_path_answers_status_as_the_declared_route(
    app: Callable[..., TestClient], case: str, body: bytes, ctype: str | None
) -> None:
    """`POST /request-task` skips the middleware stack for the hot path; with `app.hot`
    unset the same request goes to the FastAPI route. Both give the same status, and the
    kind of answer for every refusal (the messages may word a JSON error differently)."""
    headers = {**AGENT, **({"content-type": ctype} if ctype else {})}
    with app() as c:
        hot = c.post("/request-task", content=body, headers=headers)
        assert hot.status_code in (200, 204, 403, 422), (case, hot.text)
        c.post("/tasks/acme/widgets/1/release", json={})  # ignore; next claim settles anyway
        c.app.hot = None  # type: ignore[attr-defined]
        declared = c.post("/request-task", content=body, headers=headers)
    assert hot.status_code == declared.status_code, (case, hot.text, declared.text)
    # The same headers (a 204 has no body and no length; a 200 its JSON type and length).
    assert sorted(hot.headers) == sorted(declared.headers), (case, hot.headers, declared.headers)
    if hot.status_code == 200:
        assert hot.headers["content-type"] == declared.headers["content-type"]
        assert int(hot.headers["content-length"]) == len(hot.content)
    if hot.status_code >= 400:
        assert hot.json()["detail"] and declared.json()["detail"]
        assert hot.headers["content-type"] == declared.headers["content-type"]


def test_hot_path_json_rule_is_fastapis_for_odd_content_types(
    app: Callable[..., TestClient],
) -> None:
    """Only application/json and application/*+json are read as JSON: `text/json` or a type
    without a `/` is not (as `email.message` reads the header for FastAPI)."""
    with app() as c:
        for ctype in ("text/json", "json", "application/json/x", "Application/JSON; charset=x"):
            headers = {**AGENT, "content-type": ctype}
            body = b'{"agent_id": "a1"}'
            hot = c.post("/request-task", content=body, headers=headers)
            c.app.hot = None  # type: ignore[attr-defined]
            declared = c.post("/request-task", content=body, headers=headers)
            c.app.take_request_task(1 << 20)  # type: ignore[attr-defined]
            assert hot.status_code == declared.status_code, (ctype, hot.text, declared.text)


FORM = "application/x-www-form-urlencoded"
#: Lease calls the hot path must answer byte for byte as the declared routes do:
#: (case, path tail after /tasks/, body, content-type).
LEASE_CASES: list[tuple[str, str, bytes, str | None]] = [
    ("ok json", "acme/widgets/1/{action}", b'{"agent_id": "a1", "token": "t"}', "application/json"),
    ("no content-type", "acme/widgets/1/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("+json", "acme/widgets/1/{action}", b'{"agent_id":"a1","token":"t"}', "application/x+json"),
    ("bom", "acme/widgets/1/{action}", b'\xef\xbb\xbf{"agent_id":"a1","token":"t"}', None),
    ("utf-16", "acme/widgets/1/{action}", '{"agent_id":"a1","token":"t"}'.encode("utf-16"), None),
    ("text/plain", "acme/widgets/1/{action}", b'{"agent_id":"a1","token":"t"}', "text/plain"),
    ("text/json", "acme/widgets/1/{action}", b'{"agent_id":"a1","token":"t"}', "text/json"),
    ("form", "acme/widgets/1/{action}", b"agent_id=a1&token=t", FORM),
    ("empty body", "acme/widgets/1/{action}", b"", "application/json"),
    ("null", "acme/widgets/1/{action}", b"null", "application/json"),
    ("list", "acme/widgets/1/{action}", b"[1]", "application/json"),
    ("malformed", "acme/widgets/1/{action}", b'{"agent_id": ', "application/json"),
    ("bad utf-8", "acme/widgets/1/{action}", b'{"agent_id": "\xff"}', "application/json"),
    ("too deep", "acme/widgets/1/{action}", b"[" * 100_000, "application/json"),
    ("wrong types", "acme/widgets/1/{action}", b'{"agent_id": 5, "token": ""}', None),
    ("missing token", "acme/widgets/1/{action}", b'{"agent_id": "a1"}', None),
    ("odd reason", "acme/widgets/1/{action}", b'{"agent_id":"a1","token":"t","reason":"x"}', None),
    ("failed", "acme/widgets/1/{action}", b'{"agent_id":"a1","token":"t","reason":"failed"}', None),
    ("other agent", "acme/widgets/1/{action}", b'{"agent_id": "a2", "token": "t"}', None),
    ("label-like id", "acme/widgets/1/{action}", b'{"agent_id": "P1", "token": "t"}', None),
    ("number 0", "acme/widgets/0/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("negative", "acme/widgets/-3/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("not a number", "acme/widgets/x1/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("huge", "acme/widgets/9007199254740992/{action}", b'{"agent_id":"a1","token":"t"}', None),
    ("leading zero", "acme/widgets/007/{action}", b'{"agent_id":"a1","token":"t"}', None),
    ("bad path and body", "acme/widgets/0/{action}", b'{"agent_id": 5}', None),
    ("bad path, no body", "acme/widgets/zz/{action}", b"", None),
    ("bad path, bad json", "acme/widgets/zz/{action}", b"{", None),
    ("unknown repo", "nobody/else/1/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("odd owner", "ac%20me/w.x/1/{action}", b'{"agent_id": "a1", "token": "t"}', None),
    ("trailing slash", "acme/widgets/1/{action}/", b'{"agent_id": "a1", "token": "t"}', None),
    ("extra segment", "acme/x/widgets/1/{action}", b'{"agent_id": "a1", "token": "t"}', None),
]


@pytest.mark.parametrize("action", ["heartbeat", "complete", "release"])
@pytest.mark.parametrize(
    ("case", "tail", "body", "ctype"), LEASE_CASES, ids=[c[0] for c in LEASE_CASES]
)
def test_lease_hot_path_answers_as_the_declared_route(
    app: Callable[..., TestClient],
    action: str,
    case: str,
    tail: str,
    body: bytes,
    ctype: str | None,
) -> None:
    """The lease calls skip the middleware stack too (`app.hot_leases`); with it unset the
    same request goes to the FastAPI route: the same status, headers and bytes."""
    headers = {**AGENT, **({"content-type": ctype} if ctype else {})}
    path = "/tasks/" + tail.format(action=action)
    with app() as c:
        assert c.app.hot_leases is not None  # type: ignore[attr-defined]
        hot = c.post(path, content=body, headers=headers)
        c.app.hot_leases = None  # type: ignore[attr-defined]
        declared = c.post(path, content=body, headers=headers)
    assert (hot.status_code, hot.content) == (declared.status_code, declared.content), case
    assert hot.headers == declared.headers, case


def test_lease_hot_path_answers_a_live_lease_as_the_declared_route(
    client: TestClient,
) -> None:
    """Heartbeat and complete of a held task, on the hot path and on the declared route."""
    task = client.post("/request-task", json={"agent_id": "a1"}, headers=AGENT).json()
    lease = {"agent_id": "a1", "token": task["lease"]["token"]}
    base = f"/tasks/{task['repository']}/{task['issue_id']}"
    hot = client.post(f"{base}/heartbeat", json=lease, headers=AGENT)
    client.app.hot_leases = None  # type: ignore[attr-defined]
    declared = client.post(f"{base}/heartbeat", json=lease, headers=AGENT)
    assert hot.status_code == declared.status_code == 200
    assert hot.headers.keys() == declared.headers.keys()
    assert (
        set(hot.json())
        == set(declared.json())
        == {
            "expires_at",
            "state",
            "notes",
            "paused",
            "agent_paused",
        }
    )
    assert hot.json()["state"] == "in_progress"
    client.app.take_request_task(1 << 20)  # type: ignore[attr-defined]
    done = client.post(f"{base}/complete", json=lease, headers=AGENT)
    assert (done.status_code, done.content) == (200, b'{"status":"completed"}')
    again = client.post(f"{base}/complete", json=lease, headers=AGENT)
    assert again.status_code == 409 and again.json()["reason"] == "completed"
