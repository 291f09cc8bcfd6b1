"""Work as a graph: GitHub's dependencies and sub-issues, and its planning fields (the
organization's Priority field, issue types) as an alternative to the broker's labels."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from github_broker.settings.base import Section


class DependencySettings(Section):
    """Which GitHub relationships decide what is claimable (docs/dependencies.md)."""

    #: Read issue dependencies and sub-issues: an issue with an open blocker is not handed
    #: out, and the order within a priority follows the graph.
    enabled: bool = True
    #: A blocker closed as not planned (or as a duplicate): `block` leaves the dependent
    #: waiting for a person to remove the link or reopen the blocker; `unblock` counts it as
    #: done, like a blocker closed as completed.
    not_planned: Literal["block", "unblock"] = "block"
    #: A blocker in a repository this broker does not serve: `block` (its state cannot be
    #: followed: it blocks, and says so), `last_read` (the state GitHub reported when the
    #: dependent's links were last read: every full pass and every dependency delivery).
    unserved: Literal["block", "last_read"] = "block"
    #: A link added while an agent holds the dependent: `note` (the agent is told at its next
    #: heartbeat and goes on), `pause` (its task waits for the blocker: `waiting_for_user`
    #: until it closes), `revoke` (the lease ends; the issue waits for its blocker).
    after_handout: Literal["note", "pause", "revoke"] = "note"
    #: A parent waits while any of its sub-issues is open; once all are closed it is
    #: development work only if its body asks for work of its own (an assignable body).
    parents_wait: bool = True
    #: Issues whose links one GraphQL request reads (GitHub allows 100 nodes per connection).
    batch: int = Field(50, ge=1, le=100)


class PlanningSettings(Section):
    """GitHub's own planning data as an alternative to P-labels and role labels."""

    #: The organization's single-select issue field read as the priority ('' : not read).
    priority_field: str = ""
    #: Its options and the priority each stands for (P0 most urgent).
    priority_values: dict[str, int] = {"Urgent": 0, "High": 1, "Medium": 2, "Low": 3}
    #: Issue type -> the role that does it (empty: types are not read).
    type_roles: dict[str, str] = {}
    #: An issue with both a label and a field or type: `labels` (the label wins) or
    #: `github` (the field or type wins).
    prefer: Literal["labels", "github"] = "labels"

    @field_validator("priority_values")
    @classmethod
    def _priorities(cls, value: dict[str, int]) -> dict[str, int]:
        bad = sorted(name for name, prio in value.items() if prio < 0)
        if bad:
            raise ValueError(f"priorities are 0 (most urgent) or more; {bad} are not")
        return value
