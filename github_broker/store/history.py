"""History: per-minute and per-hour counts of a repository's timeline events (written by
`_lib.lua` `timeline` in the same step as the event), the leader's samples of its queue,
the running totals; and the deployment's record of the minutes it sampled.

An event is counted in its minute's hash only; the leader folds each finished minute into
its hour's hash and the totals once (`fold_history`, history_fold.lua), and the readers of
hours and totals add the minutes not folded yet, so a figure is the same before and after
a fold. A minute left unfolded longer than its hash lives (no leader for 24 h) loses its
events from the hours and the totals.

Fields of each hash (`ev:` and the rest are added by the Lua, `q:` and `waiting` by
`record_sample`):

===================  ==================================================================
``ev:<kind>``        timeline events of that kind (``claim``, ``completed``, ``failed``,
                     ``abandoned``, ``expired``, ``revoked``, ``stalled``, ...)
``claim:<type>``     hand-outs by task type (development, review, fix)
``wait:<le>``        development hand-outs whose task had been claimable at most ``le``
                     seconds (one bucket each, ``+Inf`` last); ``wait:ms`` their sum (ms)
``pr:<le>``          completed development tasks (the PR is open: needs-review) by time
                     from the claim, as ``wait``; ``pr:ms`` their sum (ms)
``a:<agent>:ok``     the agent's completed leases; ``:fail`` its failed, abandoned and
                     expired ones; ``:ms`` the time its completed tasks took (ms)
``q:P<n>``           ready tasks of priority n at the sample (hours: summed over samples;
                     written to the hour by the sample, never folded)
``waiting``          work waiting on a person at the sample (hours: summed; the number
                     of samples is the number of minutes `HistorySamples` holds)
===================  ==================================================================

Memory (see docs/dashboard.md "What the history costs"): per repository at most 1441
minute hashes and 26 hour hashes, each with at most 61 fields (15 event kinds, 3 task
types, 2 x 16 duration fields, 10 priorities, waiting) + 3 per agent that ended a lease in
it, whatever the traffic; a minute without events or a queue costs no key. The totals hash
grows with the agents ever seen.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from importlib import resources
from typing import Any

from github_broker.keys import GlobalKeys
from github_broker.models import SCORE_GROUP
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors

#: Seconds a minute's hash lives: the last 24 h and the minute under way.
HISTORY_MINUTE_TTL_S = 86400 + 60
#: Seconds an hour's hash lives: 24 h, the hour under way and a margin.
HISTORY_HOUR_TTL_S = 26 * 3600
#: Upper bounds (s) of the duration buckets (`HISTORY_LE_S` in _lib.lua), then +Inf.
DURATION_BOUNDS_S = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
#: Priorities counted per sample (P0 ... P9); lower ones count as P9.
SAMPLE_PRIORITIES = 10
#: Most minutes one fold takes (a leader back after a long absence catches up over several).
FOLD_MINUTES_MAX = 240

#: One hash of counts: field -> value.
Counts = dict[str, int]


def _counts(raw: dict[Any, Any]) -> Counts:
    return {as_text(k): int(v) for k, v in raw.items()}


def is_sample(field: str) -> bool:
    """A queue sample's field: summed into its hour by the sample, never folded."""
    return field.startswith("q:") or field == "waiting"


def _events(counts: Counts) -> Counts:
    return {k: v for k, v in counts.items() if not is_sample(k)}


@cache
def _fold_source() -> str:
    return (resources.files("github_broker") / "lua" / "history_fold.lua").read_text("utf-8")


class History(RepoBase):
    """One repository's history hashes."""

    @translate_errors
    async def history_minutes(self, first: int, last: int) -> list[Counts]:
        """The counts of minutes `first` .. `last` (epoch ms // 60000), oldest first."""
        return await self._hashes([self.keys.history_minute(m) for m in range(first, last + 1)])

    @translate_errors
    async def history_hours(self, first: int, last: int) -> list[Counts]:
        """The counts of hours `first` .. `last` (epoch ms // 3600000), oldest first: the
        folded ones and the events of their minutes not folded yet."""
        keys = [self.keys.history_hour(h) for h in range(first, last + 1)]
        minutes, hours = await self._with_unfolded(keys, first * 60, (last + 1) * 60 - 1)
        out = [Counter(h) for h in hours]
        for minute, counts in minutes.items():
            out[minute // 60 - first].update(counts)
        return [dict(c) for c in out]

    @translate_errors
    async def history_totals(self) -> Counts:
        """The counts since the start (the same fields, no samples): the folded ones and the
        events of the minutes not folded yet."""
        minutes, (totals,) = await self._with_unfolded([self.keys.history_total])
        out = Counter(totals)
        for counts in minutes.values():
            out.update(counts)
        return dict(out)

    async def _with_unfolded(
        self, keys: list[str], first: int | str = "-inf", last: int | str = "+inf"
    ) -> tuple[dict[int, Counts], list[Counts]]:
        """The hashes `keys` and, read with them in one transaction, which minutes among
        `first` .. `last` are unfolded; then those minutes' events. Each event is counted
        once: a fold after the transaction is not in the hashes read, and leaves the
        minutes' hashes as they are; a later read finds at least as much."""
        # Plain commands: redis-py's Cluster transactions call these replies' parsers with
        # arguments they do not take.
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command("ZRANGEBYSCORE", self.keys.history_unfolded, first, last)
            for key in keys:
                pipe.execute_command("HGETALL", key)
            unfolded, *hashes = await pipe.execute()
        minutes = [int(as_text(m)) for m in unfolded]
        counts = await self._hashes([self.keys.history_minute(m) for m in minutes])
        return (
            {m: _events(c) for m, c in zip(minutes, counts, strict=True)},
            [_counts(h) for h in hashes],
        )

    @translate_errors
    async def fold_history(self, most: int = FOLD_MINUTES_MAX) -> int:
        """Fold the finished unfolded minutes (at most `most`) into their hours and the
        totals, each once (history_fold.lua); the number folded."""
        script = self.client.register_script(_fold_source())
        keys = [self.keys.history_unfolded, self.keys.history_total, self.keys.timeline]
        args = [
            self.keys.history_minute_prefix,
            self.keys.history_hour_prefix,
            HISTORY_HOUR_TTL_S,
            most,
        ]
        return int(await script(keys=keys, args=args))

    async def _hashes(self, keys: list[str]) -> list[Counts]:
        async with self.client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hgetall(key)
            return [_counts(raw) for raw in await pipe.execute()]

    @translate_errors
    async def queue_sample(self) -> tuple[dict[int, int], int]:
        """Ready tasks per priority, and the work waiting on a person, now: one ZCOUNT per
        priority present (at most SAMPLE_PRIORITIES), not a read of the queue."""
        unit = 4 * SCORE_GROUP
        ready: dict[int, int] = {}
        low = 0
        for _ in range(SAMPLE_PRIORITIES):
            first = await awaited(
                self.client.zrangebyscore(
                    self.keys.ready, low, "+inf", start=0, num=1, withscores=True
                )
            )
            if not first:
                break
            p = min(int(first[0][1]) // unit, SAMPLE_PRIORITIES - 1)
            last = p == SAMPLE_PRIORITIES - 1
            high = "+inf" if last else f"({(p + 1) * unit}"
            ready[p] = int(await awaited(self.client.zcount(self.keys.ready, p * unit, high)))
            low = (p + 1) * unit
        waiting = int(await awaited(self.client.hlen(self.keys.waiting)))
        return ready, waiting

    @translate_errors
    async def record_sample(self, at_ms: int, ready: dict[int, int], waiting: int) -> None:
        """Write a sample of the queue taken at `at_ms` (the caller samples each minute
        once). Nothing queued and nothing waiting writes nothing: a quiet repository costs
        no key (`HistorySamples` knows the minute was sampled)."""
        fields = {f"q:P{p}": n for p, n in ready.items() if n}
        if waiting:
            fields["waiting"] = waiting
        if not fields:
            return
        minute = self.keys.history_minute(at_ms // MINUTE_MS)
        hour = self.keys.history_hour(at_ms // HOUR_MS)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(minute, mapping=fields)
            for name, n in fields.items():
                pipe.hincrby(hour, name, n)
            pipe.expire(minute, HISTORY_MINUTE_TTL_S)
            pipe.expire(hour, HISTORY_HOUR_TTL_S)
            await pipe.execute()


class HistorySamples:
    """The deployment's record of the minutes the leader sampled every repository's queue in
    (a minute in it with no `q:` field in a repository's hash: nothing was queued there)."""

    def __init__(self, client: Any, keys: GlobalKeys, call_timeout_s: float) -> None:
        self.client = client
        self.key = keys.history_sampled
        self.call_timeout_s = call_timeout_s

    @translate_errors
    async def claim_minute(self, minute: int) -> bool:
        """Mark `minute` sampled; False when it was already (a second leader that minute),
        so an hour's sums count each minute once. Minutes older than 24 h are dropped."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.zadd(self.key, {str(minute): minute}, nx=True)
            pipe.zremrangebyscore(self.key, "-inf", minute - 24 * 60 - 1)
            added, _ = await pipe.execute()
        return bool(added)

    @translate_errors
    async def minutes(self, first: int, last: int) -> set[int]:
        """The sampled minutes among `first` .. `last`."""
        found = await awaited(self.client.zrangebyscore(self.key, first, last))
        return {int(as_text(m)) for m in found}
