"""Done means green: what the broker reads of its pull requests' CI and mergeability, and what
it does about a failure, a conflict and overlapping PRs (docs/checks.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from github_broker.settings.base import Section


class ChecksSettings(Section):
    #: Read the checks and mergeability of the PRs the broker tracks; off, a PR is done for
    #: the broker once it is opened (review and fix rounds from comments only).
    enabled: bool = True
    #: When a PR goes to review: `auto` waits for its required checks to pass when the base
    #: branch requires any (at once otherwise), `on` always waits for green (every check
    #: counts when none is required), `off` never waits.
    review_when_green: Literal["auto", "on", "off"] = "auto"
    #: Check names counted as required on top of the base branch's protection.
    required: list[str] = []
    #: Which checks make a fix task when nothing is required: `all` (any failing check) or
    #: `none` (CI is only shown).
    when_none_required: Literal["all", "none"] = "all"
    #: Fix rounds from failing checks and rebase rounds from conflicts per issue; past them
    #: the issue waits for a person (`checks_failed`), with the rounds' history.
    max_rounds: int = Field(3, ge=1)
    #: Seconds a fix or rebase task is offered only to the agent that wrote the PR; then to
    #: any agent of the role.
    author_first_s: float = Field(300.0, ge=0)
    #: Checks still pending this many seconds after the broker first saw the head commit are
    #: flagged: the issue waits for a person (`checks_stale`) instead of for the checks.
    pending_stale_s: float = Field(1800.0, gt=0)
    #: Seconds the base branch's required checks are kept before they are read again (a
    #: conditional request: a free 304 while they do not change).
    required_refresh_s: float = Field(300.0, gt=0)
    #: Failing checks one fix task names, annotations per check, characters per summary or
    #: annotation message: what an agent is handed stays bounded.
    max_failing_checks: int = Field(5, ge=1, le=50)
    max_annotations: int = Field(5, ge=0, le=50)
    max_text_chars: int = Field(2000, ge=100, le=65535)
    #: Hold the review of the later of two open agent PRs that change the same files until the
    #: earlier one merges; off (the default), overlaps are only reported.
    hold_overlapping: bool = False
    #: PRs one polling request reads (more tracked PRs: another request).
    page_size: int = Field(25, ge=1, le=50)
