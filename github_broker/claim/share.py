"""Fair share across repositories: within one priority, repositories take turns by weight.

A request across repositories tries them in claim order (`walk.claim_order`: a reassigned
task first, then the most urgent bucket). Repositories tied there take turns by their
configured `weight` (default 1, equal shares), as start-time fair queueing does: each
repository's next turn starts at `max(its last finish, now)`, where "now" is the virtual
time (the start of the latest turn taken) and a hand-out advances its finish by
`1 / weight`. So a repository with 200 ready issues and one with 5 alternate, the small one
is drained within its share; a repository that had no work comes in at the virtual time,
never with credit saved up from its idle hours; the order by priority is never crossed.

The turns live in the serve process (no Redis command, nothing per configured repository:
a repository is remembered once it was handed a task here). Several serve processes each
take turns over their own hand-outs, so the deployment shares by the same weights. A turn
is taken when a request picks its first repository (concurrent requests then start in
different repositories) and moved to wherever the request's task came from, or given back
when it got none.
"""

from __future__ import annotations

from collections.abc import Collection


class FairShare:
    """This process's turns of repositories (see the module's docstring)."""

    def __init__(self, weights: dict[str, int]) -> None:
        #: repository -> its weight, for those configured with another than 1.
        self.weights = {name: w for name, w in weights.items() if w != 1}
        #: repository -> the virtual time its last turn here finished.
        self._finish: dict[str, float] = {}
        #: The start of the latest turn taken (never goes back).
        self._now = 0.0

    def weight(self, name: str) -> int:
        return self.weights.get(name, 1)

    def key(self, name: str) -> float:
        """When `name`'s next turn starts: the lower, the sooner among repositories tied in
        claim order."""
        return max(self._finish.get(name, 0.0), self._now)

    def take(self, name: str) -> None:
        """`name` takes a turn (a hand-out there, or one on the way)."""
        start = self.key(name)
        self._finish[name] = start + 1 / self.weight(name)
        self._now = start

    def give_back(self, name: str) -> None:
        """The turn taken for `name` brought no hand-out there."""
        if name in self._finish:
            self._finish[name] -= 1 / self.weight(name)

    def moved(self, taken: str | None, got: str | None) -> None:
        """A request that took a turn for `taken` got its task from `got` (None: none)."""
        if taken == got:
            return
        if taken is not None:
            self.give_back(taken)
        if got is not None:
            self.take(got)

    def words(self, name: str, tied: Collection[str], priority: int | None) -> str:
        """`name`'s share among the repositories `tied` with it in claim order, in words
        ('' when it shares with none)."""
        if len(tied) < 2:
            return ""
        total = sum(self.weight(n) for n in tied)
        mine = self.weight(name)
        level = f"P{priority}" if priority is not None else "the same priority"
        return (
            f"weight {mine} of {total} among the {len(tied)} repositories with {level} work: "
            f"{100 * mine / total:.0f}% of their hand-outs"
        )
