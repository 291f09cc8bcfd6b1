"""Seed data: loading YAML seeds into SimState and generating bulk issues for load tests."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .collaborators import role_name
from .model import format_time

if TYPE_CHECKING:
    from .state import SimState

logger = logging.getLogger(__name__)

DEMO_SEED_PATH = Path(__file__).with_name("demo_seed.yaml")

_AREAS = (
    "login form",
    "billing webhook",
    "search index",
    "audit log",
    "CSV export",
    "session cache",
    "password reset flow",
    "notification settings",
    "avatar upload",
    "invoice PDF renderer",
    "API pagination",
    "health check endpoint",
    "feature flag loader",
    "email templates",
    "order history page",
    "shopping cart",
    "admin dashboard",
    "OAuth callback",
    "job scheduler",
    "image thumbnailer",
)
_ACTIONS = (
    "Add retries to the",
    "Add unit tests for the",
    "Fix timezone handling in the",
    "Refactor the",
    "Add metrics to the",
    "Validate input in the",
    "Document the",
    "Reduce latency of the",
)


def load_seed(source: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a seed from a YAML file path or from YAML text."""
    if isinstance(source, os.PathLike) or ("\n" not in source and os.path.isfile(source)):
        text = Path(source).read_text(encoding="utf-8")
    elif "\n" not in source and source.endswith((".yaml", ".yml", ".json")):
        raise FileNotFoundError(f"seed file not found: {source}")
    else:
        text = source
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError("a seed must be a mapping with a 'repositories' list")
    data.setdefault("repositories", [])
    if not isinstance(data["repositories"], list):
        raise ValueError("seed 'repositories' must be a list")
    return data


def apply_seed(state: SimState, seed: Mapping[str, Any]) -> None:
    """Create the seed's repositories, labels, branches, collaborators (``login: role``),
    required status checks (``protection: {branch: [check, ...]}``), issues and pull
    requests; a top-level ``ci:`` mapping starts the fake CI (fake_ci.py: check, marker,
    delay_s, approval_for)."""
    if seed.get("ci") is not None:
        from .fake_ci import FakeCI

        state.ci = FakeCI(**dict(seed["ci"]))
    for repo in seed.get("repositories") or []:
        owner, name = repo.get("owner"), repo.get("name")
        if not owner or not name:
            raise ValueError(f"seed repository needs 'owner' and 'name': {repo!r}")
        if f"{owner}/{name}".lower() not in (n.lower() for n in state.repo_names()):
            state.add_repo(
                owner,
                name,
                default_branch=repo.get("default_branch") or "main",
                private=bool(repo.get("private", False)),
                description=repo.get("description") or "",
                labels=repo.get("labels") or (),
                branches=repo.get("branches") or (),
            )
        for login, role in (repo.get("collaborators") or {}).items():
            try:
                state.set_collaborator(owner, name, str(login), str(role_name(str(role))))
            except ValueError as exc:
                raise ValueError(f"seed collaborator {login!r} of {owner}/{name}: {exc}") from exc
        for branch, contexts in (repo.get("protection") or {}).items():
            state.protect(owner, name, str(branch), [str(c) for c in contexts])
        for issue in repo.get("issues") or []:
            _seed_issue(state, owner, name, issue)
        for pull in repo.get("pulls") or []:
            _seed_pull(state, owner, name, pull)
    # Relationships may name issues of repositories seeded after theirs: they come last.
    for repo in seed.get("repositories") or []:
        for issue in repo.get("issues") or []:
            _seed_planning(state, repo["owner"], repo["name"], issue)
    logger.info("seeded %d repositories", len(seed.get("repositories") or []))


def _seed_planning(state: SimState, owner: str, repo: str, issue: Mapping[str, Any]) -> None:
    """An issue's `blocked_by` and `sub_issues` (numbers, or `owner/name#n` elsewhere), in
    order, its `type` (a name) and its `fields` (field name -> value)."""
    number = issue.get("number")
    if number is None:
        return

    def ref(item: Any) -> tuple[str, str, int]:
        if isinstance(item, int):
            return owner, repo, item
        full, _, n = str(item).partition("#")
        other_owner, _, other_repo = full.partition("/")
        return other_owner, other_repo, int(n)

    for blocker in issue.get("blocked_by") or []:
        state.block(owner, repo, number, ref(blocker))
    for sub in issue.get("sub_issues") or []:
        state.nest(owner, repo, number, ref(sub))
    if issue.get("type"):
        state.set_issue_type(owner, repo, number, str(issue["type"]))
    for name, value in (issue.get("fields") or {}).items():
        state.set_field(owner, repo, number, str(name), value)


def _seed_issue(state: SimState, owner: str, repo: str, issue: Mapping[str, Any]) -> None:
    if not issue.get("title"):
        raise ValueError(f"seed issue in {owner}/{repo} needs a title: {issue!r}")
    created = state.create_issue(
        owner,
        repo,
        title=issue["title"],
        body=issue.get("body") or "",
        labels=issue.get("labels") or (),
        state=issue.get("state") or "open",
        created_at=issue.get("created_at"),
        updated_at=issue.get("updated_at"),
        user=issue.get("user") or "octocat",
        number=issue.get("number"),
        assignees=issue.get("assignees") or (),
    )
    for comment in issue.get("comments") or []:
        state.add_issue_comment(
            owner,
            repo,
            created["number"],
            user=comment.get("user") or "octocat",
            body=comment["body"],
        )


def _seed_pull(state: SimState, owner: str, repo: str, pull: Mapping[str, Any]) -> None:
    created = state.create_pull(
        owner,
        repo,
        title=pull["title"],
        head=pull["head"],
        base=pull.get("base"),
        body=pull.get("body") or "",
        user=pull.get("user") or "octocat",
        draft=bool(pull.get("draft", False)),
    )
    number = created["number"]
    for review in pull.get("reviews") or []:
        state.add_review(
            owner,
            repo,
            number,
            user=review.get("user") or "reviewer",
            body=review.get("body") or "",
            state=review.get("state") or "COMMENTED",
        )
    if pull.get("merged"):
        state.merge_pull(owner, repo, number)
    elif pull.get("state") == "closed":
        state.update_pull(owner, repo, number, state="closed")


def generate_issues(
    n: int,
    *,
    start: int = 1,
    priorities: Sequence[str] = ("P0", "P1", "P2"),
    role: str = "BACKENDCODER",
    roles: Sequence[str] | None = None,
    state: str = "open",
    extra_labels: Sequence[str] = (),
    created_from: datetime | None = None,
    branch_prefix: str = "feature/issue-",
) -> list[dict[str, Any]]:
    """``n`` valid, assignable issues in seed format, numbered from ``start``.

    Priorities (and ``roles``, when given instead of the single ``role``) cycle so every
    combination is represented; ``created_at`` advances a minute per issue.
    """
    base_time = created_from or datetime(2026, 1, 1, tzinfo=UTC)
    role_cycle = list(roles) if roles else [role]
    issues: list[dict[str, Any]] = []
    for i in range(n):
        number = start + i
        area = _AREAS[i % len(_AREAS)]
        action = _ACTIONS[(i // len(_AREAS)) % len(_ACTIONS)]
        labels = [priorities[i % len(priorities)], role_cycle[i % len(role_cycle)], *extra_labels]
        issues.append(
            {
                "number": number,
                "title": f"{action} {area}",
                "body": (
                    f"{action} {area} so it behaves correctly under production load.\n\n"
                    "## Deliverables\n"
                    f"- {action} {area}\n"
                    "- Tests covering the change\n\n"
                    f"Branch: {branch_prefix}{number}\n"
                ),
                "labels": labels,
                "state": state,
                "created_at": format_time(base_time + timedelta(minutes=i)),
            }
        )
    return issues
