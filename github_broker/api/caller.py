"""Who is asking, on every maintainer's route: `Caller`, the one dependency that names the
person behind the token (or 401/403), checks the repository the path names before any Redis
work (steering/authority.py), and audits every refusal of the request as refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Request

from github_broker.errors import Forbidden
from github_broker.models import Actor
from github_broker.steering.authority import record_refusal, require_repository


def path_repository(request: Request) -> str | None:
    """The repository a route's path names (`/…/{owner}/{repo}/…`), if any."""
    params = request.path_params
    if "owner" in params and "repo" in params:
        return f"{params['owner']}/{params['repo']}"
    return None


async def caller(request: Request) -> AsyncIterator[Actor]:
    """The person behind the request, as an `Actor`; a refusal anywhere in the route (here,
    or by `steering/`) lands in the audit log with their name and authority."""
    svc: Any = request.app.state.services
    person = svc.auth.person(request)
    repository = path_repository(request)
    actor: Actor = await svc.rights.actor(person, repository)
    route = request.scope.get("route")
    action = getattr(route, "name", "") or request.url.path
    try:
        if repository is not None and repository in svc.store.repos:
            require_repository(actor, repository)
        yield actor
    except Forbidden as e:
        agent = request.path_params.get("agent_id", "")
        await record_refusal(
            svc.store, actor, action, str(e), repository=repository or "", agent=agent
        )
        raise


#: The person acting on a maintainer's route (see `caller`).
Caller = Annotated[Actor, Depends(caller)]


def visible(actor: Actor, repositories: list[str]) -> list[str]:
    """The repositories of `repositories` that `actor` may see."""
    return [r for r in repositories if actor.may_act_on(r)]

