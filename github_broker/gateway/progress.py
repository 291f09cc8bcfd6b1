"""What the leader reads of held tasks' progress when webhooks are not there: each held
branch's tip, its open pull requests and those whose body closes the issue, for every
repository in one GraphQL request (a page of up to PAGE held tasks), whatever the number of
repositories with held tasks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from github_broker.gateway.transport import Transport

#: Held tasks read per request. Each adds two connections (the branch's pull requests, the
#: issue's closing ones): GitHub charges about one point per 100 connections, so a full page
#: costs 2 points and stays far below its 500,000-node limit.
PAGE = 100
#: Open pull requests read per branch and per issue.
PULLS_READ = 5

_PULL = "nodes { number updatedAt }"


@dataclass(frozen=True)
class HeldBranch:
    """A held task as the progress read names it."""

    repository: str
    issue: int
    branch: str


@dataclass
class BranchProgress:
    """What GitHub shows for one held task now."""

    #: The branch's tip (None while the branch does not exist).
    head: str | None = None
    #: Open pull requests of the branch or closing the issue: number -> updatedAt.
    pulls: dict[int, str] = field(default_factory=dict)


@dataclass
class ProgressPage:
    """One request's answer, with the points GitHub charged for it."""

    seen: dict[HeldBranch, BranchProgress]
    points: int


class ProgressReads(Transport):
    """The progress read of leader/progress.py."""

    def held_progress(self, held: list[HeldBranch]) -> list[ProgressPage]:
        """Every held task's branch tip and open pull requests, PAGE tasks per request."""
        return [self._progress_page(held[i : i + PAGE]) for i in range(0, len(held), PAGE)]

    def _progress_page(self, held: list[HeldBranch]) -> ProgressPage:
        document, variables, where = progress_document(held)
        data = self._graphql(document, variables, allow_missing=True)
        seen: dict[HeldBranch, BranchProgress] = {}
        for task, (repo_alias, ref_alias, issue_alias) in where.items():
            repo = data.get(repo_alias) or {}
            seen[task] = _progress_of(repo.get(ref_alias), repo.get(issue_alias))
        cost = (data.get("rateLimit") or {}).get("cost")
        return ProgressPage(seen, int(cost) if isinstance(cost, int) else 1)


def progress_document(
    held: list[HeldBranch],
) -> tuple[str, dict[str, Any], dict[HeldBranch, tuple[str, str, str]]]:
    """The query over `held` (a repository field per repository, a ref and an issue per task,
    names passed as variables), its variables, and where each task's answer is."""
    by_repo: dict[str, list[HeldBranch]] = {}
    for task in held:
        by_repo.setdefault(task.repository, []).append(task)
    names, variables, parts = [], {}, []
    where: dict[HeldBranch, tuple[str, str, str]] = {}
    pulls = f"(states: OPEN, first: {PULLS_READ}) {{ {_PULL} }}"
    for r, (repository, tasks) in enumerate(by_repo.items()):
        owner, _, name = repository.partition("/")
        names += [f"$o{r}: String!", f"$n{r}: String!"]
        variables.update({f"o{r}": owner, f"n{r}": name})
        inner = []
        for task in tasks:
            t = len(where)
            names.append(f"$b{t}: String!")
            variables[f"b{t}"] = f"refs/heads/{task.branch}"
            inner.append(
                f"h{t}: ref(qualifiedName: $b{t}) {{ target {{ oid }} "
                f"associatedPullRequests{pulls} }}"
            )
            inner.append(
                f"i{t}: issue(number: {int(task.issue)}) {{ "
                f"closedByPullRequestsReferences(first: {PULLS_READ}) {{ {_PULL} }} }}"
            )
            where[task] = (f"r{r}", f"h{t}", f"i{t}")
        parts.append(f"r{r}: repository(owner: $o{r}, name: $n{r}) {{ {' '.join(inner)} }}")
    body = "\n".join(parts)
    query = f"query({', '.join(names)}) {{\n{body}\nrateLimit {{ cost }}\n}}"
    return query, variables, where


def _progress_of(ref: Any, issue: Any) -> BranchProgress:
    out = BranchProgress()
    if isinstance(ref, dict):
        out.head = str((ref.get("target") or {}).get("oid") or "") or None
        out.pulls.update(_pulls(ref.get("associatedPullRequests")))
    if isinstance(issue, dict):
        out.pulls.update(_pulls(issue.get("closedByPullRequestsReferences")))
    return out


def _pulls(connection: Any) -> dict[int, str]:
    nodes = (connection or {}).get("nodes") or [] if isinstance(connection, dict) else []
    return {int(p["number"]): str(p.get("updatedAt") or "") for p in nodes if p}
