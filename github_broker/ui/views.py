"""What the dashboard's pages show, read once per request (or once per change for every live
page of a process): the overview with the agents drawn out of it, and one agent's page."""

from __future__ import annotations

from dataclasses import dataclass, field

from github_broker.clock import iso_from_ms
from github_broker.models import Actor, AgentPause, AuditEntry, Event
from github_broker.reports.health import RefusedDelivery
from github_broker.reports.overview import LeaseRow, Overview, overview
from github_broker.reports.trends import Trends, trends
from github_broker.settings import Settings
from github_broker.store import Store

#: Timeline entries read (per stream) to find an agent's recent tasks.
AGENT_EVENTS_SCANNED = 500
#: An agent's recent timeline entries shown on its page.
AGENT_EVENTS_SHOWN = 50
#: Audit entries read to find the actions on an agent.
AGENT_AUDIT_SCANNED = 300
#: Audit entries about an agent shown on its page.
AGENT_AUDIT_SHOWN = 20


@dataclass
class AgentSummary:
    """One agent as the overview knows it: what it holds, its streaks, its pause."""

    agent_id: str
    paused: AgentPause | None = None
    #: (repository, lease) of every task it holds.
    holds: list[tuple[str, LeaseRow]] = field(default_factory=list)
    #: Consecutive failures per repository.
    streaks: dict[str, int] = field(default_factory=dict)


@dataclass
class DashboardView:
    o: Overview
    #: Agents that hold a task, have a failure streak or are paused, by id.
    agents: list[AgentSummary]
    #: The last webhook delivery refused (deployment-wide), if any.
    refused: RefusedDelivery | None
    #: The trend charts' data (the dashboard page; None for an agent's page).
    trends: Trends | None = None


@dataclass
class AgentView:
    now_ms: int
    agent: AgentSummary
    #: Timeline entries naming it, newest first.
    events: list[Event]
    #: Audit entries about it, newest first.
    audit: list[AuditEntry]
    broker_paused: dict[str, object] | None
    problems: list[str]


def agents_of(o: Overview) -> list[AgentSummary]:
    found: dict[str, AgentSummary] = {
        agent: AgentSummary(agent, paused=pause) for agent, pause in o.paused_agents.items()
    }
    for repo in o.repositories:
        for lease in repo.leases:
            found.setdefault(lease.agent, AgentSummary(lease.agent)).holds.append(
                (repo.repository, lease)
            )
        for agent, streak in repo.streaks.items():
            found.setdefault(agent, AgentSummary(agent)).streaks[repo.repository] = streak
    return sorted(found.values(), key=lambda a: a.agent_id)


async def dashboard_view(
    store: Store,
    settings: Settings,
    range_name: str | None = None,
    who: Actor | None = None,
) -> DashboardView:
    """The dashboard of `who` (None: the whole deployment; a maintainer sees their
    repositories); with `range_name` ("1h", "24h") the trends of that range too."""
    only = who.repositories if who is not None else None
    data = await overview(store, settings, only, who.name if who is not None else "")
    refused = await store.webhook_refused()
    return DashboardView(
        o=data,
        agents=agents_of(data),
        refused=RefusedDelivery(at=iso_from_ms(refused[0]), reason=refused[1], count=refused[2])
        if refused
        else None,
        trends=await trends(store, range_name, data.now_ms) if range_name else None,
    )


async def agent_view(
    store: Store, dashboard: DashboardView, agent_id: str, who: Actor | None = None
) -> AgentView:
    """One agent's page, from the dashboard's data and its own timeline and audit entries
    (`who`: as a maintainer sees them, in their repositories)."""
    summary = next((a for a in dashboard.agents if a.agent_id == agent_id), AgentSummary(agent_id))
    only = who.repositories if who is not None else None
    by = who.name if who is not None else None
    scanned = await store.timeline(AGENT_EVENTS_SCANNED, only)
    events = [e for e in scanned if e.agent == agent_id]
    logged = await store.audit_log(AGENT_AUDIT_SCANNED, repositories=only, also_by=by)
    audit = [a for a in logged if a.agent == agent_id]
    return AgentView(
        now_ms=dashboard.o.now_ms,
        agent=summary,
        events=events[:AGENT_EVENTS_SHOWN],
        audit=audit[:AGENT_AUDIT_SHOWN],
        broker_paused=dashboard.o.broker_paused,
        problems=dashboard.o.problems,
    )
