"""Request/response value types and GitHub-shaped errors shared by every simulator layer."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

DOCS_URL = "https://docs.github.com/rest"


@dataclass
class Request:
    """One decoded API call, as the route handlers see it."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: Any
    base_url: str
    login: str | None = None
    quota_key: str = "anonymous"
    #: The bearer token the call carries, if any.
    token: str | None = None

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[0] if values else default

    def since_arg(self) -> str | None:
        """The `since` timestamp; a raw '+' in its offset arrives as a space after decoding."""
        since = self.arg("since")
        return since.replace(" ", "+") if since else None

    def int_arg(self, name: str, default: int) -> int:
        value = self.arg(name)
        try:
            return int(value) if value not in (None, "") else default
        except ValueError:
            return default

    def json_object(self) -> dict[str, Any]:
        if self.body is None:
            return {}
        if not isinstance(self.body, dict):
            raise ApiError(400, "Problems parsing JSON")
        return self.body

    def require_login(self) -> str:
        if self.login is None:
            raise ApiError(401, "Requires authentication")
        return self.login


@dataclass
class Response:
    """An answer before it is written to the socket; ``raw`` is filled in once serialized."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None

    def encode(self) -> bytes:
        if self.raw is None:
            self.raw = encode_json(self.body) if self.body is not None else b""
        return self.raw


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, "Problems parsing JSON") from exc


class ApiError(Exception):
    """An error answer in GitHub's JSON shape, raised from anywhere below the HTTP layer."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        errors: list[Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.errors = errors
        self.headers = headers or {}

    def to_response(self) -> Response:
        body: dict[str, Any] = {"message": self.message}
        if self.errors is not None:
            body["errors"] = self.errors
        body["documentation_url"] = DOCS_URL
        body["status"] = str(self.status)
        return Response(self.status, body, dict(self.headers))


class NotFound(ApiError, LookupError):
    """404 from GitHub; also a LookupError so Python callers can catch it naturally."""

    def __init__(self, message: str = "Not Found") -> None:
        super().__init__(404, message)


def validation_failed(
    resource: str, field_name: str, code: str, message: str | None = None
) -> ApiError:
    error: dict[str, Any] = {"resource": resource, "field": field_name, "code": code}
    if message is not None:
        error["message"] = message
    return ApiError(422, "Validation Failed", errors=[error])
