"""`POST /github/webhook`: GitHub's signed deliveries, verified, queued and answered at once."""

from __future__ import annotations

import contextlib
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from github_broker.api.routes import Services
from github_broker.errors import (
    BODY_LIMIT_RESPONSE,
    BrokerError,
    InvalidRequest,
    Problem,
    StoreUnavailable,
)
from github_broker.webhooks.receiver import FORM, WebhookReceiver, note_refusal

logger = logging.getLogger(__name__)
router = APIRouter(responses=BODY_LIMIT_RESPONSE)


class WebhookAnswer(BaseModel):
    """What happened to a delivery: queued (202), or duplicate / ignored / pong (200)."""

    status: Literal["queued", "duplicate", "ignored", "pong"]
    reason: str


async def _capped_body(request: Request, limit: int) -> bytes | None:
    """The raw body, or None as soon as it exceeds `limit` bytes (never read it all)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


#: The two content types GitHub sends (a webhook's `content_type`: json, or form by default).
REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "application/json": {"schema": {"type": "object"}},
        FORM: {
            "schema": {
                "type": "object",
                "properties": {"payload": {"type": "string", "description": "the JSON"}},
                "required": ["payload"],
            }
        },
    },
}


async def _verify(
    svc: Services,
    receiver: WebhookReceiver,
    body: bytes,
    signature: str | None,
    event: str,
    delivery: str,
    source: str,
) -> None:
    """The signature checked; a refusal is logged, and noted for the integrations' health."""
    try:
        receiver.verify(body, signature)
    except BrokerError as e:
        reported = note_refusal(e, event, delivery, source, signature=True)
        if reported:
            # Refused before it was trusted (a secret set on one side only): the integrations'
            # health shows it. Recorded with the log line, at most once a minute, so forged
            # deliveries cause no Redis work of their own.
            with contextlib.suppress(BrokerError):
                await svc.store.record_webhook_refused(str(e), reported)
        raise


@router.post(
    "/github/webhook",
    status_code=202,
    response_model=WebhookAnswer,
    responses={
        200: {"model": WebhookAnswer, "description": "Duplicate, ignored event, or ping."},
        **{code: {"model": Problem} for code in (401, 404, 413, 422, 503)},
    },
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def github_webhook(
    request: Request,
    svc: Services,
    x_github_event: Annotated[str, Header()] = "",
    x_github_delivery: Annotated[str, Header()] = "",
    x_hub_signature_256: Annotated[str | None, Header()] = None,
) -> Any:
    """GitHub webhook receiver (HMAC-SHA256 signed; JSON or GitHub's default form encoding);
    the update is applied after answering."""
    receiver = WebhookReceiver(svc.settings, svc.store)
    limit = svc.settings.webhooks.max_body_bytes
    body = await _capped_body(request, limit)
    source = request.client.host if request.client else "unknown"
    if body is None:
        too_large = InvalidRequest(f"larger than {limit} bytes")
        note_refusal(too_large, x_github_event, x_github_delivery, source, signature=False)
        return JSONResponse(
            {"detail": f"delivery larger than {limit} bytes", "reason": "too_large"},
            status_code=413,
        )
    await _verify(
        svc, receiver, body, x_hub_signature_256, x_github_event, x_github_delivery, source
    )
    try:
        content_type = request.headers.get("content-type", "application/json")
        receipt = await receiver.accept(x_github_event, x_github_delivery, body, content_type)
    except StoreUnavailable:
        raise  # not the delivery's fault: the error table logs it
    except BrokerError as e:
        note_refusal(e, x_github_event, x_github_delivery, source, signature=False)
        raise
    return JSONResponse(
        {"status": receipt.status, "reason": receipt.reason},
        status_code=202 if receipt.status == "queued" else 200,
    )
