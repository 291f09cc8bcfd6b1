"""The assignment rules that depend only on an issue itself: priority, role, body, branch."""

from __future__ import annotations

import re
from dataclasses import dataclass

from github_broker.clock import ms_from_iso
from github_broker.models import SCORE_GROUP, TASK_TYPE_RANK, Issue, SkipReason, TaskType
from github_broker.settings import Settings

_BAD_REF_CHARS = re.compile(r"[\x00-\x20~^:?*\[\\\x7f]")
#: Agent ids double as labels; the API accepts only these.
_AGENT_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$")


#: The dependency order inside a priority (docs/dependencies.md): a task whose issue blocks
#: more open issues comes first (ORDER_TIERS tiers: 3 or more, 2, 1, none), then by its order
#: time: its creation second, or for a sub-issue its parent's plus its place among its
#: siblings. Both fit the creation second's room of the score (below SCORE_GROUP): seconds
#: since ORDER_EPOCH_S (2008-01-01, before any GitHub issue) stay below ORDER_TIER_S until 2071.
ORDER_TIERS = 4
ORDER_TIER_S = 2_000_000_000
ORDER_EPOCH_S = 1_199_145_600


def task_score(
    priority: int,
    task_type: TaskType,
    created_at: str,
    *,
    unblocks: int | None = None,
    order_s: int | None = None,
) -> int:
    """`(priority * 4 + type rank) * SCORE_GROUP + creation second`; with `unblocks` (the
    dependency order is on) the low part is the graph order instead (see ORDER_TIERS)."""
    second = ms_from_iso(created_at) // 1000 if order_s is None else order_s
    low = second
    if unblocks is not None:
        tier = ORDER_TIERS - 1 - min(max(unblocks, 0), ORDER_TIERS - 1)
        low = tier * ORDER_TIER_S + min(max(second - ORDER_EPOCH_S, 0), ORDER_TIER_S - 1)
    return (priority * 4 + TASK_TYPE_RANK[task_type]) * SCORE_GROUP + low


def branch_problem(name: str, base_branch: str | None) -> str | None:
    """Why `name` is not a usable branch (git check-ref-format rules), or None."""
    if not name:
        return "empty branch name"
    if base_branch and name == base_branch:
        return f"branch {name!r} is the base branch"
    # git stores refs as files: refs/heads/develop and refs/heads/develop/sub cannot coexist.
    if base_branch and name.startswith(base_branch + "/"):
        return f"branch {name!r} lies under the base branch {base_branch!r}; git cannot create it"
    if base_branch and base_branch.startswith(name + "/"):
        return f"the base branch {base_branch!r} lies under branch {name!r}; git cannot create it"
    if name in {"HEAD", "@"} or name.startswith(("-", "/")) or name.endswith(("/", ".")):
        return f"branch {name!r} is not a valid git ref name"
    if ".." in name or "@{" in name or "//" in name or _BAD_REF_CHARS.search(name):
        return f"branch {name!r} contains characters git does not allow"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return f"branch {name!r} has a component git does not allow ({part!r})"
    return None


@dataclass(frozen=True)
class Analysis:
    """What the rules conclude about one issue."""

    priority: int | None  # set for work issues: priority + known role, not a container
    role: str | None
    branch: str | None
    skip: SkipReason | None  # set when a work-looking issue cannot be handed out

    @property
    def assignable(self) -> bool:
        return self.priority is not None and self.skip is None


class Rules:
    """Compiled label and body rules of one deployment."""

    def __init__(self, settings: Settings) -> None:
        labels = settings.labels
        self.priority_re = re.compile(labels.priority_pattern)
        self.roles = settings.roles
        self.containers = {labels.story, labels.epic}
        self.needs_human = labels.needs_human
        self.deliverables = [re.compile(p, re.MULTILINE) for p in settings.body.deliverables]
        self.branch_patterns = [re.compile(p, re.MULTILINE) for p in settings.body.branch]
        self.placeholder = settings.body.placeholder
        self.known_labels = {
            labels.in_progress,
            labels.needs_review,
            labels.review_done,
            labels.needs_human,
            labels.story,
            labels.epic,
            *self.roles,
        }
        self.in_progress = labels.in_progress
        self.known_agents = set(settings.server.resolved_agent_tokens().values())
        self.needs_review = labels.needs_review
        self.bucket_counts_unassignable = settings.bucket_counts_unassignable
        self.planning = settings.planning
        deps = settings.dependencies
        self.parents_wait = deps.enabled and deps.parents_wait
        #: Development tasks follow the dependency order (task_score's `unblocks`).
        self.graph_order = deps.enabled

    def priority(self, labels: list[str]) -> int | None:
        found = [int(m.group(1)) for lab in labels if (m := self.priority_re.match(lab))]
        return min(found) if found else None

    def role(self, labels: list[str]) -> str | None:
        present = set(labels)
        return next((r for r in self.roles if r in present), None)

    def issue_priority(self, issue: Issue) -> int | None:
        """The priority from the labels or the organization's Priority field
        (`planning.prefer` decides when both say one)."""
        return self.planned(issue)[0]

    def issue_role(self, issue: Issue) -> str | None:
        """The role from the labels or the issue type (`planning.type_roles`)."""
        return self.planned(issue)[1]

    def planned(self, issue: Issue) -> tuple[int | None, str | None, str]:
        """(priority, role, what GitHub's planning data decided in words, '' if nothing)."""
        plan = self.planning
        label_prio, label_role = self.priority(issue.labels), self.role(issue.labels)
        option = issue.fields.get(plan.priority_field) if plan.priority_field else None
        field_prio = plan.priority_values.get(option) if option is not None else None
        type_role = plan.type_roles.get(issue.issue_type) if issue.issue_type else None
        github = plan.prefer == "github"
        prio = field_prio if field_prio is not None and (github or label_prio is None) else None
        role = type_role if type_role is not None and (github or label_role is None) else None
        words = []
        if prio is not None:
            beside = f"; its label says P{label_prio}" if label_prio is not None else ""
            words.append(f"P{prio} from the {plan.priority_field} field ({option}){beside}")
        if role is not None:
            beside = f"; its label says {label_role}" if label_role is not None else ""
            words.append(f"role {role} from its issue type {issue.issue_type}{beside}")
        return (
            label_prio if prio is None else prio,
            label_role if role is None else role,
            "; ".join(words),
        )

    def branch(self, issue: Issue) -> str | None:
        for pattern in self.branch_patterns:
            m = pattern.search(issue.body)
            if m:
                return m.group(1).replace(self.placeholder, f"issue-{issue.number}")
        return None

    def holder(self, labels: list[str]) -> str | None:
        """The agent an `in-progress` issue's labels name, when exactly one label can be it."""
        if self.in_progress not in labels:
            return None
        rest = self._agent_like(labels)
        if self.known_agents:
            rest = [lab for lab in rest if lab in self.known_agents]
        return rest[0] if len(rest) == 1 else None

    def _agent_like(self, labels: list[str]) -> list[str]:
        return [
            lab
            for lab in labels
            if lab not in self.known_labels
            and not self.priority_re.match(lab)
            and _AGENT_LABEL.match(lab)
        ]

    def orphan(self, labels: list[str]) -> tuple[str, list[str]]:
        """For an issue in-progress on GitHub with no live lease: why it is not handed out, and
        the label that names an agent which is not a configured one (removed with in-progress
        once the lease TTL passed), when exactly one label can be that agent; ("", []) for an
        issue not in-progress."""
        if self.in_progress not in labels:
            return "", []
        holder = self.holder(labels)
        if holder is not None:
            return (
                f"labelled {self.in_progress} for {holder!r} on GitHub with no live lease: its "
                "lease is rebuilt once the broker's own label writes on it are on GitHub",
                [],
            )
        candidates = self._agent_like(labels)
        after = f"{self.in_progress} comes off once it stayed so for the lease TTL"
        if len(candidates) == 1 and self.known_agents:
            name = candidates[0]
            return (
                f"labelled {self.in_progress} for {name!r}, which is not a configured agent "
                f"(server.agent_tokens), with no live lease: both labels come off once it "
                "stayed so for the lease TTL",
                candidates,
            )
        if candidates:
            names = ", ".join(repr(lab) for lab in candidates)
            return (
                f"labelled {self.in_progress} with no live lease and several labels that may "
                f"name its agent ({names}): {after}",
                [],
            )
        return f"labelled {self.in_progress} with no agent label and no live lease: {after}", []

    def analyse(self, issue: Issue, base_branch: str | None) -> Analysis:
        priority, role, _ = self.planned(issue)
        if priority is None and role is None:
            return Analysis(None, None, None, None)  # not addressed to the broker at all
        branch = self.branch(issue)
        if self.containers & set(issue.labels):
            return Analysis(
                None, role, branch, _skip("container", "story/epic issues are containers")
            )
        parent = self._parent_skip(issue)
        if parent is not None:
            return Analysis(None, role, branch, parent)
        if self.needs_human in issue.labels:
            return Analysis(None, role, branch, _skip("needs_human", "labelled needs-human"))
        if priority is None:
            return Analysis(None, role, branch, _skip("no_priority", "no priority label"))
        if role is None:
            return Analysis(None, None, branch, self._role_skip(issue.labels))
        if not any(p.search(issue.body) for p in self.deliverables):
            return Analysis(
                priority, role, branch, _skip("no_deliverables", "body has no deliverables section")
            )
        if branch is None:
            return Analysis(priority, role, None, _skip("no_branch", "body names no branch"))
        problem = branch_problem(branch, base_branch)
        if problem:
            return Analysis(priority, role, branch, _skip("bad_branch", problem))
        return Analysis(priority, role, branch, None)

    def _parent_skip(self, issue: Issue) -> SkipReason | None:
        """A parent waits for its open sub-issues; once all are closed it is development work
        only if its body asks for work of its own (deliverables and a branch)."""
        if not self.parents_wait or issue.sub_issues <= 0:
            return None
        left = issue.sub_issues - issue.sub_issues_done
        if left > 0:
            return _skip(
                "sub_issues_open",
                f"a parent: waits for {left} of its {issue.sub_issues} sub-issues to close",
            )
        if any(p.search(issue.body) for p in self.deliverables) and self.branch(issue):
            return None
        return _skip(
            "sub_issues_done",
            f"all {issue.sub_issues} sub-issues are closed: for a person to review and close "
            "(its body asks for no work of its own: no deliverables and branch)",
        )

    def _role_skip(self, labels: list[str]) -> SkipReason:
        """No configured role label: name the labels that look like an unknown role."""
        known = ", ".join(self.roles) or "(none configured)"
        holder = self.holder(labels)
        unknown = [
            lab
            for lab in labels
            if lab not in self.known_labels
            and lab != holder
            and lab not in self.known_agents
            and not self.priority_re.match(lab)
        ]
        if unknown:
            names = ", ".join(repr(lab) for lab in unknown)
            reason = f"no configured role label ({names} is not a role); roles: {known}"
            return _skip("unknown_role", reason)
        return _skip("no_role", f"no role label; roles: {known}")

    def pins_bucket(self, issue: Issue, analysis: Analysis) -> bool:
        """Whether a work issue holds the strict bucket at its priority.

        Work someone can take, or is taking or reviewing, does; an issue skipped for its
        body does not unless `bucket_counts_unassignable` is set.
        """
        if analysis.priority is None or analysis.skip is None:
            return True
        if self.bucket_counts_unassignable:
            return True
        return bool({self.in_progress, self.needs_review} & set(issue.labels))


def _skip(code: str, reason: str) -> SkipReason:
    return SkipReason(code=code, reason=reason)
