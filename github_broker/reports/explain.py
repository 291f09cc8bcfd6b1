"""`explain`: the claim's own judgement for one agent, in words.

The verdicts on claimable tasks come from explain.lua, which runs the claim's rules
(`pick_task`, `task_verdict`, the bucket, pauses, reassignments in _lib.lua) without side
effects; the order of repositories is the claim's own (`claim.walk.claim_order`). What is not
claimable at all (held by another agent, skipped, waiting on a person, in its review loop) is
read from the indexes: state, not rules. No rule is worked out again here.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from github_broker.claim.rules import Rules
from github_broker.claim.share import FairShare
from github_broker.claim.walk import judge
from github_broker.clock import iso_from_ms, now_ms, span
from github_broker.models import Issue, Judgement, LeaseInfo, priority_of_score
from github_broker.reports.blockers import blocker_words, same_repository
from github_broker.reports.status import waiting_reviews
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store

#: Blocking issues named per "waits" verdict (the rest are counted, not listed).
MAX_BLOCKERS = 10
#: Ready tasks judged one by one per repository (in claim order); the rest are counted.
JUDGED = 5000

#: What explain.lua's causes mean, for the agent asking.
CAUSES = {
    "cooldown": ("cooldown", "in your cool-down after your failed attempt on it"),
    "review_author": (
        "review_author",
        "the review of your own work: offered to you once nobody else took it",
    ),
    "held": ("held", "a lease holds it (its index entry is cleaned by the next claim)"),
    "given_up": ("cooldown", "the task you just gave up"),
    "author_first": (
        "author_first",
        "a fix of another agent's PR (failing checks or a conflict): offered to its author "
        "first (checks.author_first_s)",
    ),
}
#: What each way of waiting on a person means.
WAITING = {
    "awaiting_feedback": "reviewed; waits for a maintainer to merge the PR or ask for changes",
    "needs_human": "labelled needs-human: a person must look at it (retry clears it)",
    "budget": "its budget is reached: set aside until a maintainer retries it",
    "held": "held by a maintainer until a retry",
    "checks_failed": "its PR's checks still fail after every fix round: a person must look",
    "checks_stale": "its PR's checks are pending too long: re-run them or fix CI",
    "checks_approval": "its PR's workflows wait for a maintainer's approval",
}


class Blocker(BaseModel):
    """An issue another one waits for."""

    issue: int
    url: str


class Verdict(BaseModel):
    issue: int
    url: str = ""
    priority: int | None
    #: next | queued | held | outside_bucket | role | cooldown | review_author | author_first |
    #: paused | repo_paused | blocked | skipped | waiting_on_person | waiting | out_of_service
    verdict: str
    detail: str
    #: The issues this one waits for (outside_bucket: the open work that holds the bucket).
    blocking: list[Blocker] = []


def _v(n: int, priority: int | None, verdict: str, detail: str) -> Verdict:
    return Verdict(issue=n, priority=priority, verdict=verdict, detail=detail)


def _pause_text(raw: dict[str, Any]) -> str:
    who = "the circuit breaker" if raw.get("kind") == "breaker" else raw.get("by", "?")
    why = f": {raw['reason']}" if raw.get("reason") else ""
    return f"{who}{why}"


async def explain(
    store: Store,
    settings: Settings,
    *,
    agent_id: str | None = None,
    roles: list[str] | None = None,
    repositories: list[str] | None = None,
    share: FairShare | None = None,
) -> dict[str, list[Verdict]]:
    """Per repository (in the order the claim tries them), each issue's verdict for
    `agent_id` (None: a fresh agent) accepting `roles`: exactly one `next` overall, the task a
    request-task would hand it now. `share`: the serving process's turns of repositories
    (None, outside a serve process: ties in claim order go by the configured order)."""
    names = repositories or list(store.repos)
    return await explain_stores([store.repo(n) for n in names], settings, agent_id, roles, share)


async def explain_repo(
    rstore: RepoStore, settings: Settings, roles: list[str] | None, agent_id: str | None = None
) -> list[Verdict]:
    """One repository's verdicts (as `explain`, that repository alone)."""
    return (await explain_stores([rstore], settings, agent_id, roles))[rstore.repository]


async def explain_stores(
    stores: list[RepoStore],
    settings: Settings,
    agent_id: str | None,
    roles: list[str] | None,
    share: FairShare | None = None,
) -> dict[str, list[Verdict]]:
    judged = await judge(stores, settings, agent_id, roles, JUDGED, share)
    giver = next((j for j in judged if j.next_id), None)
    by_name = {s.repository: s for s in stores}
    return {
        j.repository: await _verdicts(by_name[j.repository], settings, j, giver) for j in judged
    }


class _Listing:
    """The verdicts so far, at most one per issue: the first reason found is the one shown."""

    def __init__(self) -> None:
        self.verdicts: list[Verdict] = []
        self.listed: set[int] = set()

    def add(self, verdict: Verdict) -> None:
        if verdict.issue not in self.listed:
            self.verdicts.append(verdict)
            self.listed.add(verdict.issue)


async def _verdicts(
    rstore: RepoStore, settings: Settings, j: Judgement, giver: Judgement | None
) -> list[Verdict]:
    out = _Listing()
    work = await rstore.work_priorities()
    blockers = await _bucket_blockers(rstore, work, j.bucket)
    if j.out_of_service:
        out.verdicts.append(
            _v(0, None, "out_of_service", f"left out of claims: {j.out_of_service}")
        )
    cycles = await rstore.cycles()
    _judged(out, rstore, j, giver, blockers, cycles)
    held_here = await rstore.leases()
    _held(out, j, work, held_here)
    await _blocked_rest(out, rstore, work, cycles)
    await _waiting(out, rstore, settings, work, held_here)
    rest = [n for n in sorted(work) if n not in out.listed]
    shown_numbers = sorted(out.listed | set(rest))
    issues: list[Issue] = await rstore.get_issues(rest)
    for issue in issues:
        detail = await no_task_detail(rstore, settings, issue)
        out.add(_v(issue.number, work.get(issue.number), "waiting", detail))
    shown = {i.number: i for i in await rstore.get_issues(shown_numbers)}
    _annotate(Rules(settings), out.verdicts, shown)
    return out.verdicts


def _judged(
    out: _Listing,
    rstore: RepoStore,
    j: Judgement,
    giver: Judgement | None,
    blockers: list[Blocker],
    cycles: dict[int, list[str]],
) -> None:
    """The tasks explain.lua judged, in claim order."""
    for row in j.judged:
        task_id, score, role, why = row["id"], float(row["score"]), row["role"], row["why"]
        n = int(task_id.split(":")[1])
        if n in out.listed:
            continue  # a review and a fix of one issue: the first one is what it offers
        out.add(
            _blocked(rstore, n, priority_of_score(score), row.get("blocker"), cycles.get(n))
            if why == "blocked"
            else _claimable(j, giver, task_id, n, score, role, why, blockers)
        )


def _held(out: _Listing, j: Judgement, work: dict[int, int], leases: list[LeaseInfo]) -> None:
    """Issues a lease holds that the claim did not judge."""
    for lease in sorted(leases, key=lambda lease: lease.issue):
        until = iso_from_ms(lease.expires_ms)
        mine = " (yours)" if lease.agent_id == j.agent else ""
        detail = f"{lease.task_type} held by {lease.agent_id}{mine} until {until}"
        if lease.stalled:
            detail += f"; stalled: {lease.stalled}"
        out.add(_v(lease.issue, work.get(lease.issue), "held", detail))


async def _waiting(
    out: _Listing,
    rstore: RepoStore,
    settings: Settings,
    work: dict[int, int],
    held_here: list[LeaseInfo],
) -> None:
    """Issues waiting on a person, skipped, or in their review loop."""
    now = now_ms()
    for n, w in sorted((await rstore.waiting()).items()):
        age = span(max(0, now - w.since_ms) // 1000)
        detail = f"waiting on a person for {age} ({w.code}): {w.detail or WAITING.get(w.code)}"
        out.add(_v(n, w.priority, "waiting_on_person", detail))
    for n, reason in sorted((await rstore.skipped()).items()):
        out.add(_v(n, work.get(n), "skipped", f"{reason.code}: {reason.reason}"))
    reviews = await waiting_reviews(rstore, settings, {}, held_here)
    for n, review in sorted(reviews.items()):
        out.add(_v(n, work.get(n), "waiting", f"{review.step}: {review.detail}"))


async def no_task_detail(rstore: RepoStore, settings: Settings, issue: Issue) -> str:
    """Why an open work issue has no task, no lease and no wait of its own: the broker's own
    label writes GitHub does not show yet (a lease just ended), or in-progress on GitHub with
    no live lease; in words, and when it moves on."""
    intent = await rstore.intent(issue.number)
    adds = set(intent["add"]) | set(intent["on"]) if intent else set()
    removes = set(intent["remove"]) if intent else set()
    labels = settings.labels
    if labels.needs_review in adds - removes:
        return "just completed: its PR goes to review once GitHub shows needs-review (next pass)"
    if labels.in_progress in removes:
        return "its lease just ended: back in the pool once GitHub drops in-progress (next pass)"
    if intent and (intent["add"] or intent["remove"]):
        return "the broker is writing its labels to GitHub; the next pass moves it on"
    if labels.in_progress in issue.labels:
        ttl = span(int(settings.leases.lease_ttl_s))
        return (
            "labelled in-progress on GitHub with no live lease: back in the pool within "
            f"{ttl} unless its agent's heartbeat adopts it again"
        )
    return "no task for it now: the broker's next sync pass reads it again"


async def _blocked_rest(
    out: _Listing, rstore: RepoStore, work: dict[int, int], cycles: dict[int, list[str]]
) -> None:
    """Issues a blocker keeps out of the pool, as the leader last judged (not listed yet)."""
    for n, b in sorted((await rstore.blocked()).items()):
        out.add(_blocked(rstore, n, work.get(n), f"{b.ref} {b.state}", cycles.get(n)))


def _annotate(rules: Rules, verdicts: list[Verdict], shown: dict[int, Issue]) -> None:
    """Each verdict's URL, its blockers' URLs and what GitHub's planning data decided."""
    for verdict in verdicts:
        mirrored = shown.get(verdict.issue)
        verdict.url = mirrored.html_url if mirrored else ""
        for blocker in verdict.blocking:
            ahead = shown.get(blocker.issue)
            blocker.url = blocker.url or (ahead.html_url if ahead else "")
        if mirrored is not None:
            _planning_words(rules, verdict, mirrored, shown)


def _planning_words(rules: Rules, verdict: Verdict, issue: Issue, shown: dict[int, Issue]) -> None:
    """What GitHub's planning data decided for a claimable issue: a sub-issue behind its
    sibling waits for its parent's order; a priority or role from a field or an issue type
    says which rule won over the labels."""
    if verdict.verdict not in ("next", "queued", "outside_bucket", "role"):
        return
    ahead = shown.get(verdict.blocking[0].issue) if verdict.blocking else None
    if (
        verdict.verdict == "queued"
        and ahead is not None
        and issue.parent
        and (ahead.parent == issue.parent)
    ):
        verdict.detail = (
            f"claimable, waits for its parent's order: #{ahead.number} comes first in "
            f"{issue.parent}"
        )
    planned = rules.planned(issue)[2]
    if planned:
        verdict.detail += f" ({planned})"


def _blocked(
    rstore: RepoStore, n: int, prio: int | None, blocker: str | None, cycle: list[str] | None
) -> Verdict:
    """An issue a blocker keeps waiting (explain.lua's judgement, or the leader's last)."""
    ref, _, state = (blocker or "? unknown").rpartition(" ")
    verdict = _v(n, prio, "blocked", blocker_words(ref, state, cycle))
    other = same_repository(rstore, ref)
    if other is not None:
        verdict.blocking = [Blocker(issue=other, url="")]
    return verdict


def _claimable(
    j: Judgement,
    giver: Judgement | None,
    task_id: str,
    n: int,
    score: float,
    role: str,
    why: str,
    blockers: list[Blocker],
) -> Verdict:
    """The verdict on one ready task, from explain.lua's judgement of it."""
    prio = priority_of_score(score)
    kind = task_id.split(":")[0]
    if j.out_of_service:
        return _v(n, prio, "out_of_service", f"repository out of service: {j.out_of_service}")
    if j.agent_paused is not None and why in ("", "queued", "bucket"):
        return _v(n, prio, "paused", f"you are paused by {_pause_text(j.agent_paused)}")
    if j.repo_paused is not None and why in ("", "queued", "bucket"):
        return _v(n, prio, "repo_paused", f"handed out nobody: {_pause_text(j.repo_paused)}")
    share = f"; fair share: {j.share}" if j.share else ""
    if why == "" and giver is j:
        return _v(n, prio, "next", f"{kind} task you would get now{share}")
    if why in ("", "queued"):
        return _queued(j, giver, n, prio, share)
    if why == "role":
        return _v(n, prio, "role", f"needs role {role}, not one of yours")
    if why == "bucket":
        verdict = _v(n, prio, "outside_bucket", f"P{prio} waits while P{j.bucket} work is open")
        verdict.blocking = blockers
        return verdict
    verdict_name, detail = CAUSES.get(why, (why, why))
    return _v(n, prio, verdict_name, detail)


def _queued(j: Judgement, giver: Judgement | None, n: int, prio: int, share: str) -> Verdict:
    """Claimable, behind the task the agent would get now (here or in another repository,
    whose turn comes first when the two share by weight)."""
    verdict = _v(n, prio, "queued", "claimable, behind the task you would get now")
    if giver is not None and giver.next_id:
        ahead = int(giver.next_id.split(":")[1])
        tied = share and giver.share and giver.bucket == j.bucket
        turn = f" (its turn comes first{share})" if tied else ""
        where = "" if giver is j else f" in {giver.repository}{turn}"
        verdict.detail = f"claimable, behind #{ahead}{where}"
        verdict.blocking = [Blocker(issue=ahead, url="")] if giver is j else []
    return verdict


async def _bucket_blockers(
    rstore: RepoStore, work: dict[int, int], bucket: int | None
) -> list[Blocker]:
    """The open work issues at the bucket's priority: what everything below it waits for."""
    if bucket is None:
        return []
    numbers = sorted(n for n, p in work.items() if p == bucket)[:MAX_BLOCKERS]
    issues: list[Issue] = await rstore.get_issues(numbers)
    return [Blocker(issue=i.number, url=i.html_url) for i in issues]
