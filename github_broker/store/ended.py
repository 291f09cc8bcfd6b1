"""What this process remembers of lease ends, heard on the deployment's events channel.

Redis keeps a tombstone per ended lease (`lease_end:{token}`), so a late heartbeat of an ended
lease learns why it ended. When Redis loses its data (FLUSHALL, a restart without
persistence, a promoted replica that lagged) the tombstones go with it, and a signed token
only proves that a lease *was* granted. Every lease end is also published
(`end_lease` in lua/_lib.lua), and every serve process keeps the ends it heard for as long as
a token can prove its lease: a token of an ended lease is refused with its real reason, also
after the loss. A process that has heard every end since before a token's claim, and not
that token's, can vouch that the lease is live (`recall`): the scripts then rebuild it even
where GitHub's labels lag (adopt_proven).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

from github_broker.clock import now_ms

#: Lease ends remembered per process, the oldest forgotten first (about 100 bytes each).
REMEMBERED = 200_000

Memory = Literal["live", "unknown"]


class EndedLeases:
    """The lease ends this process heard, by token (the part Redis keeps)."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self.remembered = remembered
        self._ends: OrderedDict[str, str] = OrderedDict()
        #: Since when (ms) this process has heard every end without a gap; None: never.
        self.since_ms: int | None = None

    def subscribed(self) -> None:
        """Redis confirmed the subscription (again): ends published before now may be lost."""
        self.since_ms = now_ms()

    def heard(self, message: str) -> bool:
        """Take an `ended <token> <outcome[|detail]>` message; False for any other."""
        kind, _, rest = message.partition("\t")
        if kind != "ended":
            return False
        token, _, ended = rest.partition("\t")
        self._ends[token] = ended
        self._ends.move_to_end(token)
        while len(self._ends) > self.remembered:
            self._ends.popitem(last=False)
        return True

    def ended(self, token: str) -> str | None:
        """How the lease of `token` ended (`outcome` or `outcome|detail`), if heard."""
        return self._ends.get(token)

    def recall(self, token: str, claimed_ms: int) -> Memory:
        """'live' when this process has heard every end since before the lease's claim and
        none of its own; 'unknown' otherwise (call `ended` first)."""
        if self.since_ms is not None and self.since_ms <= claimed_ms and token not in self._ends:
            return "live"
        return "unknown"
