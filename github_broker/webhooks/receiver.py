"""The webhook receiver (serve side): verify a delivery's signature, refuse what is not
ours, de-duplicate and queue it for the leader's worker. No poller or GitHub import here."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from github_broker.errors import AuthError, BrokerError, InvalidRequest, NotFound
from github_broker.settings import Repository, Settings
from github_broker.store import RepoStore, Store
from github_broker.webhooks.payloads import EVENTS, check_shape

logger = logging.getLogger(__name__)

#: Seconds between two log lines about refused deliveries (the others are counted).
REFUSAL_LOG_INTERVAL_S = 60.0
#: GitHub's default content type for a new webhook: the JSON in a `payload` form field.
FORM = "application/x-www-form-urlencoded"


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


class RefusalLog:
    """Refused deliveries (a wrong secret, a repository not served, a body we cannot read) as
    warnings, at most one per `interval_s`, each saying how many it stands for: a flood of
    forged deliveries must not flood the log, and a misconfigured secret must not be silent."""

    def __init__(
        self,
        interval_s: float = REFUSAL_LOG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._held = 0

    def note(self, error: BrokerError, event: str, delivery: str, source: str) -> int:
        """Log the refusal unless one was logged within `interval_s`; returns how many
        refusals the line stands for (0: none written, this one is held for the next)."""
        with self._lock:
            now = self._clock()
            if now - self._last < self.interval_s:
                self._held += 1
                return 0
            held, self._held, self._last = self._held, 0, now
        more = f" ({held} more refused since the last report)" if held else ""
        logger.warning(
            "webhook delivery %s (%s) from %s refused: %s%s",
            delivery[:100] or "(no id)",
            event[:50] or "no event",
            source,
            error,
            more,
        )
        return held + 1


#: One pair per process, every request's receiver reports to them: deliveries refused for
#: their signature (no secret configured, a missing or wrong one), and the others (a
#: repository not served, a body the broker cannot read, one too large), counted apart.
SIGNATURE_REFUSALS = RefusalLog()
REFUSALS = RefusalLog()


def note_refusal(
    error: BrokerError, event: str, delivery: str, source: str, *, signature: bool
) -> int:
    """Report a refused delivery to the process's rate-limited logs (see RefusalLog.note)."""
    log = SIGNATURE_REFUSALS if signature else REFUSALS
    return log.note(error, event, delivery, source)


def payload_text(body: bytes, content_type: str) -> str:
    """The delivery's JSON text: the body itself, or for GitHub's default content type
    (`application/x-www-form-urlencoded`) its `payload` field. The signature covers the raw
    body either way."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"the delivery body is not UTF-8: {e}") from e
    if content_type.split(";")[0].strip().lower() != FORM:
        return text
    fields = parse_qs(text, keep_blank_values=True, max_num_fields=10)
    values = fields.get("payload")
    if not values or len(values) != 1:
        raise InvalidRequest(
            "a form-encoded delivery carries its JSON in one `payload` field; none was found"
        )
    return values[0]


def payload_object(text: str) -> dict[str, Any]:
    """The delivery's JSON object, or a clear refusal."""
    try:
        payload = json.loads(text)
    except ValueError as e:
        raise InvalidRequest(f"the delivery payload is not JSON: {e}") from e
    except RecursionError as e:
        raise InvalidRequest("the delivery body is JSON nested too deep") from e
    if not isinstance(payload, dict):
        raise InvalidRequest("the delivery body must be a JSON object")
    return payload


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

    async def accept(
        self, event: str, delivery: str, body: bytes, content_type: str = "application/json"
    ) -> Receipt:
        """Called with a verified body; refuses repositories not served before touching Redis."""
        if not event or not delivery or len(delivery) > 100:
            raise InvalidRequest("X-GitHub-Event and X-GitHub-Delivery (<= 100 chars) are needed")
        text = payload_text(body, content_type)
        payload = payload_object(text)
        repository = payload.get("repository")
        full_name = str(repository.get("full_name") or "") if isinstance(repository, dict) else ""
        if event == "ping" and not full_name:
            return await self._ping_without_repository(payload)
        rstore = self.store.repo(self._served(full_name).full_name)
        if event == "ping":
            await rstore.mark_webhooks_seen()
            return Receipt("pong", "webhook reachable")
        if event not in EVENTS:
            return Receipt("ignored", f"event {event!r} is not used by the broker")
        check_shape(event, payload)
        return await self._enqueue(rstore, event, delivery, body, text)

    def _served(self, full_name: str) -> Repository:
        """The served repository a delivery names (GitHub's spelling may differ in case)."""
        repo = self.settings.repository(full_name) or next(
            (r for r in self.settings.repositories if r.full_name.lower() == full_name.lower()),
            None,
        )
        if repo is None:
            raise NotFound(f"repository {full_name or '(none)'} is not served by this broker")
        return repo

    async def _enqueue(
        self, rstore: RepoStore, event: str, delivery: str, body: bytes, text: str
    ) -> Receipt:
        """Queue the delivery for the leader's worker, once per delivery id and per body."""
        envelope = json.dumps(
            {"event": event, "delivery": delivery, "received_ms": int(time.time() * 1000)}
        )
        # The raw body follows the envelope line untouched: no re-encoding on the hot path.
        outcome = await rstore.enqueue_webhook(
            delivery,
            hashlib.sha256(body).hexdigest(),
            envelope + "\n" + text,
            self.settings.webhooks.delivery_ttl_s,
        )
        if outcome == "duplicate":
            return Receipt("duplicate", f"delivery {delivery} was handled already")
        if outcome == "replay":
            return Receipt(
                "duplicate", "this signed body was delivered before under another delivery id"
            )
        return Receipt("queued", f"{event} queued")

    async def _ping_without_repository(self, payload: dict[str, Any]) -> Receipt:
        """A ping names no repository for an organization's webhook (`hook.type` Organization,
        with `organization`) and for a GitHub App's (`hook.type` App, `hook.app_id`)."""
        hook = payload.get("hook") if isinstance(payload.get("hook"), dict) else {}
        assert isinstance(hook, dict)
        org = payload.get("organization")
        login = str(org.get("login") or "") if isinstance(org, dict) else ""
        if hook.get("type") == "App" or (not login and "app_id" in hook):
            return Receipt("pong", "ping from a GitHub App webhook")
        if not login:
            return Receipt("pong", "ping from a webhook that names no repository")
        served = [r for r in self.settings.repositories if r.owner.lower() == login.lower()]
        if not served:
            raise NotFound(f"organization {login} has no repository served by this broker")
        for repo in served:
            await self.store.repo(repo.full_name).mark_webhooks_seen()
        return Receipt(
            "pong",
            f"organization webhook of {login} reachable ({len(served)} repositories served)",
        )
