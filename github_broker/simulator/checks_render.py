"""The REST shapes of check runs, check suites, commit statuses, branch protection and
Actions workflow runs (GitHub's `check-run`, `check-suite`, `status`,
`combined-commit-status`, `branch-protection`, `workflow-run`)."""

from __future__ import annotations

import logging
from typing import Any

from . import commits, render
from .model import Record, Repo
from .render import Ctx
from .webhooks import _hook_repository

logger = logging.getLogger(__name__)

#: When every simulated GitHub App was registered (apps own check runs and suites).
APP_CREATED_AT = "2020-01-01T00:00:00Z"
#: The events and permissions every simulated App shows.
APP_EVENTS = ["check_run", "check_suite", "pull_request", "push", "status"]
APP_PERMISSIONS = {"checks": "write", "contents": "read", "metadata": "read", "statuses": "write"}


def app(ctx: Ctx, slug: str, app_id: int) -> dict[str, Any]:
    """A GitHub App (`integration`); apps are named after the login that acts for them."""
    name = slug.removesuffix("[bot]")
    return {
        "id": app_id,
        "slug": name,
        "node_id": f"A_{app_id}",
        "owner": ctx.user(name, "Organization"),
        "name": name,
        "description": None,
        "external_url": f"{ctx.base}/apps/{name}",
        "html_url": f"{ctx.base}/apps/{name}",
        "created_at": APP_CREATED_AT,
        "updated_at": APP_CREATED_AT,
        "permissions": dict(APP_PERMISSIONS),
        "events": list(APP_EVENTS),
    }


def pull_minimal(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    """`pull-request-minimal`: how check runs, suites and workflow runs name their PRs."""
    pr = rec["pull"]
    base_sha = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
    mini = {"id": repo.id, "url": ctx.api(repo), "name": repo.name}
    return {
        "id": pr["id"],
        "number": rec["number"],
        "url": f"{ctx.api(repo)}/pulls/{rec['number']}",
        "head": {"ref": pr["head"], "sha": pr["head_sha"], "repo": mini},
        "base": {"ref": pr["base"], "sha": base_sha, "repo": mini},
    }


def output(ctx: Ctx, repo: Repo, run: Record) -> dict[str, Any]:
    out = run["output"]
    return {
        "title": out.get("title"),
        "summary": out.get("summary"),
        "text": out.get("text"),
        "annotations_count": len(out.get("annotations") or []),
        "annotations_url": f"{ctx.api(repo)}/check-runs/{run['id']}/annotations",
    }


def check_run(
    ctx: Ctx, repo: Repo, run: Record, suite: Record, pulls: list[Record]
) -> dict[str, Any]:
    api = ctx.api(repo)
    return {
        "id": run["id"],
        "node_id": f"CR_{run['id']}",
        "head_sha": run["head_sha"],
        "external_id": run["external_id"],
        "url": f"{api}/check-runs/{run['id']}",
        "html_url": f"{ctx.html(repo)}/runs/{run['id']}",
        "details_url": run["details_url"] or f"{ctx.html(repo)}/runs/{run['id']}",
        "status": run["status"],
        "conclusion": run["conclusion"],
        "started_at": run["started_at"],
        "completed_at": run["completed_at"],
        "output": output(ctx, repo, run),
        "name": run["name"],
        "check_suite": {"id": suite["id"]},
        "app": app(ctx, run["app"], suite["app_id"]),
        "pull_requests": [pull_minimal(ctx, repo, p) for p in pulls],
    }


def annotation(ctx: Ctx, repo: Repo, run: Record, item: Record) -> dict[str, Any]:
    return {
        "path": item["path"],
        "blob_href": f"{ctx.html(repo)}/blob/{run['head_sha']}/{item['path']}",
        "start_line": item["start_line"],
        "end_line": item.get("end_line", item["start_line"]),
        "start_column": item.get("start_column"),
        "end_column": item.get("end_column"),
        "annotation_level": item.get("annotation_level", "failure"),
        "title": item.get("title"),
        "message": item["message"],
        "raw_details": item.get("raw_details"),
    }


def simple_commit(ctx: Ctx, repo: Repo, sha: str) -> dict[str, Any]:
    rec = commits.get(repo, sha)
    who = {"name": rec["author"], "email": commits.person(rec["author"], "")["email"]}
    return {
        "id": sha,
        "tree_id": rec["tree"],
        "message": rec["message"],
        "timestamp": rec["timestamp"],
        "author": who,
        "committer": who,
    }


def check_suite(
    ctx: Ctx, repo: Repo, suite: Record, runs: int, pulls: list[Record]
) -> dict[str, Any]:
    api = ctx.api(repo)
    return {
        "id": suite["id"],
        "node_id": f"CS_{suite['id']}",
        "head_branch": suite["head_branch"],
        "head_sha": suite["head_sha"],
        "status": suite["status"],
        "conclusion": suite["conclusion"],
        "url": f"{api}/check-suites/{suite['id']}",
        "before": suite["before"],
        "after": suite["head_sha"],
        "pull_requests": [pull_minimal(ctx, repo, p) for p in pulls],
        "app": app(ctx, suite["app"], suite["app_id"]),
        "repository": render.repository(ctx, repo),
        "created_at": suite["created_at"],
        "updated_at": suite["updated_at"],
        "head_commit": simple_commit(ctx, repo, suite["head_sha"]),
        "latest_check_runs_count": runs,
        "check_runs_url": f"{api}/check-suites/{suite['id']}/check-runs",
        "rerequestable": True,
        "runs_rerequestable": True,
    }


def status(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    creator = ctx.user(rec["creator"])
    return {
        "url": f"{ctx.api(repo)}/statuses/{rec['sha']}",
        "avatar_url": creator["avatar_url"] if creator else None,
        "id": rec["id"],
        "node_id": f"SC_{rec['id']}",
        "state": rec["state"],
        "description": rec["description"],
        "target_url": rec["target_url"],
        "context": rec["context"],
        "created_at": rec["created_at"],
        "updated_at": rec["updated_at"],
        "creator": creator,
    }


def combined_status(
    ctx: Ctx, repo: Repo, sha: str, state: str, latest: list[Record], required: set[str]
) -> dict[str, Any]:
    api = ctx.api(repo)
    statuses = []
    for rec in latest:
        shaped = status(ctx, repo, rec)
        del shaped["creator"]
        shaped["required"] = rec["context"] in required
        statuses.append(shaped)
    return {
        "state": state,
        "statuses": statuses,
        "sha": sha,
        "total_count": len(statuses),
        "repository": render.repository(ctx, repo),
        "commit_url": f"{api}/commits/{sha}",
        "url": f"{api}/commits/{sha}/status",
    }


def required_status_checks(ctx: Ctx, repo: Repo, branch: str, rule: Record) -> dict[str, Any]:
    url = f"{ctx.api(repo)}/branches/{branch}/protection/required_status_checks"
    checks = rule["checks"]
    return {
        "url": url,
        "enforcement_level": "non_admins",
        "contexts": [c["context"] for c in checks],
        "checks": [{"context": c["context"], "app_id": c.get("app_id")} for c in checks],
        "contexts_url": f"{url}/contexts",
        "strict": rule["strict"],
    }


def protection(ctx: Ctx, repo: Repo, branch: str, rule: Record) -> dict[str, Any]:
    url = f"{ctx.api(repo)}/branches/{branch}/protection"
    return {
        "url": url,
        "required_status_checks": required_status_checks(ctx, repo, branch, rule),
        "enforce_admins": {"url": f"{url}/enforce_admins", "enabled": rule["enforce_admins"]},
        "required_linear_history": {"enabled": False},
        "allow_force_pushes": {"enabled": False},
        "allow_deletions": {"enabled": False},
        "block_creations": {"enabled": False},
        "required_conversation_resolution": {"enabled": False},
        "lock_branch": {"enabled": False},
        "allow_fork_syncing": {"enabled": False},
        "required_signatures": {"url": f"{url}/required_signatures", "enabled": False},
    }


def branch_protection_summary(
    ctx: Ctx, repo: Repo, branch: str, rule: Record | None
) -> dict[str, Any]:
    """The `protection` a branch answer carries (readable with read access)."""
    if rule is None:
        return {
            "enabled": False,
            "required_status_checks": {
                "enforcement_level": "off",
                "contexts": [],
                "checks": [],
            },
        }
    checks = required_status_checks(ctx, repo, branch, rule)
    return {
        "enabled": True,
        "required_status_checks": {
            k: checks[k] for k in ("enforcement_level", "contexts", "checks")
        },
    }


def workflow_run(
    ctx: Ctx, repo: Repo, run: Record, pulls: list[Record], suite: Record
) -> dict[str, Any]:
    api = ctx.api(repo)
    url = f"{api}/actions/runs/{run['id']}"
    actor = ctx.user(run["actor"])
    return {
        "id": run["id"],
        "name": run["name"],
        "node_id": f"WFR_{run['id']}",
        "check_suite_id": suite["id"],
        "check_suite_node_id": f"CS_{suite['id']}",
        "head_branch": run["head_branch"],
        "head_sha": run["head_sha"],
        "path": run["path"],
        "display_title": run["display_title"],
        "run_number": run["run_number"],
        "run_attempt": 1,
        "referenced_workflows": [],
        "event": "pull_request",
        "status": run["status"],
        "conclusion": run["conclusion"],
        "workflow_id": run["workflow_id"],
        "url": url,
        "html_url": f"{ctx.html(repo)}/actions/runs/{run['id']}",
        "pull_requests": [pull_minimal(ctx, repo, p) for p in pulls],
        "created_at": run["created_at"],
        "updated_at": run["updated_at"],
        "actor": actor,
        "triggering_actor": actor,
        "run_started_at": run["created_at"],
        "jobs_url": f"{url}/jobs",
        "logs_url": f"{url}/logs",
        "check_suite_url": f"{api}/check-suites/{suite['id']}",
        "artifacts_url": f"{url}/artifacts",
        "cancel_url": f"{url}/cancel",
        "rerun_url": f"{url}/rerun",
        "previous_attempt_url": None,
        "workflow_url": f"{api}/actions/workflows/{run['workflow_id']}",
        "head_commit": simple_commit(ctx, repo, run["head_sha"]),
        "repository": render.repository(ctx, repo),
        "head_repository": render.repository(ctx, repo),
    }


#: The fields of a webhook's `repository-lite` (a workflow run's repositories).
LITE_FIELDS = (
    "archive_url",
    "assignees_url",
    "blobs_url",
    "branches_url",
    "collaborators_url",
    "comments_url",
    "commits_url",
    "compare_url",
    "contents_url",
    "contributors_url",
    "deployments_url",
    "description",
    "downloads_url",
    "events_url",
    "fork",
    "forks_url",
    "full_name",
    "git_commits_url",
    "git_refs_url",
    "git_tags_url",
    "hooks_url",
    "html_url",
    "id",
    "issue_comment_url",
    "issue_events_url",
    "issues_url",
    "keys_url",
    "labels_url",
    "languages_url",
    "merges_url",
    "milestones_url",
    "name",
    "node_id",
    "notifications_url",
    "owner",
    "private",
    "pulls_url",
    "releases_url",
    "stargazers_url",
    "statuses_url",
    "subscribers_url",
    "subscription_url",
    "tags_url",
    "teams_url",
    "trees_url",
    "url",
)


def repository_lite(ctx: Ctx, repo: Repo) -> dict[str, Any]:
    full = _hook_repository(render.repository(ctx, repo))
    return {k: full[k] for k in LITE_FIELDS}


def workflow(ctx: Ctx, repo: Repo, run: Record) -> dict[str, Any]:
    api = ctx.api(repo)
    return {
        "badge_url": f"{ctx.html(repo)}/workflows/{run['name']}/badge.svg",
        "created_at": APP_CREATED_AT,
        "html_url": f"{ctx.html(repo)}/blob/{repo.default_branch}/{run['path']}",
        "id": run["workflow_id"],
        "name": run["name"],
        "node_id": f"W_{run['workflow_id']}",
        "path": run["path"],
        "state": "active",
        "updated_at": APP_CREATED_AT,
        "url": f"{api}/actions/workflows/{run['workflow_id']}",
    }
