"""Review and fix tasks: offering them, the issues under review and their review state."""

from __future__ import annotations

import json
from typing import Any

from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors


class ReviewStore(RepoBase):
    """Review and fix tasks: offering them, the issues under review and their review state."""

    @translate_errors
    async def put_task(
        self,
        task_id: str,
        *,
        score: int,
        role: str,
        pr: int,
        author: str,
        branch: str,
        payload: dict[str, Any],
        direct: bool = False,
        rounds_field: str = "",
    ) -> int:
        """Offer a review or fix task (see task_put.lua): 1 added, 2 waiting review refreshed,
        0 when it exists or isn't wanted. `rounds_field`: the review_state field counting this
        kind of round ('' fix_rounds; `ci_rounds` for fixes from checks and rebases)."""
        res = await self._run(
            "task_put",
            task_id,
            score,
            role,
            pr,
            author,
            branch,
            json.dumps(payload),
            self.settings.review.fix_task_ttl_s,
            "1" if direct else "0",
            rounds_field,
        )
        return int(res)

    @translate_errors
    async def reviewing(self) -> list[int]:
        return sorted(int(n) for n in await awaited(self.client.smembers(self.keys.reviewing)))

    @translate_errors
    async def review_states(
        self, numbers: list[int]
    ) -> dict[int, tuple[str | None, dict[str, str]]]:
        """Per issue: (review_issue_detected_timestamp, review_state hash)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for n in numbers:
                pipe.get(self.keys.review_detected(n))
                pipe.hgetall(self.keys.review_state(n))
            rows = await pipe.execute()
        out = {}
        for i, n in enumerate(numbers):
            detected, state = rows[2 * i], rows[2 * i + 1]
            out[n] = (
                as_text(detected) if detected else None,
                {as_text(k): as_text(v) for k, v in state.items()},
            )
        return out

    @translate_errors
    async def mark_review_state(self, number: int, field: str, value: str) -> None:
        await awaited(self.client.hset(self.keys.review_state(number), field, value))

    @translate_errors
    async def fix_task(self, pr: int) -> dict[str, Any] | None:
        raw = await awaited(self.client.get(self.keys.fix_task(pr)))
        return json.loads(raw) if raw else None
