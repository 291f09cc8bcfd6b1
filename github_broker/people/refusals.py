"""A refused action in the audit log: who asked (by name, with their authority), what, where,
and why it was refused; every edge (admin API, dashboard, CLI through the API) records its
refusals here."""

from __future__ import annotations

import logging

from github_broker.errors import BrokerError
from github_broker.models import Actor
from github_broker.steering.authority import actor_arg
from github_broker.store import Store

logger = logging.getLogger(__name__)


async def record_refusal(
    store: Store, actor: Actor, action: str, why: str, *, repository: str = "", agent: str = ""
) -> None:
    """Audit `actor`'s refused `action`; a Redis that cannot take it is logged, and the
    refusal still stands."""
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
