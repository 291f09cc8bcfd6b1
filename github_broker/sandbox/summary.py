"""What the sandbox says when its agents have nothing to take: each open issue they cannot
take, and who moves it next — a person (with exactly what to do) or the broker by itself
(with when). Read from the broker's own judgement (`explain`) and indexes, never guessed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from github_broker.claim.rules import Rules
from github_broker.clock import ms_from_iso
from github_broker.models import Issue, SkipReason, Waiting
from github_broker.reports.explain import WAITING, Verdict, explain_repo
from github_broker.reports.status import WaitingReview, waiting_reviews
from github_broker.settings import Settings
from github_broker.store import RepoStore

#: Who moves an issue next: nothing happens until a person acts ...
PERSON = "person"
#: ... or the broker offers it again by itself (a review delay, a grace, a cool-down) ...
BROKER = "broker"
#: ... or the sandbox's simulated maintainer merges its reviewed PR in a moment.
MAINTAINER = "maintainer"
#: explain's verdicts that hold a task back from one agent only, for a while.
AGENT_HOLDS = {"review_author", "cooldown"}
#: explain's verdicts that only a person lifts.
PERSON_HOLDS = {"paused", "repo_paused", "role", "out_of_service"}


@dataclass(frozen=True)
class Left:
    """One open issue the agents cannot take now."""

    issue: int
    title: str
    who: str
    #: What kind of wait (a waiting code, a review step, an explain verdict): what the
    #: sandbox compares to know whether the picture changed.
    code: str
    text: str


@dataclass
class Backlog:
    """What is left of one repository's backlog while no agent has anything to take."""

    repository: str
    left: list[Left] = field(default_factory=list)
    #: Issues the strict bucket holds back behind the ones in `left`.
    held_back: int = 0
    #: (issue, title, reason) of the issues no agent is ever given as they are.
    skipped: list[tuple[int, str, str]] = field(default_factory=list)

    def key(self) -> tuple[tuple[int, str, str], ...]:
        return tuple((x.issue, x.who, x.code) for x in self.left)

    @property
    def people(self) -> list[Left]:
        return [x for x in self.left if x.who == PERSON]

    @property
    def moving(self) -> list[Left]:
        """What moves on without a person: the broker's timers, the simulated maintainer."""
        return [x for x in self.left if x.who != PERSON]


def clock(ms: int) -> str:
    """A time as the event log prints it."""
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def person_todo(w: Waiting, pr: int | None) -> str:
    """Exactly what a person does for an issue that waits on one."""
    if w.code == "awaiting_feedback":
        what = f"PR #{pr}" if pr else "its PR"
        return f"merge {what} (reviewed) — or comment on it to ask for changes"
    detail = w.detail or WAITING.get(w.code, w.code)
    if w.code in ("needs_human", "budget", "held"):
        return f"{detail}: look at it, then retry it"
    return detail


async def backlog_left(
    rstore: RepoStore, settings: Settings, agents: list[str], maintainer: bool = False
) -> Backlog | None:
    """None while a lease is held or one of `agents` (a fresh agent when none is known) could
    claim a task now; else every open issue the agents cannot take, and who moves it next
    (`maintainer`: the simulated one merges reviewed PRs)."""
    if await rstore.leases():
        return None
    # Agents' judgements differ only in their own holds (the review of their own work, their
    # cool-downs): every one is asked, the first one's is read.
    judged: list[tuple[str, list[Verdict]]] = []
    for name in agents or [""]:
        found = await explain_repo(rstore, settings, None, name or None)
        if any(v.verdict == "next" for v in found):
            return None
        judged.append((name, found))
    agent, verdicts = judged[0]
    reader = _Reader(
        rstore,
        settings,
        maintainer,
        issues={i.number: i for i in await rstore.get_issues([v.issue for v in verdicts])},
        reviews=await waiting_reviews(rstore, settings, {}, []),
        waiting=await rstore.waiting(),
        skips=await rstore.skipped(),
    )
    backlog = Backlog(rstore.repository)
    for v in verdicts:
        await reader.add(backlog, v, agent)
    return backlog


@dataclass
class _Reader:
    """Turns one agent's verdicts into a Backlog."""

    rstore: RepoStore
    settings: Settings
    maintainer: bool
    issues: dict[int, Issue]
    reviews: dict[int, WaitingReview]
    waiting: dict[int, Waiting]
    skips: dict[int, SkipReason]

    def title(self, n: int) -> str:
        issue = self.issues.get(n)
        return issue.title if issue else "(not mirrored)"

    async def add(self, backlog: Backlog, v: Verdict, agent: str) -> None:
        n, title = v.issue, self.title(v.issue)
        if v.verdict == "outside_bucket":
            backlog.held_back += 1
        elif v.verdict == "skipped":
            reason = self.skips[n].reason if n in self.skips else v.detail
            backlog.skipped.append((n, title, reason))
        elif v.verdict == "waiting_on_person" and n in self.waiting:
            backlog.left.append(self._person(n, title, self.waiting[n]))
        elif v.verdict in AGENT_HOLDS:
            backlog.left.append(Left(n, title, BROKER, v.verdict, f"for {agent}: {v.detail}"))
        elif v.verdict in PERSON_HOLDS:
            backlog.left.append(Left(n, title, PERSON, v.verdict, v.detail))
        elif v.verdict == "waiting":
            code, text = await self._in_review(n, v)
            backlog.left.append(Left(n, title, BROKER, code, text))
        elif v.verdict == "blocked":
            # An open blocker closes once its PR is merged (by the simulated maintainer, or a
            # person); a blocker not planned, unreadable or on a cycle waits for a person to
            # change the links.
            opened = v.detail.endswith("(open)")
            who = MAINTAINER if opened and self.maintainer else PERSON
            text = f"starts when its blocker closes: {v.detail}" if opened else v.detail
            backlog.left.append(Left(n, title, who, "blocked", text))

    def _person(self, n: int, title: str, w: Waiting) -> Left:
        review = self.reviews.get(n)
        pr = review.pr if review else None
        if self.maintainer and w.code == "awaiting_feedback" and pr:
            text = f"reviewed: the sandbox's maintainer merges PR #{pr} in a moment"
            return Left(n, title, MAINTAINER, w.code, text)
        return Left(n, title, PERSON, w.code, person_todo(w, pr))

    async def _in_review(self, n: int, v: Verdict) -> tuple[str, str]:
        review = self.reviews.get(n)
        if review is None:  # just completed or released, its labels not yet synced
            return "no_task", v.detail
        if review.step == "waiting_delay" and review.due_at:
            due = clock(ms_from_iso(review.due_at))
            return review.step, f"in review: offered to an agent at {due}"
        if review.step == "no_linked_pr":
            return review.step, await self._no_pr(n)
        if review.step == "awaiting_feedback":
            return review.step, "new feedback on its PR settles: a fix round follows"
        return review.step, review.detail

    async def _no_pr(self, n: int) -> str:
        detected, _ = (await self.rstore.review_states([n]))[n]
        issue = self.issues.get(n)
        branch = Rules(self.settings).branch(issue) if issue else None
        grace_ms = int(self.settings.progress.no_pr_grace_s * 1000)
        when = f" at {clock(ms_from_iso(detected) + grace_ms)}" if detected else ""
        return (
            f"completed without a PR: back in the pool{when} (progress.no_pr_grace_s) "
            f"unless a PR from {branch or 'its branch'} opens"
        )


def moving_line(backlog: Backlog) -> str:
    """One line for a backlog the agents can take nothing from until it moves by itself."""
    items = "; ".join(f"#{x.issue} {x.text}" for x in backlog.moving)
    people = backlog.people
    wait = f"; {len(people)} wait on a person" if people else ""
    behind = f"; {backlog.held_back} more behind the strict bucket" if backlog.held_back else ""
    moves = f"it moves on by itself: {items}{behind}{wait}"
    return f"{backlog.repository}: nothing to hand out now; {moves}"


def summary_lines(backlog: Backlog, done: dict[int, str], hints: list[str]) -> list[str]:
    """The whole picture once only people can move the backlog on (or nothing is left): done,
    what waits on a person and exactly what to do, skipped."""
    name, people = backlog.repository, backlog.people
    behind = f"; {backlog.held_back} more behind the strict bucket" if backlog.held_back else ""
    if people:
        head = f"backlog of {name}: nothing left for the agents; {len(people)} wait on a person"
    else:
        head = f"backlog of {name} done: nothing left for the agents"
    out = [head + behind]
    if done:
        items = ", ".join(f"#{n} by {agent}" for n, agent in sorted(done.items()))
        out.append(f"  done ({len(done)}): {items}")
    if people:
        out.append(f"  waiting on a person ({len(people)}):")
        out += [f"    #{x.issue} {x.title}: {x.text}" for x in people]
    out.append(f"  skipped ({len(backlog.skipped)}):")
    out += [f"    #{n} {title}: {reason}" for n, title, reason in backlog.skipped]
    return out + (hints if people else [])
