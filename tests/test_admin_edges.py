"""The small edges of the people's API: audit queries with any valid value, strict booleans,
control characters stripped where texts enter and shown escaped on the page, one orientation
for agent tokens, and lease signing keys that do not hang on the admin token."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from github_broker.errors import ConfigError
from github_broker.settings import Settings, load_settings
from github_broker.store import Store
from github_broker.store.tokens import Grant, Signer
from tests.test_api import app_factory, sim  # noqa: F401  (fixtures)

ADMIN = {"Authorization": "Bearer boss-token"}
AGENT = {"Authorization": "Bearer t1-0123456789abcdef"}
TOKENS = {"admin_token": "boss-token", "agent_tokens": {"a1": "t1-0123456789abcdef"}}


@pytest.fixture
def c(app_factory: Callable[..., TestClient]) -> Iterator[TestClient]:  # noqa: F811
    with app_factory(server=TOKENS, leases={"settle_grace_s": 0}) as client:
        yield client


def claim(c: TestClient) -> dict[str, Any]:
    r = c.post("/request-task", json={"agent_id": "a1"}, headers=AGENT)
    assert r.status_code == 200, r.text
    task: dict[str, Any] = r.json()
    return task


def test_audit_pages_answer_200_for_every_valid_before_ms(c: TestClient) -> None:
    task = claim(c)
    note = f"/admin/tasks/acme/widgets/{task['issue_id']}/note"
    assert c.post(note, json={"text": "hello"}, headers=ADMIN).status_code == 200
    for before in (0, 1, 2**53):
        r = c.get(f"/admin/audit?before_ms={before}", headers=ADMIN)
        assert r.status_code == 200, (before, r.text)
    assert c.get("/admin/audit?before_ms=0", headers=ADMIN).json() == []
    assert len(c.get(f"/admin/audit?before_ms={2**53}", headers=ADMIN).json()) == 1


@pytest.mark.parametrize("hold", ['"yes"', '"true"', "1", "0", '"1"'])
def test_a_boolean_that_is_not_true_or_false_is_refused(c: TestClient, hold: str) -> None:
    task = claim(c)
    r = c.post(
        f"/admin/tasks/acme/widgets/{task['issue_id']}/revoke",
        content=f'{{"reason": "x", "hold": {hold}}}',
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert r.status_code == 422 and "hold" in r.json()["detail"]
    beat = c.post(
        f"/tasks/acme/widgets/{task['issue_id']}/heartbeat",
        json={"agent_id": "a1", "token": task["lease"]["token"]},
        headers=AGENT,
    )
    assert beat.status_code == 200  # nothing was revoked


def test_control_characters_are_stripped_where_texts_enter_and_escaped_on_the_page(
    c: TestClient, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    task = claim(c)
    raw = "stop\x1b[2J now\x00 \u202eevil\r\nline two\tend"
    note = f"/admin/tasks/acme/widgets/{task['issue_id']}/note"
    r = c.post(note, json={"text": raw}, headers=ADMIN)
    assert r.status_code == 200
    beat = c.post(
        f"/tasks/acme/widgets/{task['issue_id']}/heartbeat",
        json={"agent_id": "a1", "token": task["lease"]["token"]},
        headers=AGENT,
    )
    assert [n["text"] for n in beat.json()["notes"]] == ["stop[2J now evil\nline two\tend"]
    # An entry written before texts were cleaned (or by anything else) shows escaped.
    asyncio.run(_old_entry(make_settings(redis={"url": redis_url}), "\x1b[31mred\u202e"))
    assert c.post("/ui/login", data={"token": "boss-token"}).status_code == 200
    page = c.get("/ui").text
    assert "\\u001b[31mred\\u202e" in page and "\x1b" not in page and "\u202e" not in page


async def _old_entry(settings: Settings, reason: str) -> None:
    store = Store.from_settings(settings)
    try:
        await store.record_audit("4:old-admin", "pause_broker", reason=reason, outcome="paused")
    finally:
        await store.close()


def test_an_agent_tokens_file_written_token_to_agent_is_refused_at_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yml"
    tokens.write_text("0123456789abcdef0123456789abcdef: claude-1\n")
    (tmp_path / "broker.yaml").write_text(f"server:\n  agent_tokens_file: {tokens}\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(tmp_path)
    message = str(refused.value)
    assert str(tokens) in message and "agent id -> token" in message and "swap" in message
    assert "0123456789abcdef0123456789abcdef" not in message  # a token is never quoted
    tokens.write_text("claude-1: 0123456789abcdef0123456789abcdef\n")
    assert load_settings(tmp_path).server.resolved_agent_tokens() == {
        "0123456789abcdef0123456789abcdef": "claude-1"
    }


def test_signing_keys_do_not_change_with_the_admin_token(
    make_settings: Callable[..., Settings],
) -> None:
    before = make_settings(server={"admin_token": "first-admin-token"})
    after = make_settings(server={"admin_token": "rotated-admin-token"})
    keys = before.leases.resolved_signing_keys(before.server)
    assert keys and next(iter(keys)) != "admin"  # a generated key signs, not the admin's
    signed = Signer(keys, 3600)
    grant = Grant("acme/widgets", 1, "a1", "development", 1000, 2000)
    token = signed.token("nonce", grant)
    # The admin token rotated: the same generated key still signs and verifies.
    rotated = Signer(after.leases.resolved_signing_keys(after.server), 3600)
    assert rotated.verify(token) == grant


def test_a_start_without_a_signing_key_says_leases_are_unsigned(
    app_factory: Callable[..., TestClient],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="github_broker.api.app"), app_factory():
        pass
    assert any("lease tokens are unsigned" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="github_broker.api.app"), app_factory(server=TOKENS):
        pass
    assert not any("unsigned" in r.getMessage() for r in caplog.records)
    assert any("lease tokens are signed with key" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ("alice:\n  token_sha256: {a}\n  repositories: [acme/gadgets]\n", "does not serve"),
        ("alice:\n  token_sha256: {a}\n", "needs `repositories"),
        ("alice:\n  token_sha256: nope\n  repositories: [acme/widgets]\n", "token_sha256"),
        (
            "alice:\n  token_sha256: {a}\n  authority: admin\nbob:\n  token_sha256: {a}\n"
            "  authority: admin\n",
            "two people share one token",
        ),
        ("admin:\n  token_sha256: {a}\n  authority: admin\n", "rename them, or drop admin_token"),
        ("broker:\n  token_sha256: {a}\n  authority: admin\n", "not a usable name"),
    ],
)
def test_a_wrong_maintainers_file_stops_start_up_naming_the_file_and_the_fix(
    make_settings: Callable[..., Settings], tmp_path: Path, entries: str, says: str
) -> None:
    file = tmp_path / "maintainers.yml"
    file.write_text(entries.format(a="ab" * 32))
    with pytest.raises(ConfigError) as refused:
        make_settings(server={"maintainers_file": str(file), "admin_token": "boss-token"})
    assert str(file) in str(refused.value) and says in str(refused.value)
