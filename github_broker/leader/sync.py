"""The sync pass: make Redis mirror the open issues of a repository, touching nothing else."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from github_broker.claim.rules import Rules, task_score
from github_broker.clock import iso_from_ms, now_ms
from github_broker.errors import GitHubError
from github_broker.gateway import GitHubGateway, Page
from github_broker.leader.graph import GraphKeeper
from github_broker.leader.reviews import linked_pulls
from github_broker.logs import log_fields
from github_broker.models import Issue, TaskType
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store, UpsertResult

logger = logging.getLogger(__name__)

#: Issues written per Lua call; keeps each script short so claims never wait long behind it.
UPSERT_BATCH = 200
#: Safety stop for a runaway listing (100 per page: one million issues).
MAX_PAGES = 10_000
#: How far before a full pass's start its first incremental cursor is set (clock skew).
CURSOR_MARGIN_MS = 60_000

#: The full pass's listing: every open issue, oldest first, so pages keep their content.
FULL_PARAMS = {"state": "open", "sort": "created", "direction": "asc"}

Progress = Callable[[str, int, int], None]


#: Seconds beyond one heartbeat interval that the post-loss hold-back lasts.
HOLD_BACK_MARGIN_S = 5


@dataclass
class SyncReport:
    repository: str
    full: bool
    pages: int = 0
    not_modified: int = 0
    #: Pages of a full pass read again because an issue on them lost its cache entry.
    refetched: int = 0
    seen: int = 0
    written: int = 0
    removed: int = 0
    readied: int = 0
    revoked: int = 0
    adopted: int = 0
    restored: int = 0
    #: A rebuild after Redis lost its data holds new hand-outs back this long (s).
    held_back_s: float = 0.0
    #: Claimable issues a rebuild after a loss found an open PR for: completed, in review.
    recovered: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        kind = "full" if self.full else "incremental"
        return (
            f"{self.repository}: {kind} pass, {self.pages} page(s) "
            f"({self.not_modified} unchanged, {self.refetched} re-read), "
            f"{self.seen} issue(s) seen, {self.written} written, {self.removed} removed, "
            f"{self.readied} newly claimable, {self.revoked} lease(s) revoked, "
            f"{self.adopted} re-adopted, {self.restored} label(s) restored, "
            f"{self.seconds:.2f}s"
        )


@dataclass(frozen=True)
class _FullPass:
    """What a full pass read, for saving at its end."""

    #: Marks the pass in Redis (`full_started`): a mirror lost meanwhile is not claimed rebuilt.
    pass_id: str
    #: The first incremental cursor is never later than this.
    started_iso: str
    last_page: int
    #: The newest `updated_at` the pass read, or the cursor it started with if later.
    newest: str
    #: The changed pages' ETags and issue numbers.
    saved: dict[str, str]


class Syncer:
    """Runs sync passes; GitHub calls go to a worker thread, Redis calls stay async."""

    def __init__(self, settings: Settings, store: Store, gateway: GitHubGateway) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.rules = Rules(settings)
        #: The leader epoch every write carries (0: unfenced, a one-off CLI sync); the daemon
        #: sets it whenever it takes or renews leadership.
        self.epoch = 0
        #: Repositories whose mirror this process saw complete: one found missing later was
        #: lost (Redis lost its data), not built for the first time.
        self.seen_complete: set[str] = set()
        #: GitHub's dependencies and sub-issues (leader/graph.py).
        self.graph = GraphKeeper(settings, store, gateway, self, lambda: self.epoch)

    async def base_branch(self, repo: Repository, rstore: RepoStore, state: dict[str, str]) -> str:
        if repo.base_branch:
            return repo.base_branch
        if "default_branch" in state:
            return state["default_branch"]
        info = await asyncio.to_thread(self.gateway.repository, repo.full_name)
        branch = str(info.get("default_branch") or "main")
        await rstore.save_sync_state({"default_branch": branch}, epoch=self.epoch)
        return branch

    async def sync(
        self, repo: Repository, *, full: bool | None = None, progress: Progress | None = None
    ) -> SyncReport:
        """One pass. `full=None` picks a full pass when one is due."""
        started = time.monotonic()
        rstore = self.store.repo(repo.full_name)
        state = await rstore.sync_state()
        base = await self.base_branch(repo, rstore, state)
        if full is None:
            last_full = float(state.get("full_at", 0))
            full = (
                not await rstore.mirror_rebuilt()
                or "since" not in state
                or time.time() - last_full >= self.settings.poll.full_sync_interval_s
            )
        report = SyncReport(repository=repo.full_name, full=full)
        if full:
            self.graph.begin_pass(rstore, rebuilt=await rstore.mirror_rebuilt())
            try:
                await self._full(repo, rstore, state, base, report, progress)
            finally:
                self.graph.abandon_pass(rstore)
        else:
            await self._incremental(repo, rstore, state, base, report)
        report.seconds = time.monotonic() - started
        changed = (
            report.written or report.removed or report.revoked or report.adopted or report.restored
        )
        logger.log(
            logging.INFO if changed else logging.DEBUG,
            "sync %s",
            report.summary(),
            extra=log_fields(repo.full_name),
        )
        return report

    # --- passes -------------------------------------------------------------------------

    async def _full(
        self,
        repo: Repository,
        rstore: RepoStore,
        state: dict[str, str],
        base: str,
        report: SyncReport,
        progress: Progress | None,
    ) -> None:
        # Issues may change on pages already read while the pass goes on: the first cursor
        # starts before the pass did (with a margin for clock skew), never after.
        started_iso = iso_from_ms(now_ms() - CURSOR_MARGIN_MS)
        # Marks this pass: if Redis loses its data meanwhile, the mark goes with it and the
        # pass does not claim a rebuilt mirror at its end.
        pass_id = f"{now_ms()}-{id(report)}"
        await rstore.save_sync_state({"full_started": pass_id}, epoch=self.epoch)
        per_page = self.settings.github.per_page
        seen: set[int] = set()
        newest = state.get("since", "")
        known = await rstore.sync_pages()
        saved: dict[str, str] = {}
        page_no = 1
        while page_no <= MAX_PAGES:
            numbers, count, page_newest = await self._full_page(
                repo, rstore, page_no, known, saved, base, report
            )
            seen.update(numbers)
            newest = max(newest, page_newest)
            # A full last page is followed by one more (empty) request: its ETag makes the
            # next unchanged pass all-304, and it notices issues added past the old end.
            more = count == per_page
            report.seen = len(seen)
            if progress:
                progress(repo.full_name, page_no, len(seen))
            if not more:
                break
            page_no += 1
        await self._remove_confirmed(repo, rstore, await rstore.open_numbers() - seen, base, report)
        # The links of every issue that has any, read in bulk before the mirror counts as
        # rebuilt (no claim runs before that on a first pass).
        await self.graph.end_pass(rstore, seen)
        pages = _FullPass(pass_id, started_iso, page_no, newest, saved)
        await self._end_full(repo, rstore, state, base, report, pages)

    async def _full_page(
        self,
        repo: Repository,
        rstore: RepoStore,
        page_no: int,
        known: dict[str, str],
        saved: dict[str, str],
        base: str,
        report: SyncReport,
    ) -> tuple[list[int], int, str]:
        """One page of the full pass, mirrored: (its issue numbers, its item count, the
        newest `updated_at` read, "" when GitHub answered 304). A changed page's ETag and
        numbers go to `saved`."""
        etag = known.get(f"page:{page_no}:etag")
        page = await asyncio.to_thread(
            self.gateway.issues_page, repo.full_name, FULL_PARAMS, page=page_no, etag=etag
        )
        report.pages += 1
        if page.status == 304:
            numbers, count = json.loads(known.get(f"page:{page_no}:numbers", "[[], 0]"))
            cached = await self._cached_page(rstore, numbers)
            if cached is not None:
                report.not_modified += 1
                # GitHub says nothing changed, yet keys derived from these issues may have
                # been lost alone (eviction, a DEL, a failover): index them again from the
                # cache, with no GitHub call.
                await self._upsert(rstore, cached, base, report)
                return numbers, count, ""
            # An issue of this unchanged page lost its cache entry: read the page again in
            # full (one counted call), as if its ETag were gone.
            report.refetched += 1
            page = await asyncio.to_thread(
                self.gateway.issues_page, repo.full_name, FULL_PARAMS, page=page_no, etag=None
            )
        issues = [Issue.from_github(d) for d in page.items if "pull_request" not in d]
        numbers, count = [i.number for i in issues], len(page.items)
        await self._upsert(rstore, issues, base, report)
        saved[f"page:{page_no}:etag"] = page.etag or ""
        saved[f"page:{page_no}:numbers"] = json.dumps([numbers, count])
        return numbers, count, max((i.updated_at for i in issues), default="")

    async def _end_full(
        self,
        repo: Repository,
        rstore: RepoStore,
        state: dict[str, str],
        base: str,
        report: SyncReport,
        pages: _FullPass,
    ) -> None:
        """Save the pass: its pages, the first cursor, and the mark of a rebuilt mirror."""
        known_pages = int(state.get("full_pages", 0))
        stale = [
            f"page:{i}:{f}"
            for i in range(pages.last_page + 1, known_pages + 1)
            for f in ("etag", "numbers")
        ]
        cursors = {"full_pages": str(pages.last_page), "full_at": str(time.time())}
        if not state.get("since") and pages.newest:
            # Only the first pass sets the cursor; later ones must not move it past changes
            # on pages they read early (the incremental passes catch those).
            cursors["since"] = min(pages.newest, pages.started_iso)
        # Every open issue is mirrored now: leases unknown to Redis are re-adopted or gone.
        had_mirror = await rstore.mirror_rebuilt()
        held_ms = await rstore.save_sync_state(
            cursors,
            pages=pages.saved,
            drop_pages=stale,
            rebuilt=pages.pass_id,
            epoch=self.epoch,
            hold_back_ms=self._hold_back_ms(rstore),
            was_complete=repo.full_name in self.seen_complete,
        )
        report.held_back_s = held_ms / 1000
        if await rstore.mirror_rebuilt():
            lost = held_ms > 0 or repo.full_name in self.seen_complete
            self.seen_complete.add(repo.full_name)
            if lost and not had_mirror:
                report.recovered = await self._recover_linked(repo, rstore)
        if not state.get("since") and pages.newest:
            # Record the incremental cursor's ETag now, so the next pass can be a 304.
            await self._incremental(repo, rstore, {**state, **cursors}, base, report)

    async def _recover_linked(self, repo: Repository, rstore: RepoStore) -> int:
        """Right after a rebuild after a loss (inside the hold-back): a development task that
        looks claimable but has an open PR from its branch (or one that closes it) was done
        by an agent whose claim and completion never reached GitHub's labels (a write outage
        lost with Redis). It goes to review instead of to a second agent. One listing."""
        tasks = await rstore.task_index()
        pulls = await asyncio.to_thread(self.gateway.open_pulls, repo.full_name)
        by_head, by_issue = linked_pulls(pulls)
        recovered = 0
        for task_id, (_, _, branch) in tasks.items():
            kind, _, number = task_id.partition(":")
            pull = by_head.get(branch) or by_issue.get(int(number))
            if kind != "development" or pull is None:
                continue
            done = await rstore.control(
                "recovered", "broker", number, f"PR #{pull['number']}", "", "1", "linked"
            )
            if done.outcome.startswith("completed"):
                recovered += 1
                logger.warning("%s#%s: %s", repo.full_name, number, done.outcome)
        return recovered

    def _hold_back_ms(self, rstore: RepoStore) -> int:
        """After Redis lost its data, leases that no label recorded are known only once their
        agents heartbeat with their signed tokens: for one heartbeat interval (plus a margin)
        the rebuilt repository hands nothing new out. Unsigned tokens prove nothing: none."""
        if not rstore.signer.enabled:
            return 0
        return (max(1, self.settings.leases.lease_ttl_s // 3) + HOLD_BACK_MARGIN_S) * 1000

    @staticmethod
    async def _cached_page(rstore: RepoStore, numbers: list[int]) -> list[Issue] | None:
        """The cached issues of a page GitHub answered 304, or None when any is missing."""
        by_number = await rstore.cached_issues(numbers)
        issues = [i for i in by_number.values() if i is not None]
        return issues if len(issues) == len(numbers) else None

    async def _incremental(
        self,
        repo: Repository,
        rstore: RepoStore,
        state: dict[str, str],
        base: str,
        report: SyncReport,
    ) -> None:
        """Everything updated since the cursor, oldest first, paged by cursor, not by offset:
        an issue updated while we read moves past the cursor and comes in a later request,
        instead of shifting a page we have not read yet. The last request, at the final
        cursor, is the one whose ETag lets the next pass of an unchanged repository be a 304.
        """
        since = state.get("since", "")
        etag = state.get("inc_etag") if state.get("inc_since") == since else None
        per_page = self.settings.github.per_page
        cursor, page_no = since, 1
        for _ in range(MAX_PAGES):
            params = {"state": "all", "sort": "updated", "direction": "asc", "since": cursor}
            page: Page = await asyncio.to_thread(
                self.gateway.issues_page,
                repo.full_name,
                params,
                page=page_no,
                etag=etag if (cursor, page_no) == (since, 1) else None,
            )
            report.pages += 1
            if page.status == 304:
                report.not_modified += 1
                return
            await self._apply_changes(rstore, page.items, base, report)
            last = str(page.items[-1]["updated_at"]) if page.items else cursor
            if len(page.items) == per_page and last == cursor:
                page_no += 1  # a whole page shares one second: only an offset moves on
            elif len(page.items) == per_page or last != cursor:
                cursor, page_no = max(cursor, last), 1
            else:
                break
        if page_no == 1:
            await rstore.save_sync_state(
                {"since": cursor, "inc_since": cursor, "inc_etag": page.etag or ""},
                epoch=self.epoch,
            )
        else:
            await rstore.save_sync_state({"since": cursor}, epoch=self.epoch)

    async def _apply_changes(
        self, rstore: RepoStore, items: list[dict[str, Any]], base: str, report: SyncReport
    ) -> None:
        issues = [d for d in items if "pull_request" not in d]
        report.seen += len(issues)
        await self._upsert(
            rstore, [Issue.from_github(d) for d in issues if d.get("state") == "open"], base, report
        )
        await self._remove(
            rstore, [int(d["number"]) for d in issues if d.get("state") != "open"], report
        )
        await self.graph.note_states(rstore, issues)

    async def _remove_confirmed(
        self,
        repo: Repository,
        rstore: RepoStore,
        missing: set[int],
        base: str,
        report: SyncReport,
    ) -> None:
        """Offset pages shift when an issue closes mid-pass, so an issue missing from the
        listing may still be open: ask GitHub about each one before removing it."""
        gone, closed, deleted = [], [], []
        for n in sorted(missing):
            data = await asyncio.to_thread(self.gateway.issue, repo.full_name, n)
            if data is None or data.get("state") != "open" or "pull_request" in data:
                gone.append(n)
                if data is None:
                    deleted.append(n)
                else:
                    closed.append(data)
            else:
                await self._upsert(rstore, [Issue.from_github(data)], base, report)
        await self._remove(rstore, gone, report)
        await self.graph.note_states(rstore, closed)
        await self.graph.note_gone(rstore, deleted)

    # --- writes -------------------------------------------------------------------------

    async def _upsert(
        self,
        rstore: RepoStore,
        issues: list[Issue],
        base: str,
        report: SyncReport,
        *,
        read_links: bool = True,
    ) -> None:
        """`read_links`: read the links GitHub's summaries announce that the mirror lacks
        (leader/graph.py); off when the graph itself indexes issues again."""
        for start in range(0, len(issues), UPSERT_BATCH):
            chunk = issues[start : start + UPSERT_BATCH]
            if read_links:
                await self.graph.before_upsert(rstore, chunk)
            orders = await self.graph.orders(rstore, chunk)
            batch = [index_item(self.rules, i, base, orders.get(i.number)) for i in chunk]
            result = await rstore.sync_issues(batch, epoch=self.epoch)
            self._count(report, result)
            await self._point_holders(rstore, result.holders)
            by_number = {item["n"]: item for item in batch}
            settled = []
            for n, missing in result.suspects.items():
                actor = await self._who_removed(rstore.repository, n, missing)
                if actor is not None:
                    settled.append({**by_number[n], "removed_by": actor})
            if settled:
                again = await rstore.sync_issues(settled, epoch=self.epoch)
                self._count(report, again)
                await self._point_holders(rstore, again.holders)

    async def apply_issues(self, rstore: RepoStore, issues: list[Issue], base: str) -> SyncReport:
        """Mirror these issues as a sync pass would (the webhook worker's targeted update)."""
        report = SyncReport(repository=rstore.repository, full=False)
        await self._upsert(rstore, issues, base, report)
        return report

    async def mirror(
        self, rstore: RepoStore, issues: list[Issue], *, read_links: bool = True
    ) -> None:
        """Mirror these issues as a pass would (the graph's and deliveries' updates)."""
        repo = self.settings.repository(rstore.repository)
        assert repo is not None
        base = await self.base_branch(repo, rstore, await rstore.sync_state())
        report = SyncReport(repository=rstore.repository, full=False)
        await self._upsert(rstore, issues, base, report, read_links=read_links)

    async def reindex(self, rstore: RepoStore, issue: Issue) -> None:
        """Index one issue again as `issue` reads (its cache with the broker's queued label
        writes applied): a maintainer's retry, a development task completed with no PR."""
        repo = self.settings.repository(rstore.repository)
        assert repo is not None
        base = await self.base_branch(repo, rstore, await rstore.sync_state())
        await self.apply_issues(rstore, [issue], base)

    async def _point_holders(self, rstore: RepoStore, holders: list[str]) -> None:
        """With several repositories, an agent whose lease was adopted here may hold its task
        here: its next request must settle it here (`agent_repos`, see claim/walk.py)."""
        if len(self.store.repos) < 2:
            return
        keep_ms = self.settings.leases.agent_task_ttl_s * 1000
        for agent in dict.fromkeys(holders):
            await self.store.note_agent_repos(agent, [rstore.repository], keep_ms)

    @staticmethod
    def _count(report: SyncReport, result: UpsertResult) -> None:
        report.written += result.written
        report.readied += result.readied
        report.revoked += result.revoked
        report.adopted += result.adopted
        report.restored += result.restored

    async def _who_removed(self, full_name: str, number: int, missing: list[str]) -> str | None:
        """'broker' when the broker's own login removed every missing label last (a late write
        of a deposed leader), 'person' when anyone else removed one, None when GitHub shows no
        such event yet (asked again on the next pass)."""
        try:
            events = await asyncio.to_thread(self.gateway.label_events, full_name, number)
            me = await asyncio.to_thread(self.gateway.login)
        except GitHubError as e:
            logger.warning("%s#%d: who removed %s unknown: %s", full_name, number, missing, e)
            return None
        verdict = "broker"
        for label in missing:
            last = next(
                (
                    e
                    for e in reversed(events)
                    if e.get("event") == "unlabeled"
                    and str((e.get("label") or {}).get("name", "")).lower() == label.lower()
                ),
                None,
            )
            if last is None:
                return None
            login = str((last.get("actor") or {}).get("login", ""))
            # A GitHub App acts as "<slug>[bot]"; its login() is "" (no /user for Apps).
            ours = login == me if me else login.endswith("[bot]")
            if not ours:
                verdict = "person"
        logger.info("%s#%d: %s removed by the %s", full_name, number, missing, verdict)
        return verdict

    async def _remove(self, rstore: RepoStore, numbers: list[int], report: SyncReport) -> None:
        for start in range(0, len(numbers), UPSERT_BATCH):
            removed, revoked = await rstore.remove_issues(
                numbers[start : start + UPSERT_BATCH], epoch=self.epoch
            )
            report.removed += removed
            report.revoked += revoked


def index_item(
    rules: Rules, issue: Issue, base: str, order_s: int | None = None
) -> dict[str, Any]:
    """The sync_upsert.lua entry for one issue: its JSON and what the rules conclude.
    `order_s`: a sub-issue's order time in its parent's order (leader/graph.py)."""
    analysis = rules.analyse(issue, base)
    assignable = analysis.assignable
    orphan, stray = rules.orphan(issue.labels)
    score = task_score(
        analysis.priority or 0,
        TaskType.DEVELOPMENT,
        issue.created_at,
        unblocks=issue.blocking if rules.graph_order else None,
        order_s=order_s if rules.graph_order else None,
    )
    return {
        "n": issue.number,
        "issue": issue.cache_json(),
        "prio": analysis.priority if analysis.priority is not None else -1,
        "task": f"{TaskType.DEVELOPMENT}:{issue.number}" if assignable else "",
        "score": score if assignable else 0,
        "role": analysis.role or "",
        "branch": analysis.branch or "",
        "skip": analysis.skip.model_dump_json() if analysis.skip else "",
        "holder": rules.holder(issue.labels) or "",
        "pin": rules.pins_bucket(issue, analysis),
        # Labels that may be agent ids (sync_upsert.lua removes those of past holders).
        "others": [
            lab
            for lab in issue.labels
            if lab not in rules.known_labels
            and lab not in rules.roles
            and not rules.priority_re.match(lab)
        ],
        "removed_by": "",
        # In-progress with no live lease: why it waits, and an unconfigured agent's label.
        "orphan": orphan,
        "stray": stray,
    }
