"""The changing part of each dashboard page, rendered alike for the page itself and for its
live stream (`#live`: everything below the header)."""

from __future__ import annotations

from typing import Any

from github_broker.ui.controls import CONTROLS
from github_broker.ui.guard import Visitor
from github_broker.ui.pages import render
from github_broker.ui.trends import charts
from github_broker.ui.views import AgentView, DashboardView


def dashboard_context(v: DashboardView, who: Visitor) -> dict[str, Any]:
    range_name = v.trends.range if v.trends else None
    back = f"/ui?range={range_name}" if range_name else "/ui"
    return {
        "v": v,
        "o": v.o,
        "csrf": who.csrf,
        "back": back,
        "CONTROLS": CONTROLS,
        "trends_range": range_name,
        "charts": charts(v.trends) if v.trends else [],
        "who": who,
    }


def agent_context(a: AgentView, who: Visitor) -> dict[str, Any]:
    back = f"/ui/agents/{a.agent.agent_id}"
    return {"a": a, "csrf": who.csrf, "back": back, "CONTROLS": CONTROLS, "who": who}


def dashboard(v: DashboardView, who: Visitor) -> str:
    return render("dashboard_live.html", **dashboard_context(v, who))


def agent(a: AgentView, who: Visitor) -> str:
    return render("agent_live.html", **agent_context(a, who))
