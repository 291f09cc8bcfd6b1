"""The task as an agent receives it: the original's fields, the prompt (with the review
feedback and, for a reassigned task, whose work it continues) and the lease grant."""

from __future__ import annotations

from typing import Any

from github_broker.claim.credentials import credential_path
from github_broker.claim.prompts import VARIANTS, Prompts
from github_broker.clock import iso_from_ms
from github_broker.models import (
    Claimed,
    Continuation,
    LeaseGrant,
    ReviewComment,
    Task,
    constructed,
)
from github_broker.settings import Settings


class Handout:
    """Builds the Task of a claim (once per claim, on the hot path)."""

    def __init__(self, settings: Settings, prompts: Prompts) -> None:
        self.prompts = prompts
        self.role_descriptions = {a.role: a.description for a in settings.agents}
        # Three heartbeats per lease: one lost request never costs the lease.
        self.heartbeat_interval_s = max(1, settings.leases.lease_ttl_s // 3)
        #: Whether each lease may fetch a scoped GitHub token (claim/credentials.py).
        self.credentials = settings.github.agent_credentials

    def task(self, claimed: Claimed, base: str) -> Task:
        """The task for a claim; `base`: the branch its work starts from."""
        continues = continuation(claimed.continues)
        issue = claimed.issue
        payload = claimed.payload or {}
        comments = [ReviewComment.model_validate(c) for c in payload.get("comments") or []]
        prompt = self._prompt(claimed, base, comments)
        if continues is not None:
            prompt += "\n\n" + render_continuation(continues, claimed.branch, payload)
        # Every field comes from already-validated models: construct, don't re-validate
        # (this runs once per claim, on the hot path).
        lease = constructed(
            LeaseGrant,
            {
                "token": claimed.token,
                "expires_at": iso_from_ms(claimed.expires_ms),
                "heartbeat_interval_s": self.heartbeat_interval_s,
            },
        )
        return constructed(
            Task,
            {
                "issue_id": issue.number,
                "issue_url": issue.html_url,
                "title": issue.title,
                "body": issue.body,
                "labels": issue.labels,
                "branch_name": claimed.branch,
                "prompt": prompt,
                "required_role": claimed.role,
                "task_type": claimed.task_type,
                "repository": claimed.repository,
                "base_branch": base,
                "pr_url": payload.get("pr_url") or None,
                "review_comments": comments,
                "lease": lease,
                "continues": continues,
                "credential_path": credential_path(claimed.repository, issue.number)
                if self.credentials
                else None,
            },
        )

    def _prompt(self, claimed: Claimed, base: str, comments: list[ReviewComment]) -> str:
        """The task's prompt from its type's template (a fix from failing checks or a
        rebase has a template of its own)."""
        issue, payload = claimed.issue, claimed.payload or {}
        values = {
            "repository": claimed.repository,
            "issue_number": str(issue.number),
            "issue_url": issue.html_url,
            "title": issue.title,
            "body": issue.body,
            "labels": ", ".join(issue.labels),
            "branch": claimed.branch,
            "base_branch": base,
            "role": claimed.role,
            "role_description": self.role_descriptions.get(claimed.role, ""),
            "task_type": claimed.task_type.value,
            "pr_url": payload.get("pr_url", ""),
            "feedback": render_feedback(comments),
            "head_sha": str(payload.get("head_sha") or ""),
        }
        template = payload.get("template")
        if template not in VARIANTS:
            template = claimed.task_type
        return self.prompts.render(template, values)


def continuation(data: dict[str, Any] | None) -> Continuation | None:
    if not data:
        return None
    return Continuation(
        from_agent=str(data.get("from") or ""),
        by=str(data.get("by") or ""),
        reason=str(data.get("reason") or ""),
        note=str(data.get("note") or ""),
        progress=str(data.get("progress") or ""),
    )


def render_continuation(c: Continuation, branch: str, payload: dict[str, Any]) -> str:
    """What the prompt adds for a reassigned task: whose work it continues, and where."""
    why = f" ({c.reason})" if c.reason else ""
    lines = [f"This task was reassigned to you by {c.by}{why}."]
    if c.from_agent:
        lines.append(
            f"Continue the work of {c.from_agent}: its commits are on branch `{branch}`"
            + (f", its PR is {payload['pr_url']}" if payload.get("pr_url") else "")
            + "; build on them, do not start over."
        )
    if c.note:
        lines.append(f"Its last progress note: {c.note}")
    if c.progress:
        lines.append(f"Its last progress seen on GitHub: {c.progress}")
    return "\n".join(lines)


def render_feedback(comments: list[ReviewComment]) -> str:
    """Feedback as the prompt shows it: one block per comment, with author and place."""
    if not comments:
        return "(no review comments yet)"
    blocks = []
    for c in comments:
        where = f" on {c.path}:{c.line}" if c.path else ""
        blocks.append(f"- {c.author} ({c.kind}{where}) {c.url}\n  " + c.body.replace("\n", "\n  "))
    return "\n".join(blocks)
