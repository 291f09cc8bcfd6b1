"""A cut of GitHub's REST description (a fixture written by fixtures/extract_github_openapi.py)
and whether an answer of the simulator conforms to it: a status GitHub documents, a body
that validates against the operation's schema."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft7Validator

from github_broker.simulator import Simulator
from github_broker.simulator.messages import Response
from tests.test_conformance import leaves, openapi_to_jsonschema

#: One answer as recorded: method, path, status, decoded body (None for 204 and 304).
Answer = tuple[str, str, int, Any]


def recorded(sim: Simulator, skip: tuple[str, ...] = ()) -> list[Answer]:
    """Every answer `sim` gives from now on (paths starting with `skip` left out)."""
    seen: list[Answer] = []
    inner = sim._gateway.process

    def process(
        method: str, target: str, headers: Mapping[str, str], raw: bytes, base: str
    ) -> Response:
        response = inner(method, target, headers, raw, base)
        body = json.loads(response.encode()) if response.status not in (204, 304) else None
        if not skip or not target.startswith(skip):
            seen.append((method, target.split("?", 1)[0], response.status, body))
        return response

    sim._gateway.process = process  # type: ignore[method-assign]
    return seen


class Described:
    """The operations of one fixture; `greedy`: path parameters that may hold '/' when last
    (a ref, a basehead)."""

    def __init__(self, fixture: str, greedy: tuple[str, ...] = ()) -> None:
        self.spec = json.loads((Path(__file__).parent / "fixtures" / fixture).read_text())
        self.components = openapi_to_jsonschema(self.spec["components"])
        self.greedy = greedy

    def template(self, method: str, path: str) -> str:
        for template, operations in self.spec["paths"].items():
            last = r".+" if self.greedy and template.endswith(self.greedy) else r"[^/]+"
            pattern = re.sub(r"\{[^}]+\}", "[^/]+", re.sub(r"\{[^}]+\}$", last, template))
            if re.fullmatch(pattern, path) and method in operations:
                return template
        raise AssertionError(f"{method.upper()} {path} is not in the fixture")

    def violations(self, method: str, path: str, status: int, body: Any) -> list[str]:
        """Why one answer does not conform (empty when it does)."""
        where = f"{method} {path} -> {status}"
        operation = self.spec["paths"][self.template(method.lower(), path)][method.lower()]
        declared = operation["responses"].get(str(status))
        if status == 304:
            return [] if body is None else [f"{where}: a 304 with a body"]
        if declared is None:
            return [f"{where}: status not documented ({sorted(operation['responses'])})"]
        while "$ref" in declared:
            name = declared["$ref"].rsplit("/", 1)[-1]
            declared = self.spec["components"]["responses"][name]
        content = (declared.get("content") or {}).get("application/json")
        if content is None:
            return [] if body is None else [f"{where}: a body where GitHub documents none"]
        schema = {**openapi_to_jsonschema(content["schema"]), "components": self.components}
        return [
            f"{where}: /{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for top in Draft7Validator(schema).iter_errors(body)
            for e in leaves(top)
        ]
