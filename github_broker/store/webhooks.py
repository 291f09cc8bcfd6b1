"""Webhook deliveries queued for the poller, and the issue versions they carry."""

from __future__ import annotations

import time
from typing import Literal, cast

from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors


class WebhookQueue(RepoBase):
    """Webhook deliveries queued for the poller, and the issue versions they carry."""

    @translate_errors
    async def enqueue_webhook(
        self, delivery_id: str, body_digest: str, envelope: str, ttl_s: int
    ) -> Literal["queued", "duplicate", "replay"]:
        """Queue a verified delivery: `duplicate` when this delivery id was queued before,
        `replay` when the same signed body (`body_digest`, its SHA-256) came under another id."""
        keys = [
            self.keys.webhook_delivery(delivery_id),
            self.keys.webhooks,
            self.keys.webhooks_seen,
            self.keys.webhook_body(body_digest),
        ]
        found = int(await self.scripts.webhook_enqueue(keys=keys, args=[envelope, ttl_s]))
        return "queued" if found == 1 else "replay" if found == 2 else "duplicate"

    @translate_errors
    async def take_webhook(self, timeout_s: float) -> str | None:
        """The oldest queued delivery, moved to the in-flight list; waits up to `timeout_s`
        (0: does not wait)."""
        src, dst = self.keys.webhooks, self.keys.webhooks_inflight
        if timeout_s <= 0:
            raw = await self.client.lmove(src, dst, "RIGHT", "LEFT")
        else:
            # Redis takes fractional seconds; redis-py's stubs say int.
            raw = await self.client.blmove(src, dst, cast(int, timeout_s), "RIGHT", "LEFT")
        return as_text(raw) if raw is not None else None

    @translate_errors
    async def webhook_done(self, envelope: str) -> None:
        await awaited(self.client.lrem(self.keys.webhooks_inflight, 1, envelope))

    @translate_errors
    async def requeue_inflight_webhooks(self) -> int:
        """Put deliveries a crashed worker took back at the head of the queue."""
        moved = 0
        while await self.client.lmove(
            self.keys.webhooks_inflight, self.keys.webhooks, "LEFT", "RIGHT"
        ):
            moved += 1
        return moved

    @translate_errors
    async def webhook_backlog(self) -> int:
        return int(await awaited(self.client.llen(self.keys.webhooks)))

    @translate_errors
    async def webhook_inflight(self) -> int:
        """Deliveries the worker took and has not finished."""
        return int(await awaited(self.client.llen(self.keys.webhooks_inflight)))

    @translate_errors
    async def mark_webhooks_seen(self) -> None:
        """A verified ping: the webhook is alive even before any change is delivered."""
        await self.client.set(self.keys.webhooks_seen, int(time.time() * 1000))

    @translate_errors
    async def webhooks_seen_ms(self) -> int | None:
        raw = await awaited(self.client.get(self.keys.webhooks_seen))
        return int(raw) if raw else None

    @translate_errors
    async def issue_version(self, number: int) -> str | None:
        raw = await awaited(self.client.get(self.keys.issue_version(number)))
        return as_text(raw) if raw else None

    @translate_errors
    async def set_issue_version(self, number: int, version: str, ttl_s: int) -> None:
        await self.client.set(self.keys.issue_version(number), version, ex=ttl_s)
