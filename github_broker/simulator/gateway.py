"""The request pipeline GitHub wraps around every API call: faults, auth, quota, ETag, stats."""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from . import control, oauth
from . import routes_checks as _routes_checks  # noqa: F401  (registers its routes)
from . import routes_graph as _routes_graph  # noqa: F401  (registers its routes on ROUTER)
from . import routes_people as _routes_people  # noqa: F401  (registers its routes on ROUTER)
from . import routes_planning as _routes_planning  # noqa: F401  (registers its routes)
from .faults import ERROR, PRIMARY_RATE_LIMIT, FaultRule, Faults
from .installations import TokenScope
from .messages import ApiError, Request, Response, decode_json
from .oauth import DeviceFlow
from .ratelimit import Quota, RateLimiter
from .routes import ROUTER, Route
from .state import SimState
from .stats import Stats
from .webhooks import WebhookDispatcher

logger = logging.getLogger(__name__)

ANONYMOUS = "anonymous"
DEFAULT_LOGIN = "broker-bot"
# Reading the quota is free on GitHub and must keep working while the quota is exhausted.
_FREE_ROUTES = frozenset({"GET /rate_limit"})
GRAPHQL_ROUTE = "POST /graphql"
GRAPHQL_BUCKET = "graphql:"
_APP_JWT_ROUTES = frozenset({"POST /app/installations/{installation_id}/access_tokens"})
_ERROR_MESSAGES = {
    500: "Internal Server Error",
    502: "Server Error",
    503: "Service Unavailable",
    504: "We couldn't respond to your request in time. Sorry about that.",
}
_SECONDARY_MESSAGE = (
    "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
    "If you reach out to GitHub Support for help, please include the request ID {rid}."
)


@dataclass
class Services:
    """Everything a request may touch; one per Simulator."""

    state: SimState
    faults: Faults
    stats: Stats
    limiter: RateLimiter
    tokens: dict[str, str] | None = None
    #: GitHub Apps: app id -> PEM public key that verifies its JWTs (None: no App support).
    apps: dict[int, str] | None = None
    #: Webhook hooks and deliveries (simulator/webhooks.py).
    webhooks: WebhookDispatcher | None = None
    #: The OAuth device flow of GitHub's web host (simulator/oauth.py).
    device: DeviceFlow | None = None
    #: Installation tokens limited to some repositories and permissions (installations.py).
    scopes: dict[str, TokenScope] = field(default_factory=dict)
    #: Revoked tokens, when any token is accepted (`tokens` None).
    revoked: set[str] = field(default_factory=set)


class Gateway:
    """Turns one raw HTTP request into a Response; the socket layer only reads and writes."""

    def __init__(self, services: Services) -> None:
        self.svc = services
        self._request_ids = itertools.count(1)

    def process(
        self, method: str, target: str, headers: Mapping[str, str], raw_body: bytes, base_url: str
    ) -> Response:
        """``headers`` must have lower-case names."""
        split = urlsplit(target)
        path = self.svc.state.path_by_name(split.path or "/")
        query = parse_qs(split.query, keep_blank_values=True)
        if path == "/_sim" or path.startswith("/_sim/"):
            try:
                return control.handle(self.svc, method, path, raw_body, base_url)
            except Exception:
                logger.exception("control call failed: %s %s", method, target)
                return ApiError(500, "Internal Server Error").to_response()
        if path in oauth.PATHS and self.svc.device is not None:
            # GitHub's web host, not its API: no token, no quota, a form body.
            try:
                return self.svc.device.handle(method, path, raw_body, base_url)
            except ApiError as e:
                return e.to_response()

        if not headers.get("user-agent", "").strip():
            # GitHub refuses anonymous clients before anything else, quota included.
            return Response(403, {"message": _NO_USER_AGENT}, {"Content-Type": "text/plain"})
        moved = self.svc.state.moved_path(path)
        if moved is not None:
            return _moved_permanently(base_url, moved, split.query)
        route, params = ROUTER.match(method, path)
        route_key = route.key if route else f"{method} (unmatched)"
        outcome = _Outcome(request_id=f"SIM{next(self._request_ids):08X}")
        request = Request(method, path, query, headers, None, base_url)
        try:
            response = self._pipeline(request, raw_body, route, params, route_key, outcome)
        except Exception:
            logger.exception("simulator failed on %s %s", method, target)
            response = ApiError(500, "Internal Server Error").to_response()
        response.headers.setdefault("X-GitHub-Request-Id", outcome.request_id)
        response.headers.setdefault("X-GitHub-Media-Type", "github.v3; format=json")
        self.svc.stats.record(
            method,
            route_key,
            response.status,
            cost=outcome.cost,
            rate_limited=outcome.rate_limited,
        )
        return response

    def _pipeline(
        self,
        request: Request,
        raw_body: bytes,
        route: Route | None,
        params: dict[str, str],
        route_key: str,
        outcome: _Outcome,
    ) -> Response:
        headers = request.headers
        decision = self.svc.faults.evaluate(request.method, request.path)
        if decision.delay > 0:
            self.svc.faults.sleep(decision.delay)

        token = request.token = _token(headers.get("authorization"))
        quota_key = request.quota_key = token or ANONYMOUS
        if route_key == GRAPHQL_ROUTE:
            # GitHub charges GraphQL to its own hourly bucket, apart from REST's "core".
            quota_key = request.quota_key = GRAPHQL_BUCKET + quota_key
        if route_key in _APP_JWT_ROUTES:
            # Apps authenticate these with a signed JWT, not with a token.
            login = request.login = self._app_login(token)
            if login is None:
                return ApiError(401, "A JSON web token could not be decoded").to_response()
        else:
            login = request.login = self._login(token)
        if token is not None and login is None:
            return self._with_quota(ApiError(401, "Bad credentials").to_response(), ANONYMOUS)
        if decision.rule is not None:
            return self._fault_response(decision.rule, quota_key, login, outcome)
        refused = self._out_of_scope(request, route, params)
        if refused is not None:
            return self._with_quota(refused.to_response(), quota_key)

        free = route_key in _FREE_ROUTES
        if not free:
            allowed, quota = self.svc.limiter.acquire(quota_key)
            if not allowed:
                outcome.rate_limited = True
                return self._quota_exhausted(quota, login)
            outcome.cost = 1

        try:
            request.body = decode_json(raw_body)
            if route is None:
                raise ApiError(404, "Not Found")
            response = route.handler(self.svc, request, params)
        except ApiError as exc:
            response = exc.to_response()

        if request.method == "GET" and response.status == 200:
            # A route may say what its ETag follows (routes_graph.py: the blocked_by list).
            etag = response.headers.get("ETag") or (
                '"' + hashlib.sha256(response.encode()).hexdigest()[:40] + '"'
            )
            response.headers["ETag"] = etag
            response.headers["Cache-Control"] = "private, max-age=60, s-maxage=60"
            if _etag_matches(headers.get("if-none-match"), etag):
                if not free:
                    self.svc.limiter.refund(quota_key)
                    outcome.cost = 0
                response = Response(304, None, {"ETag": etag})
        return self._with_quota(response, quota_key)

    def _out_of_scope(
        self, request: Request, route: Route | None, params: dict[str, str]
    ) -> ApiError | None:
        """GitHub's refusal of a scoped installation token used beyond its scope."""
        scope = self.svc.scopes.get(request.token) if request.token is not None else None
        if scope is None or route is None:
            return None
        return scope.refusal(request.method, route.template, params.get("repo"))

    def _app_login(self, token: str | None) -> str | None:
        """The App's bot login when `token` is a JWT signed by a registered App's key."""
        if token is None or not self.svc.apps:
            return None
        import jwt  # PyJWT, which PyGithub depends on

        try:
            claims = jwt.decode(token, options={"verify_signature": False})
            app_id = int(claims["iss"])
            key = self.svc.apps[app_id]
            jwt.decode(token, key, algorithms=["RS256"])
        except (jwt.PyJWTError, KeyError, ValueError):
            return None
        return f"app-{app_id}[bot]"

    def _login(self, token: str | None) -> str | None:
        if token is None or token in self.svc.revoked:
            return None
        if self.svc.tokens is None:
            return DEFAULT_LOGIN
        return self.svc.tokens.get(token)

    def _with_quota(self, response: Response, quota_key: str) -> Response:
        response.headers.update(self.svc.limiter.peek(quota_key).headers())
        if quota_key.startswith(GRAPHQL_BUCKET):
            response.headers["X-RateLimit-Resource"] = "graphql"
        if quota_key != ANONYMOUS:
            response.headers.setdefault("X-OAuth-Scopes", "repo")
        return response

    def _quota_exhausted(self, quota: Quota, login: str | None) -> Response:
        who = f"user ID {self.svc.state.user_json(login)['id']}" if login else "this IP address"
        message = f"API rate limit exceeded for {who}."
        response = ApiError(403, message).to_response()
        response.headers.update(Quota(quota.limit, quota.limit, quota.reset).headers())
        return response

    def _fault_response(
        self, rule: FaultRule, quota_key: str, login: str | None, outcome: _Outcome
    ) -> Response:
        if rule.kind == ERROR:
            message = rule.message or _ERROR_MESSAGES.get(rule.status, "Server Error")
            return self._with_quota(ApiError(rule.status, message).to_response(), quota_key)
        outcome.rate_limited = True
        if rule.kind == PRIMARY_RATE_LIMIT:
            limit = self.svc.limiter.limit
            return self._quota_exhausted(Quota(limit, limit, int(rule.reset_at or 0)), login)
        message = _SECONDARY_MESSAGE.format(rid=outcome.request_id)
        response = self._with_quota(ApiError(403, message).to_response(), quota_key)
        response.headers["Retry-After"] = str(rule.retry_after)
        return response


_NO_USER_AGENT = (
    "Request forbidden by administrative rules. Please make sure your request has a "
    "User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api"
    "#user-agent-required). Check https://developer.github.com for other possible causes."
)


def _moved_permanently(base_url: str, path: str, query: str) -> Response:
    """GitHub's answer for a renamed or transferred repository: where it lives now."""
    location = f"{base_url}{path}" + (f"?{query}" if query else "")
    body = {
        "message": "Moved Permanently",
        "url": location,
        "documentation_url": "https://docs.github.com/v3/#http-redirects",
    }
    return Response(301, body, {"Location": location})


@dataclass
class _Outcome:
    request_id: str
    cost: int = 0
    rate_limited: bool = False


def _token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    return value.strip() if value.strip() else scheme


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    candidates = [tag.strip() for tag in if_none_match.split(",")]
    return "*" in candidates or any(tag.removeprefix("W/") == etag for tag in candidates)
