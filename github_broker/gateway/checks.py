"""What the broker reads of its pull requests' CI: one GraphQL page of PRs with their head
commit's status-check rollup, check suites, mergeability and files; the base branch's
required checks; a failing check run's annotations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from github_broker.errors import GitHubNotFound
from github_broker.gateway.transport import Transport

#: Files of a PR read for overlaps (GitHub's page limit); more are counted, not named.
FILES_READ = 100
#: Check runs and status contexts read per commit.
CONTEXTS_READ = 50
#: Check suites read per commit (an Actions suite waiting for approval shows here).
SUITES_READ = 10

_ROLLUP = """statusCheckRollup { state contexts(first: %(contexts)d) { totalCount nodes {
  __typename
  ... on CheckRun { databaseId name status conclusion detailsUrl startedAt completedAt title
    summary annotations(first: %(annotations)d) { totalCount nodes { path message title
    annotationLevel location { start { line } } } } }
  ... on StatusContext { context state description targetUrl createdAt } } } }"""
_SUITES = """checkSuites(first: %(suites)d) { nodes { status conclusion app { slug }
  workflowRun { url workflow { name } } } }"""
_PR = """number url state isDraft createdAt author { login } headRefName headRefOid baseRefName
  mergeable mergeStateStatus additions deletions
  files(first: %(files)d) { totalCount nodes { path } }
  commits(last: 1) { nodes { commit { oid %(rollup)s %(suites)s } } }"""
_BASE = """target { ... on Commit { oid statusCheckRollup { contexts(first: %(contexts)d) {
  nodes { __typename ... on CheckRun { name status conclusion }
  ... on StatusContext { context state } } } } } }"""


@dataclass
class ChecksQuery:
    """One page of the polling read: PRs by number, PRs of branches (held tasks whose PR
    number is not known yet), and base branches whose tip's checks are compared."""

    numbers: dict[str, int] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    bases: dict[str, str] = field(default_factory=dict)

    def document(self, annotations: int) -> tuple[str, dict[str, str]]:
        sizes = {"contexts": CONTEXTS_READ, "annotations": annotations, "suites": SUITES_READ}
        rollup = _ROLLUP % sizes
        pr = _PR % {"files": FILES_READ, "rollup": rollup, "suites": _SUITES % sizes}
        parts, variables, names = [], {}, ["$owner: String!", "$name: String!"]
        for alias, number in self.numbers.items():
            parts.append(f"{alias}: pullRequest(number: {int(number)}) {{ {pr} }}")
        for i, (alias, branch) in enumerate(self.heads.items()):
            names.append(f"$h{i}: String!")
            variables[f"h{i}"] = branch
            parts.append(
                f"{alias}: pullRequests(headRefName: $h{i}, states: OPEN, first: 1) "
                f"{{ nodes {{ {pr} }} }}"
            )
        for i, (alias, branch) in enumerate(self.bases.items()):
            names.append(f"$b{i}: String!")
            variables[f"b{i}"] = f"refs/heads/{branch}"
            parts.append(f"{alias}: ref(qualifiedName: $b{i}) {{ {_BASE % sizes} }}")
        body = "\n".join(parts)
        query = (
            f"query({', '.join(names)}) {{ repository(owner: $owner, name: $name) {{\n{body}\n}} }}"
        )
        return query, variables


class ChecksReads(Transport):
    """The reads of done-means-green (leader/checks.py)."""

    def pulls_checks(self, full_name: str, query: ChecksQuery, annotations: int) -> dict[str, Any]:
        """One request: each alias of `query` -> its node (None: that PR is gone)."""
        owner, _, name = full_name.partition("/")
        document, variables = query.document(annotations)
        data = self._graphql(
            document, {"owner": owner, "name": name, **variables}, allow_missing=True
        )
        repo = data.get("repository")
        if repo is None:
            raise GitHubNotFound(f"POST /graphql: repository {full_name} not found", status=404)
        return dict(repo)

    def required_checks(self, full_name: str, branch: str) -> list[str]:
        """The status checks `branch` requires (`GET .../branches/{branch}`, conditional: a
        free 304 while its protection does not change); none for an unprotected branch."""
        try:
            data = self._get_cached(f"{self._repo(full_name)}/branches/{quote(branch, safe='/')}")
        except GitHubNotFound:
            return []
        checks = ((data or {}).get("protection") or {}).get("required_status_checks") or {}
        names = [str(c) for c in checks.get("contexts") or []]
        names += [str(c["context"]) for c in checks.get("checks") or [] if c.get("context")]
        return sorted(set(names))

    def check_run_annotations(
        self, full_name: str, run_id: int, limit: int
    ) -> list[dict[str, Any]]:
        """The first `limit` annotations of a check run (one request)."""
        _, _, data = self._request(
            "GET",
            f"{self._repo(full_name)}/check-runs/{int(run_id)}/annotations",
            params={"per_page": max(1, limit)},
        )
        return list(data or [])[:limit]
