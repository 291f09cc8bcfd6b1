"""The durable GitHub write queue: label intents, jobs, their outcomes and lag."""

from __future__ import annotations

import json
from typing import Any

from github_broker.clock import now_ms
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors
from github_broker.store.timeline import TIMELINE_MAX


class WriteQueue(RepoBase):
    """The durable GitHub write queue: label intents, jobs, their outcomes and lag."""

    @translate_errors
    async def want_labels(self, number: int, add: list[str], remove: list[str]) -> None:
        """Queue a label change on an issue or pull request."""
        await self._run("labels_want", number, json.dumps(add), json.dumps(remove))

    @translate_errors
    async def outbox_take(
        self, limit: int, hide_ms: int, *, epoch: int = 0
    ) -> list[tuple[str, str, int]]:
        flat = await self._run("outbox_take", limit, hide_ms, epoch)
        return [
            (as_text(flat[i]), as_text(flat[i + 1]), int(flat[i + 2]))
            for i in range(0, len(flat), 3)
        ]

    @translate_errors
    async def outbox_done(
        self,
        job: str,
        payload: str,
        retry_in_ms: int = -1,
        *,
        attempted: bool = True,
        epoch: int = 0,
    ) -> bool:
        """Settle a taken job: done (retry_in_ms -1) or due again later; only `attempted`
        failures count toward dropping it. Fenced by `epoch`."""
        res = await self._run(
            "outbox_done", job, payload, retry_in_ms, "1" if attempted else "0", epoch
        )
        return bool(int(res))

    @translate_errors
    async def outbox_size(self) -> int:
        return int(await awaited(self.client.zcard(self.keys.outbox)))

    @translate_errors
    async def outbox_lag_s(self) -> float:
        """Age in seconds of the oldest due write (0 when none is due): how far GitHub lags
        behind the broker's wishes. A job keeps its first due time while wishes merge into it."""
        oldest = await self.outbox_oldest_due_ms()
        return 0.0 if oldest is None else max(0.0, (now_ms() - oldest) / 1000)

    @translate_errors
    async def outbox_due(self, limit: int) -> dict[str, int]:
        """Up to `limit` jobs due now -> since when they are due (ms); read-only."""
        rows = await awaited(
            self.client.zrangebyscore(
                self.keys.outbox, "-inf", now_ms(), start=0, num=limit, withscores=True
            )
        )
        return {as_text(job): int(score) for job, score in rows}

    @translate_errors
    async def outbox_oldest_due_ms(self) -> int | None:
        """When the longest-waiting write became due (ms), None when the queue is empty."""
        rows = await awaited(self.client.zrange(self.keys.outbox, 0, 0, withscores=True))
        return int(rows[0][1]) if rows else None

    @translate_errors
    async def intent(self, number: int) -> dict[str, Any] | None:
        """The label writes still to do and the labels written but not yet seen by a sync:
        {"add": [...], "remove": [...], "on": [...], "v": n}."""
        raw = await awaited(self.client.hget(self.keys.intent, str(number)))
        if not raw:
            return None
        data = json.loads(raw)
        # Redis's cjson writes an empty list as {}, fakeredis's as []: both mean none.
        return {
            "add": list(data.get("add") or []),
            "remove": list(data.get("remove") or []),
            "on": list(data.get("on") or []),
            "v": data.get("v"),
        }

    @translate_errors
    async def record_write(self, outcome: str, job: str, detail: str = "") -> None:
        """Count a GitHub write outcome (applied, refused: a 4xx to retry, dropped) and put
        it on the timeline."""
        kind, _, number = job.partition(":")
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hincrby(self.keys.outbox_stats, outcome, 1)
            pipe.xadd(
                self.keys.timeline,
                {"kind": f"write_{outcome}", "n": number, "agent": "", "detail": detail or kind},
                maxlen=TIMELINE_MAX,
                approximate=True,
            )
            await pipe.execute()

    @translate_errors
    async def write_queue(self) -> dict[str, Any]:
        """Pending jobs, when the oldest was due, jobs refused at least once, outcome counts."""
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.outbox)
            pipe.zrange(self.keys.outbox, 0, 0, withscores=True)
            pipe.hlen(self.keys.outbox_attempts)
            pipe.hgetall(self.keys.outbox_stats)
            pending, oldest, refusing, stats = await pipe.execute()
        counts = {as_text(k): int(v) for k, v in stats.items()}
        return {
            "pending": int(pending),
            "oldest_due_ms": int(oldest[0][1]) if oldest else None,
            "refusing": int(refusing),
            "applied": counts.get("applied", 0),
            "refused": counts.get("refused", 0),
            "dropped": counts.get("dropped", 0),
        }
