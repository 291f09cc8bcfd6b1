"""Typed objects passed between modules: mirrored issues, tasks, leases, statuses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, Field

M = TypeVar("M", bound=BaseModel)

#: Agent ids become GitHub label names (max 50 characters) and key parts.
AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$"
#: Largest issue or pull request number in a path or body (JSON's safe integers).
MAX_NUMBER = 2**53 - 1

#: Characters a person's text (a reason, a note) may not carry to agents' terminals and logs:
#: control characters other than newline and tab (C0, DEL, C1: ESC sequences among them) and
#: the bidirectional controls that reorder what a reader sees (right-to-left override, ...).
_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def printable(text: str) -> str:
    """`text` without control characters other than newline and tab, nor bidirectional
    controls: where a maintainer's reason or note enters the broker."""
    return _HIDDEN.sub("", text)


def shown(text: str) -> str:
    """`text` with those characters written as escapes (`\\x1b`, `\\u202e`): how a page shows
    text that entered before it was cleaned, or came from elsewhere (GitHub, an agent)."""
    return _HIDDEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class Authority(IntEnum):
    """Who made a decision on a task or an agent, by rank: a decision is lifted only by the
    same or a higher authority (the table: docs/architecture.md "Who may steer what")."""

    AGENT = 0
    #: A person commenting `/broker …` with write (not maintain or admin) access there.
    COMMENTER = 1
    #: The broker itself: the circuit breaker, budgets, the stall revoke.
    BROKER = 2
    #: A maintainer of some repositories (named in the maintainers file, or by GitHub's
    #: maintain/admin permission there).
    MAINTAINER = 3
    #: An administrator of the deployment.
    ADMIN = 4

    @property
    def title(self) -> str:
        return AUTHORITY_TITLES[self]


AUTHORITY_TITLES = {
    Authority.AGENT: "the agent",
    Authority.COMMENTER: "a writer of the repository",
    Authority.BROKER: "the broker",
    Authority.MAINTAINER: "a maintainer",
    Authority.ADMIN: "an administrator",
}


@dataclass(frozen=True)
class Actor:
    """Who asks for an action: a person by name (or the broker, or an agent), their authority,
    and the repositories they may act on (None: every repository of the deployment)."""

    name: str
    authority: Authority
    repositories: frozenset[str] | None = None

    def may_act_on(self, repository: str) -> bool:
        return self.repositories is None or repository in self.repositories

    @classmethod
    def admin(cls, name: str) -> Actor:
        return cls(name, Authority.ADMIN)

    @classmethod
    def broker(cls, what: str = "broker") -> Actor:
        return cls(what, Authority.BROKER)


class TaskType(StrEnum):
    DEVELOPMENT = "development"
    REVIEW = "review"
    FIX = "fix"


#: Order inside a priority bucket: finish open PRs before starting new work.
TASK_TYPE_RANK = {TaskType.FIX: 0, TaskType.REVIEW: 1, TaskType.DEVELOPMENT: 2}
#: Task score layout: (priority * 4 + type rank) * SCORE_GROUP + creation second. Creation
#: seconds stay below 1e10 until the year 2286; claim.lua decodes the priority back.
SCORE_GROUP = 10_000_000_000

#: Request ids are key parts too: short, no separators Redis keys use.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
#: Most entries a `roles` or `repositories` list may carry before it is even looked at;
#: after deduplication a request can name no more than the configured ones anyway.
MAX_LIST_ITEMS = 64
#: A role or repository name in a request: bounded before it is looked at (SDK, MCP, API).
RoleName = Annotated[str, Field(min_length=1, max_length=100)]
RepoName = Annotated[str, Field(min_length=3, max_length=201)]


def priority_of_score(score: float) -> int:
    """The priority a task score (`(priority * 4 + type rank) * SCORE_GROUP + second`) holds."""
    return int(score // (4 * SCORE_GROUP))


class Outcome(StrEnum):
    """How an agent ends a task it holds."""

    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


class TaskState(StrEnum):
    """A task's state, named as GitHub's agent-task API names them (see docs/architecture.md
    for how labels and lease fields map to each)."""

    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    WAITING_FOR_USER = "waiting_for_user"
    IDLE = "idle"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


#: States of a task that has ended.
TERMINAL_STATES = frozenset(
    {TaskState.COMPLETED, TaskState.FAILED, TaskState.TIMED_OUT, TaskState.CANCELLED}
)
#: The state each way a lease ends leaves its task in.
ENDED_STATE: dict[str, TaskState] = {
    "completed": TaskState.COMPLETED,
    "failed": TaskState.FAILED,
    "abandoned": TaskState.FAILED,
    "expired": TaskState.TIMED_OUT,
    "revoked": TaskState.CANCELLED,
    "issue_closed": TaskState.CANCELLED,
    "label_removed": TaskState.CANCELLED,
}


class LeaseRefusal(StrEnum):
    """Why a heartbeat, completion or release was refused (the 409 `reason`); the Lua
    scripts return these names."""

    EXPIRED = "expired"
    REVOKED = "revoked"
    NOT_OWNER = "not_owner"
    ISSUE_CLOSED = "issue_closed"
    LABEL_REMOVED = "label_removed"
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"
    #: No hand-out of this issue to this agent is known: it never held it.
    NOT_LEASED = "not_leased"


class Issue(BaseModel):
    """An open issue as mirrored in `issue:{n}` (GitHub's field names)."""

    number: int
    title: str
    body: str = ""
    state: str = "open"
    labels: list[str] = []
    user: str | None = None
    created_at: str
    updated_at: str
    html_url: str = ""
    #: GraphQL node id (label writes address the issue by it).
    node_id: str = ""
    #: GitHub's planning data (docs/dependencies.md), as the issue object says: its open and
    #: total blockers, the open issues it blocks, its sub-issues and how many are closed, its
    #: parent (`owner/name#n`; None: the answer did not say, as deliveries do not), its issue
    #: type and its issue field values (field name -> value). `blocked_by_total` -1: the answer
    #: had no dependency summary.
    blocked_by: int = 0
    blocked_by_total: int = 0
    blocking: int = 0
    sub_issues: int = 0
    sub_issues_done: int = 0
    parent: str | None = ""
    issue_type: str = ""
    fields: dict[str, str] = {}

    @classmethod
    def from_github(cls, data: dict[str, Any]) -> Issue:
        labels = [
            lab["name"] if isinstance(lab, dict) else str(lab) for lab in data.get("labels", [])
        ]
        user = data.get("user") or {}
        return cls(
            **_planning(data),
            number=data["number"],
            title=data.get("title") or "",
            body=data.get("body") or "",
            state=data.get("state", "open"),
            labels=sorted(labels),
            user=user.get("login") if isinstance(user, dict) else None,
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            html_url=data.get("html_url") or "",
            node_id=data.get("node_id") or "",
        )

    def cache_json(self) -> str:
        """Canonical JSON: equal issues give equal bytes, so unchanged ones are not rewritten."""
        return self.model_dump_json()


#: `.../repos/{owner}/{name}/issues/{n}` (a parent_issue_url).
_ISSUE_URL = re.compile(r"/repos/([^/]+)/([^/]+)/issues/(\d+)$")


def _planning(data: dict[str, Any]) -> dict[str, Any]:
    """The planning fields of an issue object (Issue's own names)."""
    deps = data.get("issue_dependencies_summary") or {}
    subs = data.get("sub_issues_summary") or {}
    kind = data.get("type") or {}
    fields: dict[str, str] = {}
    for value in data.get("issue_field_values") or []:
        name = value.get("issue_field_name") if isinstance(value, dict) else None
        option = value.get("single_select_option") if isinstance(value, dict) else None
        shown = option.get("name") if isinstance(option, dict) else value.get("value")
        if isinstance(name, str) and shown is not None:
            fields[name] = str(shown)
    parent: str | None = None
    if "parent_issue_url" in data:
        m = _ISSUE_URL.search(str(data.get("parent_issue_url") or ""))
        parent = f"{m.group(1)}/{m.group(2)}#{m.group(3)}" if m else ""
    return {
        "blocked_by": int(deps.get("blocked_by") or 0),
        # -1: the answer has no summary (an older GitHub Enterprise): the links stay unknown.
        "blocked_by_total": int(deps.get("total_blocked_by") or 0) if deps else -1,
        "blocking": int(deps.get("blocking") or 0),
        "sub_issues": int(subs.get("total") or 0),
        "sub_issues_done": int(subs.get("completed") or 0),
        "parent": parent,
        "issue_type": str(kind.get("name") or "") if isinstance(kind, dict) else "",
        "fields": fields,
    }


class SkipReason(BaseModel):
    """Why a work issue is not handed out; shown to maintainers."""

    code: str
    reason: str


class Claimed(BaseModel):
    """What the store returns for a successful claim."""

    repository: str
    task_id: str
    task_type: TaskType
    issue: Issue
    role: str
    branch: str
    token: str
    expires_ms: int
    settled_issue: int | None = None
    settled_outcome: str | None = None
    #: Review and fix tasks: the PR and the feedback (see leader/reviews.py).
    payload: dict[str, Any] | None = None
    #: A task a maintainer reassigned: whose work it continues (see Continuation).
    continues: dict[str, Any] | None = None


class NoTask(BaseModel):
    """What the store returns when nothing can be claimed."""

    reason: str
    bucket: int | None = None
    settled_issue: int | None = None
    settled_outcome: str | None = None
    #: agent_paused / repo_paused: the pause as recorded (JSON); settle-only: "1" when a
    #: reassigned task waits for the agent in this repository.
    detail: str = ""


class AgentPause(BaseModel):
    """An agent paused by a maintainer (pause, stop) or by the circuit breaker."""

    kind: str  # pause | stop | breaker
    by: str
    reason: str = ""
    at: str


class TaskPause(BaseModel):
    """A task set aside for a person (its budget reached): the lease lives on."""

    code: str
    detail: str
    at: str


class Note(BaseModel):
    """A maintainer's message to the agent holding a task."""

    by: str
    text: str
    at: str


class Beat(BaseModel):
    """What a heartbeat learns: the new expiry, the task's state and what happened since."""

    expires_ms: int
    state: TaskState
    notes: list[Note] = []
    paused: TaskPause | None = None
    agent_paused: AgentPause | None = None


class LeaseInfo(BaseModel):
    repository: str
    issue: int
    agent_id: str
    task_type: str
    claimed_ms: int
    expires_ms: int
    #: Heartbeats so far.
    beats: int = 0
    #: The agent's last progress note, and when it changed.
    note: str = ""
    note_ms: int | None = None
    #: The last progress (push, PR, review reply, a new note) and when.
    progress: str = ""
    progress_ms: int | None = None
    #: Why it is flagged stalled (evidence), if it is.
    stalled: str = ""
    #: A budget reached: the task waits for a person (TaskPause as JSON).
    paused: str = ""
    #: Usage this attempt reported.
    used_tokens: int = 0
    used_cost: float = 0.0
    #: The reassignment it continues (JSON), if any.
    continues: str = ""
    token: str = ""
    #: Since when its wall-clock budget counts (a maintainer's retry restarts it).
    budget_since_ms: int | None = None

    @property
    def state(self) -> TaskState:
        if self.paused:
            return TaskState.WAITING_FOR_USER
        return TaskState.IDLE if self.stalled else TaskState.IN_PROGRESS


class Quota(BaseModel):
    """The last rate-limit headers GitHub sent."""

    limit: int | None = None
    remaining: int | None = None
    reset_s: float | None = None
    seen_s: float = Field(default=0.0)


class Continuation(BaseModel):
    """A reassigned task: whose work it continues (their branch and PR stay)."""

    from_agent: str
    by: str
    reason: str = ""
    note: str = ""
    progress: str = ""


class LeaseGrant(BaseModel):
    """The lease that comes with a task: present `token` to heartbeat, complete or release."""

    token: str
    expires_at: str
    heartbeat_interval_s: int


class ReviewComment(BaseModel):
    """One piece of review feedback handed to an agent."""

    id: int
    kind: str  # review | inline | conversation
    author: str
    body: str
    url: str = ""
    path: str | None = None
    line: int | None = None


class Task(BaseModel):
    """A task as agents receive it; field names up to `task_type` are the original's."""

    issue_id: int
    issue_url: str
    title: str
    body: str
    labels: list[str]
    branch_name: str
    prompt: str
    required_role: str
    task_type: TaskType
    repository: str
    base_branch: str
    pr_url: str | None = None
    review_comments: list[ReviewComment] = []
    lease: LeaseGrant
    #: A task a maintainer reassigned to you: continue that agent's work on this branch/PR.
    continues: Continuation | None = None
    #: Where this lease's short-lived GitHub token is fetched (POST with the lease, as a
    #: heartbeat), when the deployment hands them out; None otherwise.
    credential_path: str | None = None


class AgentCredential(BaseModel):
    """A GitHub token for one task: this repository alone, the permissions an agent needs;
    it expires by itself, and the broker revokes it when the lease completes or is released."""

    token: str
    #: ISO 8601 UTC, as GitHub says.
    expires_at: str
    repository: str
    #: permission -> read or write (contents, pull_requests, issues).
    permissions: dict[str, str]


class Event(BaseModel):
    """One entry of a timeline stream: what happened, to which issue, by which agent."""

    at_ms: int
    kind: str
    #: The stream entry id: read on after it with `timeline_since`.
    id: str = ""
    repository: str | None = None
    issue: int | None = None
    agent: str = ""
    detail: str = ""
    #: A lease that ended: the state it left its task in (completed, failed, timed_out,
    #: cancelled).
    state: TaskState | None = None


class AuditEntry(BaseModel):
    """One action in the audit log: who did what to which issue or agent, why, and what
    actually happened."""

    at_ms: int
    id: str = ""
    #: The person by name (or `broker`, or an agent id).
    actor: str
    #: Their authority when they acted (see Authority).
    authority: Authority = Authority.BROKER
    action: str
    repository: str | None = None
    issue: int | None = None
    agent: str = ""
    reason: str = ""
    outcome: str = ""
    #: When the action ended a lease: the state it left the task in.
    state: TaskState | None = None


class Waiting(BaseModel):
    """Work that waits on a person: why, since when."""

    issue: int
    #: awaiting_feedback | needs_human | budget | held | checks_failed | checks_stale |
    #: checks_approval
    code: str
    since_ms: int
    detail: str = ""
    priority: int | None = None


class Judgement(BaseModel):
    """What a claim would decide for one agent in one repository now (explain.lua)."""

    repository: str
    agent: str
    bucket: int | None = None
    agent_paused: dict[str, Any] | None = None
    repo_paused: dict[str, Any] | None = None
    #: A task a maintainer reassigned to the agent here (it comes first).
    reserved: dict[str, Any] | None = None
    #: The issue the agent holds here (its next request settles it first).
    held: int | None = None
    #: The task the claim would hand out here, if any.
    next_id: str | None = None
    #: The first ready tasks in claim order: {id, score, role, why} (see explain.lua).
    judged: list[dict[str, Any]] = []
    #: The repository is left out of claims (its sync keeps failing): why.
    out_of_service: str | None = None
    #: Its fair share among the repositories tied with it in claim order, in words ('' none).
    share: str = ""


class ControlOutcome(BaseModel):
    """What a maintainer's action did in one repository."""

    outcome: str
    agent: str = ""
    #: The issue's tasks must be indexed again from its cache (a retry after the failure
    #: budget dropped them).
    reindex: bool = False
    #: The agent a person just took the issue from and until when (ms) it is kept from it:
    #: `<agent>|<ms>`, or "".
    kept_away: str = ""


def constructed(cls: type[M], fields: dict[str, Any]) -> M:
    """`cls.model_construct(**fields)` for values that are already valid and name every
    field: what `model_construct` leaves behind (the values as `__dict__`, every field set, no
    extra or private values) without its per-field loop: 2.5 µs against 8.3 µs for a Task and
    its LeaseGrant here. For
    models without aliases, private attributes or `model_post_init` (checked in the tests)."""
    model = cls.__new__(cls)
    _setattr(model, "__dict__", fields)
    _setattr(model, "__pydantic_fields_set__", set(fields))
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


_setattr = object.__setattr__


class ActionAnswer(BaseModel):
    """What a maintainer's action really did (the admin API's and the dashboard's answer)."""

    action: str
    target: str
    outcome: str
    repositories: dict[str, str] = {}
