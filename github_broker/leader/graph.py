"""The dependency graph, the leader's side: GitHub's links read (in bulk, gateway/planning.py),
each blocker's state kept in every served repository that depends on it, and what a change
blocks or frees indexed again at once (docs/dependencies.md).

Freshness: a blocker of the dependent's own repository is judged by the claim from the mirror
itself (`open`), which its sync and its webhooks move in the same script. A blocker of another
served repository is mirrored into the dependent's repository (`graph:state`) right after its
own repository's sync or webhook applied it: one more Redis call, milliseconds. A blocker of
a repository the broker does not serve blocks (`dependencies.unserved: block`) or keeps the
state GitHub reported when the links were last read (`last_read`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from github_broker.clock import ms_from_iso
from github_broker.errors import GitHubError
from github_broker.gateway import GitHubGateway, IssueLinks
from github_broker.gateway.planning import state_of
from github_broker.models import Issue
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store
from github_broker.store.graph import HIDDEN, UNREAD, GraphUpdate, Verdict

logger = logging.getLogger(__name__)

#: Events whose deliveries change links (webhooks/payloads.py accepts them).
GRAPH_EVENTS = frozenset({"issue_dependencies", "sub_issues"})


class Mirror(Protocol):
    """What the graph asks of the sync (leader/sync.py `Syncer`)."""

    async def mirror(
        self, rstore: RepoStore, issues: list[Issue], *, read_links: bool = True
    ) -> None: ...


@dataclass
class _Pass:
    """What a running full pass of one repository leaves for its end."""

    #: The mirror was rebuilt before the pass began: claims run meanwhile.
    rebuilt: bool
    #: Issues whose summaries say they have blockers / sub-issues.
    linked: set[int] = field(default_factory=set)
    parents: set[int] = field(default_factory=set)
    #: Of `linked`, those not to read at the end: read during the pass already, or with no
    #: summary to tell (their saved links stand).
    settled: set[int] = field(default_factory=set)


def rest_state(data: dict[str, Any]) -> str:
    """An issue object's state as a blocker (REST: `state`, `state_reason`)."""
    reason = str(data.get("state_reason") or "").upper()
    return state_of({"state": data.get("state"), "stateReason": reason or None})


def stale(issue: Issue, refs: list[str] | None) -> bool:
    """Whether the links saved for `issue` may not be GitHub's: its summary counts another
    number of blockers, or their last read failed."""
    if issue.blocked_by_total < 0:
        return False  # no summary: what was read stands
    if refs is None:
        return issue.blocked_by_total > 0
    return UNREAD in refs or len(refs) != issue.blocked_by_total


class GraphKeeper:
    """Reads and keeps the graph for every served repository (the leader's sync and webhook
    worker call it); `epoch` is the leader epoch its writes carry."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        mirror: Mirror,
        epoch: Callable[[], int],
    ) -> None:
        deps = settings.dependencies
        self.enabled = deps.enabled
        self.batch = deps.batch
        self.unserved = deps.unserved
        self.store = store
        self.gateway = gateway
        self.mirror = mirror
        self.epoch = epoch
        self.served = {r.full_name.lower(): r.full_name for r in settings.repositories}
        #: Issues whose links a running full pass reads at its end, per repository.
        self._pending: dict[str, _Pass] = {}
        self._cycles: dict[str, dict[int, list[str]]] = {}
        #: Repositories this process recorded in `{prefix}:graph:repos`.
        self._noted: set[str] = set()

    # --- a sync pass --------------------------------------------------------------------

    def begin_pass(self, rstore: RepoStore, *, rebuilt: bool) -> None:
        """A full pass starts: links are read in bulk at its end (`end_pass`); before the
        mirror is rebuilt no claim can run meanwhile, after it new ones are read at once."""
        if self.enabled:
            self._pending[rstore.repository] = _Pass(rebuilt)

    def abandon_pass(self, rstore: RepoStore) -> None:
        self._pending.pop(rstore.repository, None)

    async def end_pass(self, rstore: RepoStore, seen: set[int]) -> None:
        """The full pass read every open issue: read the links of those that have any (the
        summaries said so) and forget the links of those that have none any more."""
        pending = self._pending.pop(rstore.repository, None)
        if pending is None:
            return
        stored = await rstore.links()
        unlinked: dict[int, list[str]] = {
            n: [] for n in stored if n in seen and n not in pending.linked
        }
        if unlinked:
            await self._save(rstore, GraphUpdate(links=unlinked))
        await self.read(
            rstore, sorted(pending.linked - pending.settled), sorted(pending.parents),
            fail_closed=False,
        )

    async def before_upsert(self, rstore: RepoStore, issues: list[Issue]) -> None:
        """Links of these issues the mirror does not know yet (their summaries count another
        number of blockers than it saved) are read and saved before they are indexed, so a new
        dependent is never claimable for a moment; a full pass defers the rest to its end."""
        if not self.enabled or not issues:
            return
        linked = {i.number for i in issues if i.blocked_by_total > 0}
        parents = [i.number for i in issues if i.sub_issues > 0]
        stored = await rstore.links([i.number for i in issues])
        now = [i.number for i in issues if stale(i, stored.get(i.number))]
        pending = self._pending.get(rstore.repository)
        if pending is not None:
            unknown = {i.number for i in issues if i.blocked_by_total < 0}
            pending.linked |= linked | unknown
            pending.settled |= unknown
            pending.parents.update(parents)
            if not pending.rebuilt:
                return  # no claim runs before the pass ends: one bulk read then
            pending.settled.update(now)
            parents = []
        known = {i.number for i in issues if i.blocked_by_total >= 0}
        gone = [n for n, refs in stored.items() if refs and n in known and n not in linked]
        if gone:
            await self._save(rstore, GraphUpdate(links={n: [] for n in gone}))
        await self.read(rstore, now, parents, fail_closed=True)

    async def orders(self, rstore: RepoStore, issues: list[Issue]) -> dict[int, int]:
        """The order time of each sub-issue here whose parent's order is known: the parent's
        creation second plus its place among its siblings (see rules.task_score)."""
        if not self.enabled:
            return {}
        children = {i.number: i.parent for i in issues if i.parent}
        out = {}
        for n, place in (await rstore.orders(list(children))).items():
            if str(place.get("parent", "")).lower() == str(children[n]).lower():
                out[n] = int(place["base_s"]) + int(place["pos"])
        return out

    # --- reading links ------------------------------------------------------------------

    async def read(
        self, rstore: RepoStore, blockers: list[int], parents: list[int], *, fail_closed: bool
    ) -> None:
        """Read and save the blockers of `blockers` and the sub-issues of `parents`, a batch
        per GraphQL request. A failed read leaves the links saved before (a refresh) or
        blocks the issues (`fail_closed`: their links were not known)."""
        wanted = sorted(set(blockers) | set(parents))
        asked, as_parent = set(blockers), set(parents)
        changed_links = False
        for start in range(0, len(wanted), self.batch):
            chunk = wanted[start : start + self.batch]
            ask = [n for n in chunk if n in asked]
            try:
                got = await asyncio.to_thread(
                    self.gateway.issue_links,
                    rstore.repository,
                    ask,
                    [n for n in chunk if n in as_parent],
                )
            except GitHubError as e:
                logger.warning("%s: links of %s not read: %s", rstore.repository, chunk, e)
                if fail_closed and ask:
                    await self._save(rstore, GraphUpdate(links={n: [UNREAD] for n in ask}))
                continue
            changed_links |= await self._apply_read(rstore, got)
        if changed_links:
            await self.find_cycles()

    async def _apply_read(self, rstore: RepoStore, got: dict[int, IssueLinks | None]) -> bool:
        update = GraphUpdate()
        orders: dict[str, dict[int, dict[str, Any]]] = {}
        for n, links in got.items():
            if links is None:
                update.gone.append(n)
                continue
            if links.blockers is not None:
                update.links[n] = [b.ref for b in links.blockers] + [HIDDEN] * links.hidden
                for b in links.blockers:
                    update.states[b.ref] = await self._initial_state(rstore, b.ref, b.state)
            if links.subs is not None:
                self._place(rstore.repository, links, orders)
        await self._save(rstore, update)
        for name, places in orders.items():
            await self._save_order(self.store.repo(name), places)
        return bool(update.links or update.gone)

    async def _initial_state(self, rstore: RepoStore, ref: str, read: str) -> str:
        """A blocker's state when its link is saved: its own repository's mirror decides for
        a served one (GitHub's answer may already be older), GitHub's answer else."""
        repo, _, number = ref.rpartition("#")
        served = self.served.get(repo.lower())
        if served is None:
            return "unserved" if self.unserved == "block" else read
        if served == rstore.repository or read != "open":
            return read
        still = await self.store.repo(served).open_numbers_of([int(number)])
        return "open" if still else read

    def _place(
        self, repository: str, links: IssueLinks, orders: dict[str, dict[int, dict[str, Any]]]
    ) -> None:
        """Each sub-issue of a served repository gets its place in this parent's order."""
        base_s = ms_from_iso(links.created_at) // 1000 if links.created_at else 0
        parent = f"{repository}#{links.number}"
        for pos, ref in enumerate(links.subs or []):
            repo, _, number = ref.rpartition("#")
            served = self.served.get(repo.lower())
            if served is not None:
                place = {"parent": parent, "pos": pos, "base_s": base_s}
                orders.setdefault(served, {})[int(number)] = place

    async def _save_order(self, rstore: RepoStore, places: dict[int, dict[str, Any]]) -> None:
        before = await rstore.orders(list(places))
        moved = {n: p for n, p in places.items() if before.get(n) != p}
        if moved:
            await self._save(rstore, GraphUpdate(order=dict(moved)))
            await self._reindex(rstore, list(moved))

    # --- blocker states -----------------------------------------------------------------

    async def note_states(self, rstore: RepoStore, items: Iterable[dict[str, Any]]) -> None:
        """Issues of `rstore` as GitHub showed them now (a sync page, a delivery): their
        state as blockers goes to every served repository that depends on them, and the links
        of the closed ones are forgotten here."""
        if not self.enabled:
            return
        states, closed = {}, []
        for data in items:
            if "pull_request" in data:
                continue
            n = int(data["number"])
            states[f"{rstore.repository}#{n}"] = rest_state(data)
            if data.get("state") != "open":
                closed.append(n)
        if not states:
            return
        if closed:
            await self._save(rstore, GraphUpdate(gone=closed))
        await self.push_states(states)

    async def note_gone(self, rstore: RepoStore, numbers: list[int]) -> None:
        """Issues deleted or transferred: their dependents wait until their links are read
        again, which happens at once."""
        if not self.enabled or not numbers:
            return
        await self._save(rstore, GraphUpdate(gone=numbers))
        await self.push_states({f"{rstore.repository}#{n}": "gone" for n in numbers})

    async def push_states(self, states: dict[str, str]) -> None:
        """Every served repository some of whose issues have blockers learns these states."""
        for name in sorted(await self.store.graph_repos()):
            if name not in self.store.repos:
                continue
            target = self.store.repo(name)
            verdicts = await self._save(target, GraphUpdate(states=states))
            lost = [v.number for v in verdicts if v.state == "gone"]
            if lost:
                await self.read(target, lost, [], fail_closed=True)

    # --- writes -------------------------------------------------------------------------

    async def _save(self, rstore: RepoStore, update: GraphUpdate) -> list[Verdict]:
        if any(update.links.values()) and rstore.repository not in self._noted:
            await self.store.note_graph_repo(rstore.repository)
            self._noted.add(rstore.repository)
        verdicts = await rstore.save_graph(update, epoch=self.epoch())
        changed = [v.number for v in verdicts if v.changed]
        if changed:
            for v in verdicts:
                if v.changed:
                    logger.info(
                        "%s#%d %s", rstore.repository, v.number,
                        f"blocked by {v.ref} ({v.state})" if v.ref else "unblocked",
                    )
            await self._reindex(rstore, changed)
        return verdicts

    async def _reindex(self, rstore: RepoStore, numbers: list[int]) -> None:
        """Index these issues again from their cache: the rules see their new verdict."""
        issues = await rstore.get_issues(numbers)
        if issues:
            await self.mirror.mirror(rstore, issues, read_links=False)

    async def find_cycles(self) -> None:
        """Every dependency cycle among open issues of the served repositories, written to
        each repository (graph:cycles) and logged when new. Its issues block each other (each
        has an open blocker): reported for a person to break, never followed round."""
        edges: dict[str, list[str]] = {}
        for name, rstore in self.store.repos.items():
            for n, refs in (await rstore.links()).items():
                edges[f"{name}#{n}".lower()] = [r.lower() for r in refs if not r.startswith("?")]
        found: dict[str, dict[int, list[str]]] = {name: {} for name in self.store.repos}
        for cycle in cycles_of(edges):
            for ref in cycle:
                repo, _, number = ref.rpartition("#")
                owner = self.served.get(repo)
                if owner is not None:
                    found[owner][int(number)] = cycle
        for name, cycles in found.items():
            if cycles != self._cycles.get(name):
                for n, cycle in sorted(cycles.items()):
                    logger.warning("%s#%d is on a dependency cycle: %s", name, n,
                                   " -> ".join([*cycle, cycle[0]]))
                await self.store.repo(name).save_graph(
                    GraphUpdate(cycles=cycles), epoch=self.epoch()
                )
                self._cycles[name] = cycles

    # --- webhooks -----------------------------------------------------------------------

    async def from_delivery(self, repository: str, event: str, payload: dict[str, Any]) -> str:
        """An `issue_dependencies` or `sub_issues` delivery: the links concerned read again
        (one GraphQL request), the two issues mirrored as the payload shows them."""
        if not self.enabled:
            return "ignored (dependencies off)"
        action = str(payload.get("action") or "")
        if event == "issue_dependencies":
            mine = action.startswith("blocked_by")
            blocked_repo = repository if mine else _repo_name(payload, "blocked_issue_repo")
            blocking_repo = _repo_name(payload, "blocking_issue_repo") if mine else repository
            number = int(payload["blocked_issue"]["number"])
            reads: list[tuple[str, list[int], list[int]]] = [(blocked_repo, [number], [])]
            ends = [
                (blocked_repo, payload["blocked_issue"]),
                (blocking_repo, payload["blocking_issue"]),
            ]
        else:
            mine = action.startswith("sub_issue")
            parent_repo = repository if mine else _repo_name(payload, "parent_issue_repo")
            sub_repo = _repo_name(payload, "sub_issue_repo") if mine else repository
            number = int(payload["parent_issue"]["number"])
            reads = [(parent_repo, [], [number])]
            sub = dict(payload["sub_issue"])
            # Deliveries name no parent on an issue: this one says which it is now.
            sub["parent_issue_url"] = (
                payload["parent_issue"].get("url") if action.endswith("added") else None
            )
            ends = [(parent_repo, payload["parent_issue"]), (sub_repo, sub)]
        done = []
        for name, blockers, parents in reads:
            served = self.served.get(name.lower())
            if served is not None:
                await self.read(self.store.repo(served), blockers, parents, fail_closed=True)
                done.append(f"{served}#{number}")
        await self._mirror_ends(ends)
        return f"links read again: {', '.join(done) or 'none served'}"

    async def _mirror_ends(self, ends: list[tuple[str, dict[str, Any]]]) -> None:
        for name, data in ends:
            served = self.served.get(str(name).lower())
            if served is None or data.get("state") != "open" or "pull_request" in data:
                continue
            rstore = self.store.repo(served)
            issue = Issue.from_github(data)
            if issue.parent is None:
                cached = await rstore.get_issue(issue.number)
                issue = issue.model_copy(update={"parent": cached.parent if cached else ""})
            await self.mirror.mirror(rstore, [issue], read_links=False)


def _repo_name(payload: dict[str, Any], key: str) -> str:
    return str((payload.get(key) or {}).get("full_name") or "")


def cycles_of(edges: dict[str, list[str]]) -> list[list[str]]:
    """The cycles of a directed graph, one per strongly connected component of more than one
    node (or a node linked to itself), each as a path in the order of its links."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, []):
            if w not in edges:
                continue  # not an open dependent: cannot be on a cycle of open issues
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1 or v in edges.get(v, []):
                found.append(_path(sorted(members), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _path(members: list[str], edges: dict[str, list[str]]) -> list[str]:
    """A walk along the links through the members of one component, from the smallest."""
    inside = set(members)
    path, seen = [members[0]], {members[0]}
    while True:
        nxt = next((w for w in edges.get(path[-1], []) if w in inside and w not in seen), None)
        if nxt is None:
            return path
        path.append(nxt)
        seen.add(nxt)

