"""Who may steer what: the one table of rights, checked before any action runs.

Two questions, answered in two places that every path goes through:

- *May this person act here at all?* (this module): an administrator acts everywhere; a
  maintainer on the repositories they maintain; a person commenting on GitHub in the repository
  of the comment. Deployment-wide actions (pausing the broker) need an administrator. A refusal
  is a `Forbidden` (403) that names who may act, and it is audited.
- *May this person lift that decision?* (`lua/control.lua`, `may_lift` in `lua/_lib.lua`):
  every decision is stored with the rank of whoever made it (`models.Authority`), and is lifted
  only by the same or a higher rank, with a scope that covers it. An ended lease is final.

The table itself, with what each decision is and who lifts it, is in docs/architecture.md
("Who may steer what").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from github_broker.errors import BrokerError, Forbidden
from github_broker.models import Actor, Authority
from github_broker.store import Store

logger = logging.getLogger(__name__)

#: Actions on the whole deployment: an administrator's alone.
DEPLOYMENT_ACTIONS = frozenset({"pause_broker", "resume_broker"})


def actor_arg(actor: Actor) -> str:
    """How an actor travels to the scripts: `<rank>:<name>` (control.lua reads both)."""
    return f"{int(actor.authority)}:{actor.name}"


def described(actor: Actor) -> str:
    """`alice (a maintainer of acme/widgets)`, for refusals and replies."""
    if actor.authority is Authority.ADMIN or actor.repositories is None:
        return f"{actor.name} ({actor.authority.title})"
    where = ", ".join(sorted(actor.repositories)) or "no repository"
    return f"{actor.name} ({actor.authority.title} of {where})"


def require_repository(actor: Actor, repository: str) -> None:
    """`actor` may steer work in `repository`, or Forbidden."""
    if not actor.may_act_on(repository):
        raise Forbidden(
            f"{described(actor)} may not act on {repository}: a maintainer of {repository} "
            "or an administrator may"
        )


def require_deployment(actor: Actor, action: str) -> None:
    """`actor` may take a deployment-wide action, or Forbidden."""
    if action in DEPLOYMENT_ACTIONS and actor.authority is not Authority.ADMIN:
        what = action.replace("_", " ")
        raise Forbidden(f"{described(actor)} may not {what}: an administrator may")


def agent_scope(actor: Actor, served: Iterable[str]) -> list[str] | None:
    """Where an agent action by `actor` applies: None for the whole deployment (an
    administrator, or a person with rights on every served repository), else the served
    repositories the actor may act on (a maintainer's own; a comment's repository)."""
    served = list(served)
    if actor.repositories is None or all(actor.may_act_on(r) for r in served):
        return None
    scope = [r for r in served if actor.may_act_on(r)]
    if not scope:
        raise Forbidden(f"{described(actor)} may not steer agents in any served repository")
    return scope


async def record_refusal(
    store: Store, actor: Actor, action: str, why: str, *, repository: str = "", agent: str = ""
) -> None:
    """Audit `actor`'s refused `action` (every edge records its refusals here: the admin API,
    the dashboard, the CLI through the API, comment commands); a Redis that cannot take it is
    logged, and the refusal still stands."""
    try:
        await store.record_audit(
            actor_arg(actor),
            action,
            agent=agent,
            outcome=f"refused: {why}",
            repository=repository,
        )
    except BrokerError as e:
        logger.warning("refused %s by %s not audited: %s", action, actor.name, e)
