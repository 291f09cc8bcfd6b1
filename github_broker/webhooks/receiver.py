"""The webhook receiver (serve side): verify a delivery's signature, refuse what is not
ours, de-duplicate and queue it for the leader's worker. No poller or GitHub import here."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass

from github_broker.errors import AuthError, InvalidRequest, NotFound
from github_broker.settings import Settings
from github_broker.store import Store
from github_broker.webhooks.payloads import EVENTS, check_shape


def signature_ok(secret: bytes, body: bytes, header: str | None) -> bool:
    """`X-Hub-Signature-256: sha256=<hex>` is the HMAC-SHA256 of the raw body."""
    if not header or not header.startswith("sha256="):
        return False
    expected = b"sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest().encode()
    return hmac.compare_digest(expected, header.encode("ascii", "replace"))


@dataclass(frozen=True)
class Receipt:
    status: str  # queued | duplicate | ignored | pong
    reason: str


class WebhookReceiver:
    """The endpoint's use case: refuse what is not GitHub's or not ours, queue the rest."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store

    def verify(self, body: bytes, signature: str | None) -> None:
        secret = self.settings.webhooks.resolved_secret()
        if secret is None:
            raise NotFound("webhooks are not configured: set webhooks.secret")
        if not signature:
            raise AuthError("unsigned delivery: X-Hub-Signature-256 is missing")
        if not signature_ok(secret, body, signature):
            raise AuthError("X-Hub-Signature-256 does not match the body and the webhook secret")

    async def accept(self, event: str, delivery: str, body: bytes) -> Receipt:
        """Called with a verified body; refuses repositories not served before touching Redis."""
        if not event or not delivery or len(delivery) > 100:
            raise InvalidRequest("X-GitHub-Event and X-GitHub-Delivery (<= 100 chars) are needed")
        try:
            text = body.decode("utf-8")
            payload = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError included
            raise InvalidRequest(f"the delivery body is not UTF-8 JSON: {e}") from e
        except RecursionError as e:
            raise InvalidRequest("the delivery body is JSON nested too deep") from e
        if not isinstance(payload, dict):
            raise InvalidRequest("the delivery body must be a JSON object")
        repository = payload.get("repository")
        full_name = str(repository.get("full_name") or "") if isinstance(repository, dict) else ""
        if event == "ping" and not full_name:
            return Receipt("pong", "ping from a GitHub App webhook")
        repo = self.settings.repository(full_name) or next(
            (r for r in self.settings.repositories if r.full_name.lower() == full_name.lower()),
            None,
        )
        if repo is None:
            raise NotFound(f"repository {full_name or '(none)'} is not served by this broker")
        rstore = self.store.repo(repo.full_name)
        if event == "ping":
            await rstore.mark_webhooks_seen()
            return Receipt("pong", "webhook reachable")
        if event not in EVENTS:
            return Receipt("ignored", f"event {event!r} is not used by the broker")
        check_shape(event, payload)
        envelope = json.dumps(
            {"event": event, "delivery": delivery, "received_ms": int(time.time() * 1000)}
        )
        # The raw body follows the envelope line untouched: no re-encoding on the hot path.
        queued = await rstore.enqueue_webhook(
            delivery, envelope + "\n" + text, self.settings.webhooks.delivery_ttl_s
        )
        if not queued:
            return Receipt("duplicate", f"delivery {delivery} was handled already")
        return Receipt("queued", f"{event} queued")
