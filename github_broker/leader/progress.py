"""After the hand-out: progress read from what GitHub shows, stalls, per-task budgets.

Progress is a push to the task's branch, its PR opened or updated, a reply on the PR by its
author, or a changed progress note from the agent's heartbeat (a second source, never the only
one). With healthy webhooks GitHub's deliveries report it (`from_delivery`); otherwise the
leader reads, every `progress.branch_check_interval_s` and at once for a task it has not
read yet, every held task's branch tip and open PRs (of the branch, or closing the issue)
across all repositories in one GraphQL request (gateway/progress.py, a page per 100 held
tasks): the requests of a pass do not grow with the repositories holding tasks. Should that
read fail (anything but the rate limit), the pass reads the REST way instead (each branch
conditionally, each repository's open PRs), logged, and the next pass tries GraphQL again.

A lease alive with no progress for `progress.stall_after_s` is flagged stalled once, with
evidence; the flag clears when progress resumes. It is revoked only if
`progress.revoke_stalled_after_s` is set (off by default: a restart destroys work). A task
held longer than `budgets.wall_clock_s` is set aside for a person (lease_upkeep.lua).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from github_broker.clock import ms_from_iso, now_ms, span
from github_broker.errors import BrokerError, Fenced, GitHubError, RateLimited
from github_broker.gateway import GitHubGateway, HeldBranch
from github_broker.gateway.progress import BranchProgress
from github_broker.leader.reviews import CLOSING_RE
from github_broker.models import LeaseInfo
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: The token a lease rebuilt from GitHub's labels carries until its agent proves it.
ADOPTED = "adopted"
#: Seconds beyond one heartbeat interval an unproven rebuilt lease waits before its PR is
#: taken for its completion.
RECOVER_MARGIN_S = 5
#: Pull request actions that are the author's progress (opened, new commits, edited).
PR_PROGRESS = frozenset({"opened", "reopened", "synchronize", "ready_for_review", "edited"})


@dataclass
class ProgressReport:
    progress: int = 0
    stalled: int = 0
    revoked: int = 0
    set_aside: int = 0
    #: GitHub calls this pass made (GraphQL pages; after a GraphQL failure branch reads and
    #: PR listings, 304s included).
    github_calls: int = 0
    #: GraphQL rate-limit points those calls cost (GitHub's `rateLimit { cost }`).
    graphql_points: int = 0


#: A repository's part of a pass: its settings, store and held tasks.
Held = tuple[Repository, RepoStore, list[LeaseInfo]]


def evidence(lease: LeaseInfo, now: int) -> str:
    """Why a lease looks stalled, in one line: how long held, last progress, heartbeats,
    the agent's last note."""
    parts = [f"held {span((now - lease.claimed_ms) // 1000)}"]
    if lease.progress_ms:
        parts.append(
            f"last progress {span((now - lease.progress_ms) // 1000)} ago ({lease.progress})"
        )
    else:
        parts.append("no push, PR or review reply seen")
    parts.append(f"{lease.beats} heartbeat{'s' if lease.beats != 1 else ''}")
    if lease.note and lease.note_ms:
        parts.append(f"last note {span((now - lease.note_ms) // 1000)} ago: {lease.note[:80]!r}")
    else:
        parts.append("no progress note")
    return ", ".join(parts)


class ProgressKeeper:
    """The leader's view of held tasks: progress, stalls, wall-clock budgets."""

    def __init__(self, settings: Settings, store: Store, gateway: GitHubGateway) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        #: (repository, issue, token) -> (branch tip last seen, when it was read: monotonic s)
        self._heads: dict[tuple[str, int, str], tuple[str | None, float]] = {}
        #: (repository, PR number) -> updated_at last seen
        self._pulls: dict[tuple[str, int], str] = {}
        #: The leader epoch its writes carry (set by the daemon).
        self.epoch = 0

    # --- the leader's pass --------------------------------------------------------------

    async def check_all(self, repos: list[Repository], polled: set[str]) -> ProgressReport:
        """One pass over every repository's held tasks; GitHub is read for the repositories
        in `polled` (webhooks not healthy), all in one request. A repository whose part
        fails is logged and the others go on."""
        report = ProgressReport()
        held: list[Held] = []
        busy = await self.store.holding([repo.full_name for repo in repos])
        for key in [k for k in self._heads if k[0] not in busy]:
            del self._heads[key]
        for repo in repos:
            if repo.full_name not in busy:
                continue  # nothing held, nothing to recover: nothing to read or judge
            rstore = self.store.repo(repo.full_name)
            leases = await rstore.leases()
            self._forget_ended(repo.full_name, leases)
            held.append((repo, rstore, leases))
        reading = [h for h in held if h[2] and h[0].full_name in polled]
        if reading:
            await self._read_github(reading, report)
        for repo, rstore, leases in held:
            try:
                if repo.full_name in polled and leases:
                    leases = await rstore.leases()  # with the progress just recorded
                await self._after_read(repo, rstore, leases, report)
            except (Fenced, RateLimited):
                raise
            except BrokerError as e:
                logger.warning("progress of %s failed: %s", repo.full_name, e)
        return report

    async def _after_read(
        self, repo: Repository, rstore: RepoStore, leases: list[LeaseInfo], report: ProgressReport
    ) -> None:
        await self._recover_completions(repo, rstore, leases, report)
        now = now_ms()
        for lease in leases:
            await self._judge(rstore, lease, now, report)

    async def _judge(
        self, rstore: RepoStore, lease: LeaseInfo, now: int, report: ProgressReport
    ) -> None:
        progress = self.settings.progress
        # A task the broker set aside (its budget) waits for a person, not for its agent:
        # never a stall; after a retry, quiet time counts from the retry.
        since = max(lease.claimed_ms, lease.progress_ms or 0, lease.budget_since_ms or 0)
        quiet_s = (now - since) / 1000
        wall = self.settings.budgets.wall_clock_s
        counted_from = max(lease.claimed_ms, lease.budget_since_ms or 0)
        if wall > 0 and not lease.paused and now - counted_from >= wall * 1000:
            detail = f"held {span((now - counted_from) // 1000)}, budget {span(int(wall))}"
            if await self._upkeep(rstore, "budget", lease, detail):
                report.set_aside += 1
        if lease.paused or progress.stall_after_s <= 0 or quiet_s < progress.stall_after_s:
            return
        if not lease.stalled:
            what = evidence(lease, now)
            if await self._upkeep(rstore, "stall", lease, what):
                report.stalled += 1
                logger.warning(
                    "%s#%d held by %s looks stalled: %s",
                    rstore.repository,
                    lease.issue,
                    lease.agent_id,
                    what,
                )
            return
        revoke_s = progress.revoke_stalled_after_s
        if (
            revoke_s > 0
            and quiet_s >= revoke_s
            and await self._upkeep(rstore, "revoke", lease, evidence(lease, now))
        ):
            report.revoked += 1

    async def _upkeep(self, rstore: RepoStore, action: str, lease: LeaseInfo, what: str) -> bool:
        return await rstore.lease_upkeep(action, lease.issue, lease.token, what, epoch=self.epoch)

    # --- polling GitHub when webhooks are not there -------------------------------------

    async def _read_github(self, reading: list[Held], report: ProgressReport) -> None:
        """Every held branch of `reading` and its PRs in one GraphQL request (a page per 100),
        when one is due; the REST reads instead should it fail."""
        tasks: dict[HeldBranch, tuple[RepoStore, LeaseInfo]] = {}
        for repo, rstore, leases in reading:
            branches = await rstore.task_branches(
                [f"{lease.task_type}:{lease.issue}" for lease in leases]
            )
            for lease in leases:
                branch = branches.get(f"{lease.task_type}:{lease.issue}")
                if branch:
                    tasks[HeldBranch(repo.full_name, lease.issue, branch)] = (rstore, lease)
        if not self._due(tasks):
            return
        try:
            pages = await asyncio.to_thread(self.gateway.held_progress, list(tasks))
        except GitHubError as e:
            logger.warning(
                "progress: the GraphQL read of %d held task(s) failed, read over REST this "
                "pass: %s",
                len(tasks),
                e,
            )
            for repo, rstore, leases in reading:
                await self._read_rest(repo, rstore, leases, report)
            return
        report.github_calls += len(pages)
        report.graphql_points += sum(page.points for page in pages)
        read_at = time.monotonic()
        for page in pages:
            for task, seen in page.seen.items():
                rstore, lease = tasks[task]
                await self._apply(rstore, task, lease, seen, read_at, report)

    def _due(self, tasks: dict[HeldBranch, tuple[RepoStore, LeaseInfo]]) -> bool:
        """Whether some held task was never read or not within the branch interval."""
        interval = self.settings.progress.branch_check_interval_s
        now = time.monotonic()
        for task, (_, lease) in tasks.items():
            seen = self._heads.get((task.repository, task.issue, lease.token))
            if seen is None or now - seen[1] >= interval:
                return True
        return False

    async def _apply(
        self,
        rstore: RepoStore,
        task: HeldBranch,
        lease: LeaseInfo,
        seen: BranchProgress,
        read_at: float,
        report: ProgressReport,
    ) -> None:
        """A held task's progress from what the read saw: its branch moved since the last
        read, or one of its PRs was updated (a PR first seen counts if updated after the
        claim)."""
        key = (task.repository, task.issue, lease.token)
        before = self._heads.get(key)
        self._heads[key] = (seen.head, read_at)
        if before is not None and seen.head is not None and seen.head != before[0]:
            await self._progress(rstore, task.issue, "push", f"{task.branch} at {seen.head[:7]}")
            report.progress += 1
        for number, updated in sorted(seen.pulls.items()):
            last = self._pulls.get((task.repository, number))
            self._pulls[(task.repository, number)] = updated
            if last != updated and (last is not None or _after_claim(updated, lease)):
                await self._progress(rstore, task.issue, "pull_request", f"PR #{number} updated")
                report.progress += 1

    # --- the REST reads, should the GraphQL read fail ---------------------------------------

    async def _read_rest(
        self, repo: Repository, rstore: RepoStore, leases: list[LeaseInfo], report: ProgressReport
    ) -> None:
        branches = await rstore.task_branches(
            [f"{lease.task_type}:{lease.issue}" for lease in leases]
        )
        interval = self.settings.progress.branch_check_interval_s
        for lease in leases:
            branch = branches.get(f"{lease.task_type}:{lease.issue}")
            if not branch:
                continue
            key = (repo.full_name, lease.issue, lease.token)
            seen = self._heads.get(key)
            if seen is not None and time.monotonic() - seen[1] < interval:
                continue
            head = await asyncio.to_thread(self.gateway.branch_head, repo.full_name, branch)
            report.github_calls += 1
            self._heads[key] = (head, time.monotonic())
            if seen is not None and head is not None and head != seen[0]:
                await self._progress(rstore, lease.issue, "push", f"{branch} at {head[:7]}")
                report.progress += 1
        await self._read_pulls(repo, rstore, leases, branches, report)

    async def _read_pulls(
        self,
        repo: Repository,
        rstore: RepoStore,
        leases: list[LeaseInfo],
        branches: dict[str, str],
        report: ProgressReport,
    ) -> None:
        """A PR opened or updated for a held task (the listing is conditional: free while no
        PR of the repository changed)."""
        pulls = await asyncio.to_thread(self.gateway.open_pulls, repo.full_name)
        report.github_calls += 1
        by_branch = {
            b: lease for lease in leases if (b := branches.get(f"{lease.task_type}:{lease.issue}"))
        }
        held = {lease.issue: lease for lease in leases}
        for pull in pulls:
            lease = by_branch.get(str(pull["head"]["ref"])) or next(
                (
                    held[int(m.group(1))]
                    for m in CLOSING_RE.finditer(pull.get("body") or "")
                    if int(m.group(1)) in held
                ),
                None,
            )
            if lease is None:
                continue
            key = (repo.full_name, int(pull["number"]))
            updated = str(pull.get("updated_at") or "")
            before = self._pulls.get(key)
            self._pulls[key] = updated
            if before != updated and (before is not None or _after_claim(updated, lease)):
                await self._progress(
                    rstore, lease.issue, "pull_request", f"PR #{pull['number']} updated"
                )
                report.progress += 1

    async def _recover_completions(
        self, repo: Repository, rstore: RepoStore, leases: list[LeaseInfo], report: ProgressReport
    ) -> None:
        """A development lease rebuilt from GitHub's labels after Redis lost its data, that no
        agent proved within a heartbeat interval, whose branch has a PR: most likely its agent
        completed it and the completion's label write was lost with Redis. It is completed
        (the issue goes to review) instead of going back to the pool to be done twice. The
        same for such a lease that ended unproven (it expired, or its agent proved another
        task: `recovering`), which returns to the pool only when GitHub shows no PR for it."""
        wait_ms = (max(1, self.settings.leases.lease_ttl_s // 3) + RECOVER_MARGIN_S) * 1000
        now = now_ms()
        orphaned = [
            lease
            for lease in leases
            if lease.token == ADOPTED
            and lease.task_type == "development"
            and now - lease.claimed_ms >= wait_ms
        ]
        recovering = await rstore.recovering()
        if not orphaned and not recovering:
            return
        numbers = [lease.issue for lease in orphaned] + list(recovering)
        branches = await rstore.task_branches([f"development:{n}" for n in numbers])
        pulls = await asyncio.to_thread(self.gateway.open_pulls, repo.full_name)
        report.github_calls += 1
        pull_of = partial(_pull_of, pulls, branches)
        for n, agent in recovering.items():
            pull = pull_of(n)
            what = f"PR #{pull['number']}" if pull is not None else ""
            outcome = await rstore.control(
                "recovered", "broker", str(n), what, agent, "1" if pull else ""
            )
            logger.warning(
                "%s#%d (held by %s before Redis lost it): %s",
                repo.full_name,
                n,
                agent,
                outcome.outcome,
            )
        for lease in orphaned:
            pull = pull_of(lease.issue)
            if pull is not None and await rstore.lease_upkeep(
                "recover", lease.issue, ADOPTED, f"PR #{pull['number']}", epoch=self.epoch
            ):
                logger.warning(
                    "%s#%d: completion by %s recovered from PR #%d (Redis lost it)",
                    repo.full_name,
                    lease.issue,
                    lease.agent_id,
                    pull["number"],
                )

    def _forget_ended(self, repository: str, leases: list[LeaseInfo]) -> None:
        live = {(repository, lease.issue, lease.token) for lease in leases}
        for key in [k for k in self._heads if k[0] == repository and k not in live]:
            del self._heads[key]

    async def _progress(self, rstore: RepoStore, n: int, kind: str, what: str) -> bool:
        return await rstore.lease_upkeep("progress", n, "", what, epoch=self.epoch, kind=kind)

    # --- webhooks ---------------------------------------------------------------------

    async def from_delivery(self, repo: Repository, event: str, payload: dict[str, Any]) -> str:
        """A push, PR or review delivery that may be a held task's progress."""
        rstore = self.store.repo(repo.full_name)
        leases = await rstore.leases()
        if not leases:
            return "no held task"
        branches = await rstore.task_branches(
            [f"{lease.task_type}:{lease.issue}" for lease in leases]
        )
        by_branch = {
            b: lease for lease in leases if (b := branches.get(f"{lease.task_type}:{lease.issue}"))
        }
        held = {lease.issue: lease for lease in leases}
        lease, kind, what = _match(event, payload, by_branch, held)
        if lease is None:
            return "not a held task's progress"
        try:
            await self._progress(rstore, lease.issue, kind, what)
        except BrokerError as e:
            logger.warning("progress on %s#%d not recorded: %s", repo.full_name, lease.issue, e)
            raise
        return f"progress on #{lease.issue}: {what}"


def _match(
    event: str,
    payload: dict[str, Any],
    by_branch: dict[str, LeaseInfo],
    held: dict[int, LeaseInfo],
) -> tuple[LeaseInfo | None, str, str]:
    """The held task a delivery is progress of, with its kind and what happened."""
    if event == "push":
        ref = str(payload.get("ref") or "")
        branch = ref.removeprefix("refs/heads/")
        after = str(payload.get("after") or "")
        if payload.get("deleted") or branch == ref:
            return None, "", ""
        if payload.get("created") and not payload.get("commits"):
            return None, "", ""  # the branch made from the base (the broker's own write)
        return by_branch.get(branch), "push", f"{branch} at {after[:7]}"
    pull = payload.get("pull_request")
    if not isinstance(pull, dict):
        return None, "", ""
    lease = by_branch.get(str((pull.get("head") or {}).get("ref") or "")) or next(
        (
            held[int(m.group(1))]
            for m in CLOSING_RE.finditer(pull.get("body") or "")
            if int(m.group(1)) in held
        ),
        None,
    )
    if lease is None:
        return None, "", ""
    action = str(payload.get("action") or "")
    if event == "pull_request" and action in PR_PROGRESS:
        return lease, "pull_request", f"PR #{pull.get('number')} {action}"
    # A reply on the PR by its author (the agent's account): review comments and reviews.
    author = str((pull.get("user") or {}).get("login") or "")
    item = payload.get("comment") or payload.get("review") or {}
    by = str((item.get("user") or {}).get("login") or "") if isinstance(item, dict) else ""
    if event in ("pull_request_review", "pull_request_review_comment") and by and by == author:
        return lease, "review", f"reply by {by} on PR #{pull.get('number')}"
    return None, "", ""


def _after_claim(updated_at: str, lease: LeaseInfo) -> bool:
    """Whether a PR first seen now was updated after its task was handed out (GitHub's times
    are whole seconds: one in the claim's second counts)."""
    try:
        return ms_from_iso(updated_at) >= lease.claimed_ms // 1000 * 1000
    except ValueError:
        return False


def _pull_of(
    pulls: list[dict[str, Any]], branches: dict[str, str], n: int
) -> dict[str, Any] | None:
    """The open PR of issue `n`'s development branch, or one whose body closes it."""
    branch = branches.get(f"development:{n}")
    return next(
        (
            p
            for p in pulls
            if (branch and p["head"]["ref"] == branch)
            or any(int(m.group(1)) == n for m in CLOSING_RE.finditer(p.get("body") or ""))
        ),
        None,
    )
