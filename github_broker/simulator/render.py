"""GitHub REST v3 JSON shapes built from internal records, relative to the caller's base URL."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .model import Record, Repo
from .render_planning import planning

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ctx:
    """Rendering context: URLs are built from the base the client used so PyGithub accepts them."""

    base: str
    user_ids: Mapping[str, int]

    def user(self, login: str | None, kind: str | None = None) -> dict[str, Any] | None:
        if login is None:
            return None
        uid = self.user_ids.get(login, 0)
        url = f"{self.base}/users/{quote(login)}"
        return {
            "login": login,
            "id": uid,
            "node_id": f"U_{uid}",
            "avatar_url": f"{self.base}/avatars/{quote(login)}",
            "gravatar_id": "",
            "url": url,
            "html_url": f"{self.base}/{quote(login)}",
            "followers_url": f"{url}/followers",
            "following_url": f"{url}/following{{/other_user}}",
            "gists_url": f"{url}/gists{{/gist_id}}",
            "starred_url": f"{url}/starred{{/owner}}{{/repo}}",
            "subscriptions_url": f"{url}/subscriptions",
            "organizations_url": f"{url}/orgs",
            "repos_url": f"{url}/repos",
            "events_url": f"{url}/events{{/privacy}}",
            "received_events_url": f"{url}/received_events",
            "type": kind or ("Bot" if login.endswith("[bot]") else "User"),
            "user_view_type": "public",
            "site_admin": False,
        }

    def private_user(self, login: str, created_at: str) -> dict[str, Any]:
        """`GET /user`: the authenticated user sees its own account's private fields."""
        data = self.user(login)
        assert data is not None
        counts = ("followers", "following", "public_gists", "public_repos", "private_gists")
        return {
            **data,
            "user_view_type": "private",
            "name": None,
            "company": None,
            "blog": "",
            "location": None,
            "email": None,
            "hireable": None,
            "bio": None,
            **{field: 0 for field in counts},
            "total_private_repos": 0,
            "owned_private_repos": 0,
            "disk_usage": 0,
            "collaborators": 0,
            "two_factor_authentication": True,
            "created_at": created_at,
            "updated_at": created_at,
        }

    def api(self, repo: Repo) -> str:
        return f"{self.base}/repos/{repo.owner}/{repo.name}"

    def html(self, repo: Repo) -> str:
        return f"{self.base}/{repo.owner}/{repo.name}"


#: `{name}_url` templates every repository answer carries (GitHub's hypermedia links).
_REPO_LINKS = {
    "forks": "/forks",
    "keys": "/keys{/key_id}",
    "collaborators": "/collaborators{/collaborator}",
    "teams": "/teams",
    "hooks": "/hooks",
    "issue_events": "/issues/events{/number}",
    "events": "/events",
    "assignees": "/assignees{/user}",
    "tags": "/tags",
    "blobs": "/git/blobs{/sha}",
    "git_tags": "/git/tags{/sha}",
    "trees": "/git/trees{/sha}",
    "statuses": "/statuses/{sha}",
    "languages": "/languages",
    "stargazers": "/stargazers",
    "contributors": "/contributors",
    "subscribers": "/subscribers",
    "subscription": "/subscription",
    "commits": "/commits{/sha}",
    "git_commits": "/git/commits{/sha}",
    "comments": "/comments{/number}",
    "issue_comment": "/issues/comments{/number}",
    "contents": "/contents/{+path}",
    "compare": "/compare/{base}...{head}",
    "merges": "/merges",
    "archive": "/{archive_format}{/ref}",
    "downloads": "/downloads",
    "milestones": "/milestones{/number}",
    "notifications": "/notifications{?since,all,participating}",
    "releases": "/releases{/id}",
    "deployments": "/deployments",
}


def repository(ctx: Ctx, repo: Repo) -> dict[str, Any]:
    api = ctx.api(repo)
    host = ctx.base.split("://", 1)[-1]
    return {
        **{f"{name}_url": api + suffix for name, suffix in _REPO_LINKS.items()},
        "git_url": f"git://{host}/{repo.full_name}.git",
        "ssh_url": f"git@{host.split(':')[0]}:{repo.full_name}.git",
        "svn_url": ctx.html(repo),
        "mirror_url": None,
        "homepage": None,
        "language": None,
        "license": None,
        "size": 0,
        "forks": 0,
        "forks_count": 0,
        "stargazers_count": 0,
        "watchers": 0,
        "watchers_count": 0,
        "subscribers_count": 0,
        "network_count": 0,
        "has_projects": False,
        "has_wiki": False,
        "has_pages": False,
        "has_downloads": False,
        "has_discussions": False,
        "id": repo.id,
        "node_id": f"R_{repo.id}",
        "name": repo.name,
        "full_name": repo.full_name,
        "owner": ctx.user(repo.owner, "Organization"),
        "private": repo.private,
        "visibility": "private" if repo.private else "public",
        "html_url": ctx.html(repo),
        "description": repo.description or None,
        "fork": False,
        "url": api,
        "issues_url": f"{api}/issues{{/number}}",
        "pulls_url": f"{api}/pulls{{/number}}",
        "labels_url": f"{api}/labels{{/name}}",
        "branches_url": f"{api}/branches{{/branch}}",
        "git_refs_url": f"{api}/git/refs{{/sha}}",
        "clone_url": f"{ctx.html(repo)}.git",
        "created_at": repo.created_at,
        "updated_at": repo.created_at,
        "pushed_at": repo.pushed_at or repo.created_at,
        "default_branch": repo.default_branch,
        "open_issues_count": repo.open_issues_count(),
        "open_issues": repo.open_issues_count(),
        "has_issues": True,
        "archived": False,
        "disabled": False,
        "permissions": {
            "admin": True,
            "maintain": True,
            "push": True,
            "triage": True,
            "pull": True,
        },
    }


def label(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    return {
        "id": rec["id"],
        "node_id": f"LA_{rec['id']}",
        "url": f"{ctx.api(repo)}/labels/{quote(rec['name'], safe='')}",
        "name": rec["name"],
        "color": rec["color"],
        "default": rec["default"],
        "description": rec["description"] or None,
    }


def issue_labels(ctx: Ctx, repo: Repo, rec: Record) -> list[dict[str, Any]]:
    return [label(ctx, repo, repo.labels[name.lower()]) for name in rec["labels"]]


def issue(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    number = rec["number"]
    url = f"{ctx.api(repo)}/issues/{number}"
    pull = rec["pull"]
    html_kind = "pull" if pull else "issues"
    assignees = [ctx.user(login) for login in rec["assignees"]]
    data: dict[str, Any] = {
        "url": url,
        "repository_url": ctx.api(repo),
        "labels_url": f"{url}/labels{{/name}}",
        "comments_url": f"{url}/comments",
        "events_url": f"{url}/events",
        "html_url": f"{ctx.html(repo)}/{html_kind}/{number}",
        "id": rec["id"],
        "node_id": rec["node_id"],
        "number": number,
        "title": rec["title"],
        "user": ctx.user(rec["user"]),
        "labels": issue_labels(ctx, repo, rec),
        "state": rec["state"],
        "state_reason": rec["state_reason"],
        "locked": False,
        "assignee": assignees[0] if assignees else None,
        "assignees": assignees,
        "milestone": None,
        "comments": rec["comments"],
        "created_at": rec["created_at"],
        "updated_at": rec["updated_at"],
        "closed_at": rec["closed_at"],
        "author_association": "MEMBER",
        "active_lock_reason": None,
        # GitHub sends null rather than "" for an empty body; clients must cope with both.
        "body": rec["body"] or None,
        "performed_via_github_app": None,
    }
    if pull:
        pulls_url = f"{ctx.api(repo)}/pulls/{number}"
        data["draft"] = pull["draft"]
        data["pull_request"] = {
            "url": pulls_url,
            "html_url": f"{ctx.html(repo)}/pull/{number}",
            "diff_url": f"{ctx.html(repo)}/pull/{number}.diff",
            "patch_url": f"{ctx.html(repo)}/pull/{number}.patch",
            "merged_at": pull["merged_at"],
        }
    else:
        data.update(planning(ctx, rec))
    return data


def _branch_end(ctx: Ctx, repo: Repo, branch: str, sha: str) -> dict[str, Any]:
    return {
        "label": f"{repo.owner}:{branch}",
        "ref": branch,
        "sha": sha,
        "user": ctx.user(repo.owner, "Organization"),
        "repo": repository(ctx, repo),
    }


def pull(ctx: Ctx, repo: Repo, rec: Record) -> dict[str, Any]:
    number = rec["number"]
    pr = rec["pull"]
    api = ctx.api(repo)
    url = f"{api}/pulls/{number}"
    html = f"{ctx.html(repo)}/pull/{number}"
    # The head as the PR last saw it: pushes to an open PR's branch move it (refs.py), a
    # closed PR keeps the head it closed with, as on GitHub.
    head_sha = pr["head_sha"]
    base_sha = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
    merge = (
        (None, "unknown", False) if pr["merged"] else pr.get("merge_cache", (None, "unknown", None))
    )
    assignees = [ctx.user(login) for login in rec["assignees"]]
    return {
        "url": url,
        "id": pr["id"],
        "node_id": pr["node_id"],
        "html_url": html,
        "diff_url": f"{html}.diff",
        "patch_url": f"{html}.patch",
        "issue_url": f"{api}/issues/{number}",
        "commits_url": f"{url}/commits",
        "review_comments_url": f"{url}/comments",
        "review_comment_url": f"{api}/pulls/comments{{/number}}",
        "comments_url": f"{api}/issues/{number}/comments",
        "statuses_url": f"{api}/statuses/{head_sha}",
        "number": number,
        "state": rec["state"],
        "locked": False,
        "title": rec["title"],
        "user": ctx.user(rec["user"]),
        "body": rec["body"] or None,
        "labels": issue_labels(ctx, repo, rec),
        "milestone": None,
        "active_lock_reason": None,
        "created_at": rec["created_at"],
        "updated_at": rec["updated_at"],
        "closed_at": rec["closed_at"],
        "merged_at": pr["merged_at"],
        "merge_commit_sha": pr["merge_commit_sha"],
        "assignee": assignees[0] if assignees else None,
        "assignees": assignees,
        "requested_reviewers": [],
        "requested_teams": [],
        "head": _branch_end(ctx, repo, pr["head"], head_sha),
        "base": _branch_end(ctx, repo, pr["base"], base_sha),
        "author_association": "MEMBER",
        "auto_merge": None,
        "draft": pr["draft"],
        "merged": pr["merged"],
        # Worked out in the background (checks.py): null until a read asked for it.
        "mergeable": merge[0],
        "rebaseable": merge[2],
        "mergeable_state": merge[1],
        "merged_by": ctx.user(pr["merged_by"]),
        "comments": rec["comments"],
        "review_comments": pr["review_comments"],
        "_links": {
            "self": {"href": url},
            "html": {"href": html},
            "issue": {"href": f"{api}/issues/{number}"},
            "comments": {"href": f"{api}/issues/{number}/comments"},
            "review_comments": {"href": f"{url}/comments"},
            "review_comment": {"href": f"{api}/pulls/comments{{/number}}"},
            "commits": {"href": f"{url}/commits"},
            "statuses": {"href": f"{api}/statuses/{head_sha}"},
        },
        "maintainer_can_modify": False,
        "commits": 1,
        "additions": 1,
        "deletions": 0,
        "changed_files": 1,
    }


def review(ctx: Ctx, repo: Repo, number: int, rec: Record) -> dict[str, Any]:
    html = f"{ctx.html(repo)}/pull/{number}#pullrequestreview-{rec['id']}"
    pr_url = f"{ctx.api(repo)}/pulls/{number}"
    return {
        "id": rec["id"],
        "node_id": f"PRR_{rec['id']}",
        "user": ctx.user(rec["user"]),
        "body": rec["body"],
        "state": rec["state"],
        "html_url": html,
        "pull_request_url": pr_url,
        "author_association": "MEMBER",
        "submitted_at": rec["submitted_at"],
        "commit_id": rec["commit_id"],
        "_links": {"html": {"href": html}, "pull_request": {"href": pr_url}},
    }


def review_comment(ctx: Ctx, repo: Repo, number: int, rec: Record) -> dict[str, Any]:
    api = ctx.api(repo)
    data: dict[str, Any] = {
        "url": f"{api}/pulls/comments/{rec['id']}",
        "pull_request_review_id": rec["review_id"],
        "id": rec["id"],
        "node_id": f"PRRC_{rec['id']}",
        "diff_hunk": f"@@ -{rec['line']},1 +{rec['line']},1 @@",
        "path": rec["path"],
        "position": rec["line"],
        "original_position": rec["line"],
        "commit_id": rec["commit_id"],
        "original_commit_id": rec["commit_id"],
        "user": ctx.user(rec["user"]),
        "body": rec["body"],
        "created_at": rec["created_at"],
        "updated_at": rec["updated_at"],
        "html_url": f"{ctx.html(repo)}/pull/{number}#discussion_r{rec['id']}",
        "pull_request_url": f"{api}/pulls/{number}",
        "author_association": "MEMBER",
        "line": rec["line"],
        "original_line": rec["line"],
        "side": rec["side"],
        "start_line": None,
        "start_side": None,
        "subject_type": "line",
        "_links": {
            "self": {"href": f"{api}/pulls/comments/{rec['id']}"},
            "html": {"href": f"{ctx.html(repo)}/pull/{number}#discussion_r{rec['id']}"},
            "pull_request": {"href": f"{api}/pulls/{number}"},
        },
    }
    if rec["in_reply_to"] is not None:
        data["in_reply_to_id"] = rec["in_reply_to"]
    return data


#: The reactions GitHub knows, in the order its reaction summaries list them.
REACTIONS = ("+1", "-1", "laugh", "hooray", "confused", "heart", "rocket", "eyes")


def reaction_rollup(url: str, reactions: list[Record]) -> dict[str, Any]:
    """A comment's or issue's `reactions` summary: how many of each, and in all."""
    counts = dict.fromkeys(REACTIONS, 0)
    for rec in reactions:
        counts[rec["content"]] += 1
    return {"url": f"{url}/reactions", "total_count": len(reactions), **counts}


def reaction(ctx: Ctx, rec: Record) -> dict[str, Any]:
    return {
        "id": rec["id"],
        "node_id": f"REA_{rec['id']}",
        "user": ctx.user(rec["user"]),
        "content": rec["content"],
        "created_at": rec["created_at"],
    }


def issue_comment(ctx: Ctx, repo: Repo, number: int, rec: Record) -> dict[str, Any]:
    api = ctx.api(repo)
    url = f"{api}/issues/comments/{rec['id']}"
    return {
        "url": url,
        "html_url": f"{ctx.html(repo)}/issues/{number}#issuecomment-{rec['id']}",
        "issue_url": f"{api}/issues/{number}",
        "id": rec["id"],
        "node_id": f"IC_{rec['id']}",
        "user": ctx.user(rec["user"]),
        "created_at": rec["created_at"],
        "updated_at": rec["updated_at"],
        "author_association": "MEMBER",
        "body": rec["body"],
        "performed_via_github_app": None,
        "reactions": reaction_rollup(url, rec.get("reactions", [])),
    }


def git_ref(ctx: Ctx, repo: Repo, ref: str, sha: str) -> dict[str, Any]:
    api = ctx.api(repo)
    return {
        "ref": ref,
        "node_id": f"REF_{sha[:12]}",
        "url": f"{api}/git/{quote(ref)}",
        "object": {"sha": sha, "type": "commit", "url": f"{api}/git/commits/{sha}"},
    }


def branch(ctx: Ctx, repo: Repo, name: str, sha: str) -> dict[str, Any]:
    api = ctx.api(repo)
    self_url = f"{api}/branches/{quote(name)}"
    return {
        "name": name,
        "commit": {
            "sha": sha,
            "node_id": f"C_{sha[:12]}",
            "url": f"{api}/commits/{sha}",
            "html_url": f"{ctx.html(repo)}/commit/{sha}",
        },
        "_links": {"self": self_url, "html": f"{ctx.html(repo)}/tree/{quote(name)}"},
        "protected": False,
        "protection_url": f"{self_url}/protection",
    }
