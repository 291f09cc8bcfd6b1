"""What the broker reads on GitHub: repositories, roles, label names, assignable bodies."""

from __future__ import annotations

import re

from pydantic import (
    Field,
    field_validator,
)

from github_broker.settings.base import Section


class Repository(Section):
    owner: str = Field(min_length=1)
    name: str = Field(min_length=1)
    #: Branch new work starts from; None means the repository's default branch.
    base_branch: str | None = None
    #: Its share of hand-outs among repositories with work at the same priority, against
    #: theirs (claim/share.py): weight 2 gets two tasks for every one of a weight-1 one.
    weight: int = Field(default=1, ge=1, le=1000)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"


class Role(Section):
    role: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str = ""


class LabelNames(Section):
    in_progress: str = "in-progress"
    needs_review: str = "needs-review"
    review_done: str = "review-done"
    needs_human: str = "needs-human"
    story: str = "story"
    epic: str = "epic"
    #: Regex with one group capturing the priority number; lower is more urgent.
    priority_pattern: str = r"^P(\d+)$"

    @field_validator("priority_pattern")
    @classmethod
    def _one_group(cls, value: str) -> str:
        try:
            compiled = re.compile(value)
        except re.error as e:
            raise ValueError(f"not a valid regular expression: {e}") from e
        if compiled.groups != 1:
            raise ValueError("must contain exactly one capturing group for the number")
        return value


class BodyPatterns(Section):
    """How an assignable body is recognised (multiline regexes, searched, not matched)."""

    deliverables: list[str] = [r"^#{1,6}\s*成果物", r"^#{1,6}\s*Deliverables\b"]
    #: Each pattern captures the branch name in group 1.
    branch: list[str] = [
        r"作業ブランチ[^\n]*?[:\uff1a]\*{0,2}\s*`?([^\s`*]+)`?",
        r"^##\s*ブランチ名[ \t]*\n(?:[ \t]*\n)*[ \t]*(?:[-*][ \t]*)?`?([^\s`*]+)`?",
        r"^\s*(?:[-*]\s*)?\**Branch\**\s*:\**\s*`?([^\s`*]+)`?",
    ]
    #: Replaced by `issue-<n>` inside branch names.
    placeholder: str = "issue-xx"

    @field_validator("deliverables", "branch")
    @classmethod
    def _compiles(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern, re.MULTILINE)
            except re.error as e:
                raise ValueError(f"pattern {pattern!r} is not a valid regex: {e}") from e
        return patterns


def label_clash(agent_id: str, labels: LabelNames, roles: list[str]) -> str | None:
    """The label the broker reads or writes that `agent_id` equals, or None. GitHub compares
    label names case-insensitively, so `p0` is the `P0` label and `Needs-Review` is ours."""
    names = [*labels.model_dump(exclude={"priority_pattern"}).values(), *roles]
    folded = agent_id.casefold()
    hit = next((name for name in names if name.casefold() == folded), None)
    if hit is not None:
        return str(hit)
    if re.match(labels.priority_pattern, agent_id, re.IGNORECASE):
        return f"the priority labels ({labels.priority_pattern})"
    return None
