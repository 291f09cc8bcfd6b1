"""Done means green: the CI and mergeability of every PR the broker tracks, and the work they
make (docs/checks.md).

Tracked: the PR of each issue in review (`needs-review`), by its linked number or its branch,
and the PR of each held development task (for overlaps only). Read from webhook deliveries
(`check_run`, `check_suite`, `status`, `workflow_run`, `pull_request`, `push`) when they are
healthy, else by one GraphQL request per repository per pass (`page_size` PRs a request),
with the base branches' tips in the same request; the base branch's required checks come
from a conditional read of the branch every `checks.required_refresh_s`.

What a tracked PR in review gets: a failing check (not failing on the base branch too)
becomes a fix task, a conflict a rebase task, each offered to the PR's author first and
capped at `checks.max_rounds`, then the issue waits for a person; a newer push withdraws a
fix not taken yet; a workflow waiting for approval, and checks pending past
`checks.pending_stale_s`, wait on a person; the review is offered once green
(`checks.review_when_green`). Two open PRs changing the same files are reported.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from github_broker.claim.rules import Rules, task_score
from github_broker.clock import now_ms
from github_broker.errors import BrokerError
from github_broker.gateway import ChecksQuery, GitHubGateway
from github_broker.leader import checks_view as view
from github_broker.models import Issue, TaskType
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store

logger = logging.getLogger(__name__)

#: Waits on a person the checks make, and end once the PR no longer calls for them.
OUR_WAITS = ("checks_failed", "checks_stale", "checks_approval")
#: Rounds kept in a PR's history (shown when the cap is reached).
HISTORY_KEPT = 10
#: Seconds after a push a PR's mergeability is read again with webhooks (GitHub works it out
#: in the background meanwhile, so the read finds it).
MERGEABLE_SETTLE_S = 5.0
#: Delivery events this keeper reads.
EVENTS = frozenset({"check_run", "check_suite", "status", "workflow_run", "pull_request", "push"})


@dataclass
class ChecksReport:
    read: int = 0
    github_calls: int = 0
    fixes: int = 0
    rebases: int = 0
    withdrawn: int = 0
    waits: int = 0
    #: Issues whose review may now be offered (the green gate opened).
    green: list[int] = field(default_factory=list)


class CheckKeeper:
    """One pass per repository in the leader, and the deliveries between passes."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        review_now: Callable[[Repository, list[int]], Awaitable[object]],
    ) -> None:
        self.settings = settings
        self.cfg = settings.checks
        self.store = store
        self.gateway = gateway
        self.rules = Rules(settings)
        #: Offers the review of issues whose PR just turned green (ReviewKeeper.run_issues).
        self.review_now = review_now
        #: (repository, base branch) -> (required checks, when read: monotonic s)
        self._required: dict[tuple[str, str], tuple[list[str], float]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._reading: set[asyncio.Task[None]] = set()

    # --- the pass ---------------------------------------------------------------------

    async def run(self, repo: Repository, *, webhooks_healthy: bool = False) -> ChecksReport:
        """Read what needs reading (everything without webhooks), then act on each PR."""
        report = ChecksReport()
        if not self.cfg.enabled:
            return report
        rstore = self.store.repo(repo.full_name)
        tracked = await self._tracked(rstore)
        records = await rstore.checks_records()
        wanted = {
            n: (self.rules.branch(issue) or "", pr, review)
            for n, (issue, pr, review) in tracked.items()
            if not webhooks_healthy or n not in records or records[n].get("need_read")
        }
        leaving = sorted(set(records) - set(tracked))
        if not webhooks_healthy:
            # Their last read, in the same request: a PR that merged says so on the timeline.
            wanted.update({n: (records[n]["branch"], records[n]["pr"], False) for n in leaving})
        if wanted:
            fresh = await self._read(repo, wanted, records, report)
            records.update(fresh)
        for n in leaving:
            if records[n].get("state") in ("MERGED", "CLOSED"):
                await self._gone(rstore, n, records[n])
        await rstore.drop_checks(leaving)
        await self._act_all(repo, rstore, tracked, records, report)
        return report

    async def _gone(self, rstore: RepoStore, n: int, rec: dict[str, Any]) -> None:
        state = rec["state"].lower()
        await rstore.record_event(
            "merged" if state == "merged" else "pr_closed", n, "", f"PR #{rec['pr']} {state}"
        )

    async def _tracked(self, rstore: RepoStore) -> dict[int, tuple[Issue, int | None, bool]]:
        """Issue -> (issue, linked PR number or None, in review) of every tracked PR."""
        reviewing = await rstore.reviewing()
        states = await rstore.review_states(reviewing)
        held = [
            lease.issue
            for lease in await rstore.leases()
            if lease.task_type == "development" and lease.issue not in reviewing
        ]
        issues = {i.number: i for i in await rstore.get_issues(sorted({*reviewing, *held}))}
        out: dict[int, tuple[Issue, int | None, bool]] = {}
        for n in reviewing:
            if n in issues:
                link = json.loads(states[n][1].get("link") or "{}")
                out[n] = (issues[n], int(link["pr"]) if link.get("pr") else None, True)
        for n in held:
            if n in issues and self.rules.branch(issues[n]):
                out[n] = (issues[n], None, False)
        return out

    async def _read(
        self,
        repo: Repository,
        wanted: dict[int, tuple[str, int | None, bool]],
        records: dict[int, dict[str, Any]],
        report: ChecksReport,
    ) -> dict[int, dict[str, Any]]:
        """The polling read: one GraphQL request per `page_size` PRs; `wanted`: issue ->
        (branch, PR number if known, in review)."""
        numbers = sorted(wanted)
        fresh: dict[int, dict[str, Any]] = {}
        now = now_ms()
        size = self.cfg.page_size
        for start in range(0, len(numbers), size):
            page = numbers[start : start + size]
            query, bases = _page_query(page, wanted, records)
            answer = await asyncio.to_thread(
                self.gateway.pulls_checks, repo.full_name, query, self.cfg.max_annotations
            )
            report.github_calls += 1
            base_failing = {b: view.failing_on(answer.get(f"b{i}")) for i, b in enumerate(bases)}
            for n in page:
                node = _page_node(answer, query, n)
                if node is None:
                    continue
                rec = view.from_graphql(node, self.cfg, records.get(n), now)
                rec["base_failing"] = base_failing.get(rec["base"], [])
                fresh[n] = rec
                report.read += 1
        for n, rec in fresh.items():
            rec["review"] = wanted[n][2]
            rec["required"] = await self._required_checks(repo, rec["base"], report)
        return fresh

    async def _required_checks(
        self, repo: Repository, base: str, report: ChecksReport
    ) -> list[str]:
        key = (repo.full_name, base)
        cached = self._required.get(key)
        if cached is None or time.monotonic() - cached[1] >= self.cfg.required_refresh_s:
            names = await asyncio.to_thread(self.gateway.required_checks, repo.full_name, base)
            report.github_calls += 1
            cached = (names, time.monotonic())
            self._required[key] = cached
        return sorted(set(cached[0]) | set(self.cfg.required))

    async def _act_all(
        self,
        repo: Repository,
        rstore: RepoStore,
        tracked: dict[int, tuple[Issue, int | None, bool]],
        records: dict[int, dict[str, Any]],
        report: ChecksReport,
    ) -> None:
        stored = await rstore.checks_records(sorted(tracked))
        found = view.overlaps({n: r for n, r in records.items() if n in tracked})
        for n, rec in records.items():
            if n not in tracked:
                continue
            rec["overlap"] = found.get(n)
            await self._act(repo, rstore, tracked[n][0], rec, stored.get(n), report)
        if report.green:
            await self.review_now(repo, report.green)

    # --- acting on one PR -------------------------------------------------------------

    async def _act(
        self,
        repo: Repository,
        rstore: RepoStore,
        issue: Issue,
        rec: dict[str, Any],
        before: dict[str, Any] | None,
        report: ChecksReport,
    ) -> None:
        n = issue.number
        verdict = view.judge(rec, self.cfg, now_ms())
        if (
            self.cfg.hold_overlapping
            and verdict.review_ok
            and (rec.get("overlap") or {}).get("ahead")
        ):
            ahead = ", ".join(f"#{pr}" for pr in rec["overlap"]["ahead"])
            verdict.review_ok = False
            verdict.detail += f"; review held until {ahead} merges (it overlaps)"
        rec["verdict"] = {
            "status": verdict.status,
            "detail": verdict.detail,
            "names": verdict.names,
            "review_ok": verdict.review_ok,
        }
        rec["capped"] = (before or {}).get("capped")
        await self._note_overlap(rstore, n, rec, before)
        if rec.get("review"):
            await self._timeline(rstore, n, rec, before)
            await self._review_work(rstore, issue, rec, before, verdict, report)
        await rstore.save_checks(n, rec)

    async def _review_work(
        self,
        rstore: RepoStore,
        issue: Issue,
        rec: dict[str, Any],
        before: dict[str, Any] | None,
        verdict: view.Verdict,
        report: ChecksReport,
    ) -> None:
        n = issue.number
        moved = before is not None and before.get("head") != rec["head"]
        if moved and await rstore.checks_upkeep("withdraw", n, rec["head"]):
            report.withdrawn += 1
        await self._after_person(rstore, n, rec)
        if verdict.status == "approval":
            await self._wait(rstore, n, "checks_approval", verdict.detail, report)
        elif verdict.status == "stale":
            await self._wait(rstore, n, "checks_stale", verdict.detail, report)
        elif verdict.status in ("failed", "conflict"):
            source = "checks" if verdict.status == "failed" else "conflict"
            await self._offer_fix(rstore, issue, rec, source, verdict, report)
        else:
            await rstore.checks_upkeep("unwait", n, "checks_stale,checks_approval")
        if verdict.status == "green":
            # A fix completed before the review: the review is agent work still to come.
            await rstore.checks_upkeep("unwait", n, "checks_failed")
        if verdict.review_ok and not (before or {}).get("verdict", {}).get("review_ok"):
            report.green.append(n)

    async def _after_person(self, rstore: RepoStore, n: int, rec: dict[str, Any]) -> None:
        """The rounds' cap was reached and a person has since ended the wait (a retry):
        the rounds start again."""
        if not rec.get("capped"):
            return
        waiting = await rstore.waiting()
        if n not in waiting or waiting[n].code != "checks_failed":
            await rstore.mark_review_state(n, "ci_rounds", "0")
            rec["capped"] = None

    async def _wait(
        self, rstore: RepoStore, n: int, code: str, detail: str, report: ChecksReport
    ) -> None:
        if await rstore.checks_upkeep("wait", n, code, detail):
            report.waits += 1
            logger.info("%s#%d waits on a person (%s): %s", rstore.repository, n, code, detail)

    async def _offer_fix(
        self,
        rstore: RepoStore,
        issue: Issue,
        rec: dict[str, Any],
        source: str,
        verdict: view.Verdict,
        report: ChecksReport,
    ) -> None:
        n = issue.number
        if await rstore.existing_tasks([f"{TaskType.FIX}:{n}"]):
            return  # a fix is queued or under way: what it pushes decides
        _, state = (await rstore.review_states([n]))[n]
        if f"{source}:{rec['head']}" in json.loads(state.get("handled") or "[]"):
            return  # fixed for this head already: the new push's checks decide
        rounds = int(state.get("ci_rounds") or 0)
        history = json.loads(state.get("ci_history") or "[]")
        if rounds >= self.cfg.max_rounds:
            await self._rounds_used_up(rstore, n, rec, rounds, history, verdict, report)
            return
        if source == "checks":
            await self._annotate(rstore.repository, rec, verdict.names, report)
        payload = view.fix_payload(n, rec, source, verdict.names, rounds + 1, self.cfg)
        if await self._put_fix(rstore, issue, rec, state.get("dev_agent", ""), payload):
            entry = {"round": rounds + 1, "source": source, "head": rec["head"]}
            history = [*history, {**entry, "names": verdict.names}][-HISTORY_KEPT:]
            await self._fix_offered(rstore, n, state, history, verdict, report)

    async def _put_fix(
        self,
        rstore: RepoStore,
        issue: Issue,
        rec: dict[str, Any],
        author: str,
        payload: dict[str, Any],
    ) -> int:
        """The fix or rebase task on the PR's branch, its round counted in `ci_rounds`."""
        return await rstore.put_task(
            f"{TaskType.FIX}:{issue.number}",
            score=task_score(
                self.rules.priority(issue.labels) or 0, TaskType.FIX, issue.created_at
            ),
            role=self.rules.role(issue.labels) or "",
            pr=rec["pr"],
            author=author,
            branch=rec["branch"],
            payload=payload,
            rounds_field="ci_rounds",
        )

    async def _rounds_used_up(
        self,
        rstore: RepoStore,
        n: int,
        rec: dict[str, Any],
        rounds: int,
        history: list[dict[str, Any]],
        verdict: view.Verdict,
        report: ChecksReport,
    ) -> None:
        """Every fix round spent: the PR waits on a person, with the rounds' history."""
        rec["capped"] = rec["head"]
        lines = "; ".join(
            f"round {h['round']} ({h['source']} {h['head'][:7]}: {', '.join(h['names'])})"
            for h in history
        )
        detail = (
            f"{rounds} of {self.cfg.max_rounds} fix rounds used and {verdict.detail}; a "
            f"person must look (a retry starts the rounds again). History: {lines}"
        )
        await self._wait(rstore, n, "checks_failed", detail, report)

    async def _fix_offered(
        self,
        rstore: RepoStore,
        n: int,
        state: dict[str, str],
        history: list[dict[str, Any]],
        verdict: view.Verdict,
        report: ChecksReport,
    ) -> None:
        """A fix or rebase task was put: its round in the history, the timeline and the log."""
        await rstore.mark_review_state(n, "ci_history", json.dumps(history))
        latest = history[-1]
        kind = "rebase" if latest["source"] == "conflict" else "fix"
        what = f"{kind} round {latest['round']} of {self.cfg.max_rounds}: {verdict.detail}"
        await rstore.record_event(f"checks_{kind}", n, state.get("dev_agent", ""), what)
        if kind == "rebase":
            report.rebases += 1
        else:
            report.fixes += 1
        logger.info("%s#%d: %s", rstore.repository, n, what)

    async def _annotate(
        self, full_name: str, rec: dict[str, Any], names: list[str], report: ChecksReport
    ) -> None:
        """Annotations a delivery did not carry: read for the failing checks that have some
        (one request each, at most `max_failing_checks`)."""
        if not self.cfg.max_annotations:
            return
        for name in names[: self.cfg.max_failing_checks]:
            check = rec["checks"].get(name) or {}
            if (
                check.get("annotations")
                or not check.get("annotations_count")
                or not check.get("id")
            ):
                continue
            try:
                raw = await asyncio.to_thread(
                    self.gateway.check_run_annotations,
                    full_name,
                    int(check["id"]),
                    self.cfg.max_annotations,
                )
            except BrokerError as e:
                logger.warning("annotations of %s on %s not read: %s", name, full_name, e)
                continue
            report.github_calls += 1
            check["annotations"] = [
                {
                    "path": str(a.get("path") or ""),
                    "line": a.get("start_line"),
                    "level": str(a.get("annotation_level") or ""),
                    "title": view.clip(a.get("title"), 200),
                    "message": view.clip(a.get("message"), self.cfg.max_text_chars),
                }
                for a in raw
            ]

    async def _timeline(
        self, rstore: RepoStore, n: int, rec: dict[str, Any], before: dict[str, Any] | None
    ) -> None:
        """checks running / failed / green, conflict, merged: once per change."""
        status, detail = rec["verdict"]["status"], rec["verdict"]["detail"]
        was = (before or {}).get("verdict") or {}
        same = was.get("status") == status and (before or {}).get("head") == rec["head"]
        if same or status in ("stale", "approval"):  # those two are waits: their own events
            return
        kind = {"merged": "merged", "closed": "pr_closed", "conflict": "conflict"}.get(
            status, f"checks_{status}"
        )
        head = rec["head"][:7]
        await rstore.record_event(kind, n, "", f"PR #{rec['pr']} at {head}: {detail}")

    async def _note_overlap(
        self, rstore: RepoStore, n: int, rec: dict[str, Any], before: dict[str, Any] | None
    ) -> None:
        """The later of two overlapping PRs: its held task hears of it with its next
        heartbeat (once per overlap)."""
        overlap = rec.get("overlap")
        if not overlap or overlap["first"]:
            return
        subject = ",".join(str(o["pr"]) for o in overlap["with"])
        await rstore.checks_upkeep("note", n, view.overlap_text(n, rec, overlap), subject)

    # --- webhooks ---------------------------------------------------------------------

    async def from_delivery(self, repo: Repository, event: str, payload: dict[str, Any]) -> str:
        """A delivery that may change a tracked PR's checks; acted on at once."""
        if not self.cfg.enabled or event not in EVENTS:
            return "checks: not read"
        rstore = self.store.repo(repo.full_name)
        records = await rstore.checks_records()
        if event == "push":
            return await self._base_moved(repo, rstore, records, payload)
        changed = [n for n, rec in records.items() if self._apply(event, payload, rec)]
        if not changed:
            if not set(await self._tracked(rstore)) - set(records):
                return "checks: no tracked PR"
            # A PR new in review: its first read, now (its review waits for it).
            report = await self.run(repo, webhooks_healthy=True)
            return f"checks: {report.read} PR(s) read"
        tracked = await self._tracked(rstore)
        report = ChecksReport()
        await self._act_all(
            repo, rstore, tracked, {n: r for n, r in records.items() if n in changed}, report
        )
        if any(records[n].get("need_read") for n in changed):
            self._read_soon(repo)
        return f"checks of #{', #'.join(map(str, changed))}: {report.fixes} fix(es)"

    def _apply(self, event: str, payload: dict[str, Any], rec: dict[str, Any]) -> bool:
        now = now_ms()
        if event == "check_run":
            return view.on_check_run(rec, payload["check_run"], self.cfg)
        if event == "status":
            return view.on_status(rec, payload, self.cfg)
        if event == "workflow_run":
            return view.on_workflow_run(rec, payload["workflow_run"])
        if event == "check_suite":
            suite = payload["check_suite"]
            if suite.get("head_sha") != rec.get("head"):
                return False
            rec["need_read"] = True  # which workflow waits is read with the next read
            return bool(suite.get("conclusion") == "action_required")
        pull = payload.get("pull_request") or {}
        return pull.get("number") == rec.get("pr") and view.on_pull(rec, pull, now)

    async def _base_moved(
        self,
        repo: Repository,
        rstore: RepoStore,
        records: dict[int, dict[str, Any]],
        payload: dict[str, Any],
    ) -> str:
        """A push to a tracked PR's base: its mergeability is read again shortly."""
        branch = str(payload.get("ref") or "").removeprefix("refs/heads/")
        hit = [n for n, rec in records.items() if rec.get("base") == branch]
        for n in hit:
            records[n]["need_read"] = True
            await rstore.save_checks(n, records[n])
        if hit:
            self._read_soon(repo)
        return f"checks: base {branch} moved under #{', #'.join(map(str, hit))}" if hit else ""

    def _read_soon(self, repo: Repository) -> None:
        """Read the PRs that need it once GitHub has worked out their mergeability."""
        if repo.full_name in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[repo.full_name] = loop.call_later(MERGEABLE_SETTLE_S, self._fire, repo)

    def _fire(self, repo: Repository) -> None:
        self._timers.pop(repo.full_name, None)
        task = asyncio.get_running_loop().create_task(self._read_now(repo))
        self._reading.add(task)
        task.add_done_callback(self._reading.discard)

    async def _read_now(self, repo: Repository) -> None:
        try:
            await self.run(repo, webhooks_healthy=True)
        except BrokerError as e:
            logger.warning("checks of %s not read: %s", repo.full_name, e)

    def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in self._reading:
            task.cancel()


def _page_query(
    page: list[int],
    wanted: dict[int, tuple[str, int | None, bool]],
    records: dict[int, dict[str, Any]],
) -> tuple[ChecksQuery, list[str]]:
    """One page's GraphQL aliases: a PR by number (`p<issue>`) or by head branch
    (`h<issue>`), and the base branches the page's known PRs target (`b<i>`)."""
    query = ChecksQuery()
    for n in page:
        branch, pr, _ = wanted[n]
        if pr is not None:
            query.numbers[f"p{n}"] = pr
        else:
            query.heads[f"h{n}"] = branch
    bases = sorted({r["base"] for n in page if (r := records.get(n)) and r.get("base")})
    query.bases = {f"b{i}": base for i, base in enumerate(bases)}
    return query, bases


def _page_node(answer: dict[str, Any], query: ChecksQuery, n: int) -> dict[str, Any] | None:
    """Issue `n`'s PR in a page's answer, however it was asked for."""
    if f"h{n}" in query.heads:
        nodes = (answer.get(f"h{n}") or {}).get("nodes") or []
        return nodes[0] if nodes else None
    node: dict[str, Any] | None = answer.get(f"p{n}")
    return node
