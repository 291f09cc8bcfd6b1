"""Use cases of maintainers steering running work: revoke, reassign, note, retry an issue;
pause, stop, resume an agent; pause and resume a repository or the whole broker.

Every action is one Lua script per repository (control.lua), so it is atomic with the claims
running beside it, and lands in the audit log with the outcome that really happened. Agents
learn of it through their next heartbeat (revoked with the reason, paused, a note).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from github_broker.errors import InvalidRequest, NotFound
from github_broker.models import Actor, ControlOutcome, Issue, printable
from github_broker.settings import AGENT_ID_RE, Settings
from github_broker.steering.authority import (
    actor_arg,
    agent_scope,
    require_deployment,
    require_repository,
)
from github_broker.store import RepoStore, Store
from github_broker.store.agents import SEEN_KEEP_DAYS

logger = logging.getLogger(__name__)

#: Known agent ids a refusal names at most.
KNOWN_SHOWN = 20
#: Longest reason or note a maintainer may give (characters).
MAX_TEXT = 1000

#: What indexes an issue's tasks again from its cache (the sync's own path): a retry after the
#: failure budget dropped them. Given the repository's store and the issue as it will read
#: once the queued label writes land.
Reindex = Callable[[RepoStore, Issue], Awaitable[None]]


@dataclass(frozen=True)
class BudgetRaise:
    """A retry that raises an issue's usage budget (budgets.tokens / budgets.cost for it
    alone) instead of counting its usage again from zero."""

    tokens: int | None = None
    cost: float | None = None

    def as_json(self) -> str:
        if self.tokens is None and self.cost is None:
            raise InvalidRequest("raising a budget needs tokens or cost")
        return json.dumps({k: v for k, v in (("tokens", self.tokens), ("cost", self.cost)) if v})


@dataclass
class ActionResult:
    """What one action did: in words, and per repository where it touched several."""

    action: str
    target: str
    outcome: str
    repositories: dict[str, str] = field(default_factory=dict)


class Steering:
    """Maintainers' actions on running work (admin API, CLI, dashboard, `/broker` comments)."""

    def __init__(self, settings: Settings, store: Store, reindex: Reindex | None = None) -> None:
        self.settings = settings
        self.store = store
        self.reindex = reindex

    # --- one issue ----------------------------------------------------------------------

    async def revoke(
        self, repository: str, number: int, actor: Actor, reason: str = "", *, hold: bool = False
    ) -> ActionResult:
        """End the lease on the issue now; its task returns to the pool, or (hold) the issue
        waits for a person until a retry."""
        rstore = await self._issue(repository, number, actor)
        done = await rstore.control(
            "revoke", actor_arg(actor), str(number), _text(reason), "1" if hold else ""
        )
        return await self._result("revoke", f"{repository}#{number}", done)

    async def reassign(
        self, repository: str, number: int, agent_id: str, actor: Actor, reason: str = ""
    ) -> ActionResult:
        """The issue's task goes to `agent_id` (its next request-task), branch and PR kept;
        the current holder's lease is revoked."""
        _check_agent(self.settings, agent_id)
        rstore = await self._issue(repository, number, actor)
        await self._known(agent_id)
        if len(self.store.repos) > 1:
            # Its next request must look there, even if it never claimed there before.
            keep_ms = self.settings.leases.agent_task_ttl_s * 1000
            await self.store.note_agent_repos(agent_id, [repository], keep_ms)
        done = await rstore.control(
            "reassign", actor_arg(actor), str(number), _text(reason), agent_id
        )
        return await self._result("reassign", f"{repository}#{number}", done)

    async def note(self, repository: str, number: int, actor: Actor, text: str) -> ActionResult:
        """A message to the agent holding the issue, delivered with its next heartbeat."""
        text = _text(text)
        if not text:
            raise InvalidRequest("a note needs text")
        rstore = await self._issue(repository, number, actor)
        done = await rstore.control("note", actor_arg(actor), str(number), text)
        return await self._result("note", f"{repository}#{number}", done)

    async def retry(
        self,
        repository: str,
        number: int,
        actor: Actor,
        reason: str = "",
        *,
        raise_budget: BudgetRaise | None = None,
    ) -> ActionResult:
        """Give an issue the broker gave up on (needs-human, failure budget, a budget, a hold)
        another round: its failures cleared, its tasks back in the pool, the agents it was
        revoked from let back. Its usage is counted again from the retry, unless
        `raise_budget` raises the issue's budget instead (the usage so far kept)."""
        rstore = await self._issue(repository, number, actor)
        raised = raise_budget.as_json() if raise_budget is not None else ""
        done = await rstore.control(
            "retry", actor_arg(actor), str(number), _text(reason), raised
        )
        if done.reindex and self.reindex is not None:
            issue = await rstore.get_issue(number)
            if issue is not None:
                # As GitHub will show it once the queued removal lands.
                labels = [lab for lab in issue.labels if lab != self.settings.labels.needs_human]
                await self.reindex(rstore, issue.model_copy(update={"labels": labels}))
        return await self._result("retry", f"{repository}#{number}", done)

    # --- agents -------------------------------------------------------------------------

    async def pause_agent(
        self, agent_id: str, actor: Actor, reason: str = "", *, stop: bool = False
    ) -> ActionResult:
        """Pause (drain: its task may finish, no new one) or stop (its lease revoked now),
        everywhere the actor may steer (an administrator: the whole deployment)."""
        _check_agent(self.settings, agent_id)
        scope = agent_scope(actor, self.store.repos)
        await self._known(agent_id)
        per_repo = await self.store.pause_agent(
            agent_id, actor_arg(actor), _text(reason), stop=stop, scope=scope
        )
        action = "stop" if stop else "pause"
        refused = [out.outcome for out in per_repo.values() if out.outcome.startswith("refused")]
        touched = {name: out.outcome for name, out in per_repo.items() if "revoked" in out.outcome}
        if refused:
            outcome = refused[0]
        else:
            outcome = "stopped" if stop else "paused: its current task may finish, no new one"
            if scope is not None:
                outcome += " in " + ", ".join(scope)
        if touched:
            outcome += "; " + "; ".join(f"{name}: {text}" for name, text in touched.items())
        await self.store.record_audit(
            actor_arg(actor), f"{action}_agent", agent=agent_id, reason=_text(reason),
            outcome=outcome,
        )
        return ActionResult(f"{action}_agent", agent_id, outcome, touched)

    async def resume_agent(self, agent_id: str, actor: Actor, reason: str = "") -> ActionResult:
        _check_agent(self.settings, agent_id)
        scope = agent_scope(actor, self.store.repos)
        await self._known(agent_id)
        outcome = await self.store.resume_agent(agent_id, actor_arg(actor), scope=scope)
        await self.store.record_audit(
            actor_arg(actor), "resume_agent", agent=agent_id, reason=_text(reason),
            outcome=outcome,
        )
        return ActionResult("resume_agent", agent_id, outcome)

    # --- repositories and the broker ----------------------------------------------------

    async def pause_repo(
        self, repository: str, actor: Actor, reason: str = "", *, resume: bool = False
    ) -> ActionResult:
        """Maintenance of one repository: nothing new is handed out, leases keep running."""
        rstore = self._repo(repository, actor)
        action = "resume_repo" if resume else "pause_repo"
        done = await rstore.control(action, actor_arg(actor), "", _text(reason), "repo")
        return await self._result(action, repository, done)

    async def pause_broker(
        self, actor: Actor, reason: str = "", *, resume: bool = False
    ) -> ActionResult:
        """Maintenance of the whole broker: nothing new is handed out anywhere."""
        action = "resume_broker" if resume else "pause_broker"
        require_deployment(actor, action)
        await self.store.pause_broker(actor_arg(actor), _text(reason), resume=resume)
        outcome = (
            "resumed"
            if resume
            else f"paused in {len(self.store.repos)} repositories; leases keep running"
        )
        await self.store.record_audit(
            actor_arg(actor), action, reason=_text(reason), outcome=outcome
        )
        return ActionResult(action, "broker", outcome)

    # --- helpers ------------------------------------------------------------------------

    def _repo(self, repository: str, actor: Actor) -> RepoStore:
        if repository not in self.store.repos:
            raise NotFound(f"repository {repository!r} is not served by this broker")
        require_repository(actor, repository)
        return self.store.repo(repository)

    async def _issue(self, repository: str, number: int, actor: Actor) -> RepoStore:
        rstore = self._repo(repository, actor)
        if number not in await rstore.open_numbers_of([number]):
            raise NotFound(f"#{number} is not an open issue of {repository} (as mirrored)")
        return rstore

    async def known_agents(self) -> list[str]:
        """Agents the broker knows: those with a token, those that asked for work lately
        (store/agents.py `note_seen`) and paused ones."""
        known = dict.fromkeys(self.settings.server.resolved_agent_tokens().values())
        known.update(dict.fromkeys(await self.store.seen_agents()))
        known.update(dict.fromkeys(await self.store.paused_agents()))
        return list(known)

    async def _known(self, agent_id: str) -> None:
        """An action naming an agent the broker does not know is refused (404), never a
        silent no-op: agent ids are compared as written (`A1` is not `a1`), and a near miss
        is named."""
        known = await self.known_agents()
        if agent_id in known:
            return
        near = [a for a in known if a.lower() == agent_id.lower()]
        hint = f"; did you mean {near[0]!r}?" if near else ""
        shown = ", ".join(sorted(known)[:KNOWN_SHOWN]) or "none yet"
        more = f" and {len(known) - KNOWN_SHOWN} more" if len(known) > KNOWN_SHOWN else ""
        raise NotFound(
            f"no agent {agent_id!r} is known to this broker (a token, or a request for work in "
            f"the last {SEEN_KEEP_DAYS} days){hint}; known: {shown}{more}"
        )

    async def _result(self, action: str, target: str, done: ControlOutcome) -> ActionResult:
        """The action's result; a keep-away it made is also recorded for the deployment
        (written back by the leader if Redis loses its data)."""
        logger.info("%s %s: %s", action, target, done.outcome)
        if done.kept_away:
            agent, _, until = done.kept_away.rpartition("|")
            repository, _, number = target.rpartition("#")
            await self.store.note_kept_away(repository, int(number), agent, int(until))
        if action == "retry" and "may take it again" in done.outcome:
            repository, _, number = target.rpartition("#")
            await self.store.forget_kept_away(repository, int(number))
        return ActionResult(action, target, done.outcome)


def _text(text: str) -> str:
    text = printable(text).strip()
    if len(text) > MAX_TEXT:
        raise InvalidRequest(f"reason or note longer than {MAX_TEXT} characters")
    return text


def _check_agent(settings: Settings, agent_id: str) -> None:
    if not AGENT_ID_RE.match(agent_id):
        raise InvalidRequest(
            f"agent id {agent_id!r}: 1-50 characters from A-Z a-z 0-9 . _ -, starting with a "
            "letter or digit"
        )
    clash = settings.label_clash(agent_id)
    if clash is not None:
        raise InvalidRequest(f"{agent_id!r} is the label {clash}, not an agent id")
