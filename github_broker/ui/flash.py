"""The one-shot message an action leaves for the page it redirects to (post/redirect/get): a
short-lived cookie read and cleared by the next page."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import Response

COOKIE = "github_broker_flash"
#: Seconds the message waits for the page it was meant for.
FLASH_TTL_S = 60
#: Longest message kept (characters): a cookie holds about 4 kB.
FLASH_MAX = 1500


@dataclass
class Flash:
    ok: bool
    text: str


def leave(response: Response, request: Request, ok: bool, text: str) -> None:
    raw = json.dumps({"ok": ok, "text": text[:FLASH_MAX]}).encode()
    response.set_cookie(
        COOKIE,
        base64.urlsafe_b64encode(raw).decode(),
        max_age=FLASH_TTL_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/ui",
    )


def take(request: Request) -> Flash | None:
    """The message waiting for this page, if any (the page clears it with `clear`)."""
    value = request.cookies.get(COOKIE)
    if not value:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value.encode()))
        return Flash(bool(data["ok"]), str(data["text"])[:FLASH_MAX])
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


def clear(response: Response, request: Request) -> None:
    if request.cookies.get(COOKIE):
        response.delete_cookie(COOKIE, path="/ui")
