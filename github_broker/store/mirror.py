"""The issue mirror: what the sync writes and what it reads back (issues, the work
index and bucket, skipped issues, sync cursors)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from github_broker.clock import iso_from_ms, now_ms
from github_broker.models import Issue, SkipReason
from github_broker.store.base import RepoBase
from github_broker.store.connection import as_text, awaited, translate_errors


@dataclass
class UpsertResult:
    """What one sync_upsert.lua call did; `suspects` maps an issue to the lease labels that
    vanished from GitHub (the caller asks GitHub who removed them)."""

    written: int = 0
    readied: int = 0
    revoked: int = 0
    adopted: int = 0
    suspects: dict[int, list[str]] = field(default_factory=dict)
    restored: int = 0
    #: Agents whose lease on an issue of this batch was adopted (sync_upsert.lua).
    holders: list[str] = field(default_factory=list)


class IssueMirror(RepoBase):
    """What the sync writes, and the mirrored issues and indexes read back."""

    @translate_errors
    async def sync_issues(self, items: list[dict[str, Any]], *, epoch: int = 0) -> UpsertResult:
        """Write issues and their index entries (sync_upsert.lua), fenced by `epoch`."""
        if not items:
            return UpsertResult()
        res = await self._run("sync_upsert", json.dumps(items), iso_from_ms(now_ms()), epoch)
        suspects = json.loads(as_text(res[4]))
        return UpsertResult(
            written=int(res[0]),
            readied=int(res[1]),
            revoked=int(res[2]),
            adopted=int(res[3]),
            # cjson writes an empty list as {}.
            suspects={int(s["n"]): list(s["missing"]) for s in (suspects if suspects else [])},
            restored=int(res[5]),
            holders=list(json.loads(as_text(res[6])) or []),
        )

    async def upsert_issues(
        self, items: list[dict[str, Any]], *, epoch: int = 0
    ) -> tuple[int, int, int, int]:
        """Write issues and their index entries; returns (written, readied, revoked, adopted)."""
        r = await self.sync_issues(items, epoch=epoch)
        return r.written, r.readied, r.revoked, r.adopted

    @translate_errors
    async def remove_issues(self, numbers: list[int], *, epoch: int = 0) -> tuple[int, int]:
        if not numbers:
            return 0, 0
        removed, revoked = await self._run("sync_remove", json.dumps(numbers), epoch)
        return int(removed), int(revoked)

    @translate_errors
    async def open_numbers(self) -> set[int]:
        return {int(n) for n in await awaited(self.client.smembers(self.keys.open))}

    @translate_errors
    async def open_numbers_of(self, numbers: list[int]) -> set[int]:
        """Those of `numbers` that are mirrored open issues (one SMISMEMBER)."""
        if not numbers:
            return set()
        flags = await awaited(self.client.smismember(self.keys.open, [str(n) for n in numbers]))
        return {n for n, f in zip(numbers, flags, strict=True) if f}

    @translate_errors
    async def sync_state(self) -> dict[str, str]:
        raw = await awaited(self.client.hgetall(self.keys.sync))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    @translate_errors
    async def save_sync_state(
        self,
        values: dict[str, str],
        *,
        pages: dict[str, str] | None = None,
        drop_pages: list[str] | None = None,
        rebuilt: str | bool = "",
        epoch: int = 0,
        hold_back_ms: int = 0,
        was_complete: bool = False,
    ) -> int:
        """Cursors (small, read every pass) and full-pass page data (read by full passes).
        `rebuilt`: the `full_started` cursor of the full pass that just finished; the mirror
        is marked complete if it is still there (True: mark it regardless, for tests that
        fill Redis by hand). A rebuild after a loss (`was_complete`, or leases adopted from
        labels) holds new hand-outs back for `hold_back_ms` in the same step (sync_save.lua).
        Returns the hold-back set (ms). Fenced by `epoch`."""
        if rebuilt is True:
            rebuilt = "seeded"
            values = {**(values or {}), "full_started": rebuilt}
        held = await self._run(
            "sync_save",
            json.dumps(values or {}),
            json.dumps(pages or {}),
            json.dumps(drop_pages or []),
            rebuilt or "",
            epoch,
            hold_back_ms,
            "1" if was_complete else "",
        )
        return int(held)

    @translate_errors
    async def mark_sync_failing(self, reason: str | None, ttl_s: float, kind: str = "") -> None:
        """The leader's sync of this repository failed (reason; `kind` of failure, for what to
        do about it) or passed again (None); the first failure's time is kept while it keeps
        failing."""
        if reason is None:
            await self.client.delete(self.keys.sync_failing)
            return
        since = (await self.sync_failing_since()) or now_ms()
        value = json.dumps({"reason": reason[:500], "since_ms": since, "kind": kind})
        await self.client.set(self.keys.sync_failing, value, ex=max(1, int(ttl_s)))

    @translate_errors
    async def sync_failing_since(self) -> int | None:
        """When the sync started failing (ms), while it fails."""
        raw = await awaited(self.client.get(self.keys.sync_failing))
        return _failing(raw)[1] if raw else None

    @translate_errors
    async def sync_failing(self) -> str | None:
        """Why the leader's sync of this repository keeps failing, while it does."""
        raw = await awaited(self.client.get(self.keys.sync_failing))
        return _failing(raw)[0] if raw else None

    @translate_errors
    async def sync_failing_kind(self) -> str:
        """The kind of failure (health.failure_kind) while the sync fails; "" unknown."""
        raw = await awaited(self.client.get(self.keys.sync_failing))
        if not raw:
            return ""
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(as_text(raw)).get("kind") or "")
        return ""

    @translate_errors
    async def mirror_rebuilt(self) -> bool:
        """Whether a complete sync pass has rebuilt the mirror since Redis last lost it."""
        return bool(await awaited(self.client.exists(self.keys.mirror)))

    async def check_server(self, run_id: str, mark: str, last_mark: str | None) -> bool:
        """Record that this repository's data lives on the redis-server `run_id`, with a new
        `mark`. If it was last checked on another server (Redis restarted and loaded a
        persistence file, or failed over to a replica), the data may be older than GitHub,
        unless it holds `last_mark`, the mark this process wrote at its last check: then the
        file was written after it (a shutdown's save, `appendfsync always`) and the data is
        kept. Otherwise all of it is dropped, the mirror marker first (claims answer
        'rebuilding' from then on), so that the leader rebuilds it from GitHub as after a
        total loss. The old record stays until every other key is gone: a drop cut short is
        taken up again by the next check. True if dropped."""
        recorded = await self._recorded_server()
        stale = (
            recorded is not None
            and recorded[0] != run_id
            and (last_mark is None or recorded[1] != last_mark)
        )
        if stale:
            await self._forget_mirror()
            cursor = 0
            while True:  # one bounded call per page: a large mirror outlasts one call's bound
                cursor = await self._drop_page(cursor)
                if cursor == 0:
                    break
        await self._record_server(run_id, mark)
        return stale

    @translate_errors
    async def _recorded_server(self) -> tuple[str, str] | None:
        raw = await awaited(self.client.get(self.keys.server))
        if raw is None:
            return None
        run_id, _, mark = as_text(raw).partition(" ")
        return run_id, mark

    @translate_errors
    async def _record_server(self, run_id: str, mark: str) -> None:
        await self.client.set(self.keys.server, f"{run_id} {mark}")

    @translate_errors
    async def _forget_mirror(self) -> None:
        await self.client.delete(self.keys.mirror)

    @translate_errors
    async def _drop_page(self, cursor: int) -> int:
        """Delete one SCAN page of this repository's keys (they share its prefix), all but
        the server id; returns the next cursor (0: done)."""
        pattern = _glob_escape(self.keys.base) + "*"
        cursor, keys = await self.client.scan(cursor, match=pattern, count=1000)
        server = self.keys.server.encode()
        doomed = [k for k in keys if (k if isinstance(k, bytes) else k.encode()) != server]
        if doomed:
            await self.client.unlink(*doomed)
        return int(cursor)

    @translate_errors
    async def sync_pages(self) -> dict[str, str]:
        raw = await awaited(self.client.hgetall(self.keys.sync_pages))
        return {as_text(k): as_text(v) for k, v in raw.items()}

    @translate_errors
    async def get_issue(self, number: int) -> Issue | None:
        raw = await awaited(self.client.get(self.keys.issue(number)))
        return Issue.model_validate_json(raw) if raw else None

    @translate_errors
    async def get_issues(self, numbers: list[int]) -> list[Issue]:
        """The cached issues of `numbers` that are cached (one MGET)."""
        return [i for i in (await self.cached_issues(numbers)).values() if i is not None]

    @translate_errors
    async def cached_issues(self, numbers: list[int]) -> dict[int, Issue | None]:
        """The cached issue of each number (None where `issue:{n}` is missing): one MGET."""
        if not numbers:
            return {}
        raws = await self.client.mget([self.keys.issue(n) for n in numbers])
        return {
            n: Issue.model_validate_json(r) if r else None
            for n, r in zip(numbers, raws, strict=True)
        }

    @translate_errors
    async def default_branch(self) -> str | None:
        raw = await awaited(self.client.hget(self.keys.sync, "default_branch"))
        return as_text(raw) if raw else None

    @translate_errors
    async def bucket(self) -> int | None:
        top = await self.client.zrange(self.keys.work, 0, 0, withscores=True)
        return int(top[0][1]) if top else None

    @translate_errors
    async def work_priorities(self) -> dict[int, int]:
        return {
            int(m): int(s)
            for m, s in await self.client.zrange(self.keys.work, 0, -1, withscores=True)
        }

    @translate_errors
    async def skipped(self) -> dict[int, SkipReason]:
        raw = await awaited(self.client.hgetall(self.keys.skipped))
        return {int(k): SkipReason.model_validate_json(v) for k, v in raw.items()}


def _failing(raw: Any) -> tuple[str, int | None]:
    """`sync:failing` as (reason, since ms); plain text from before the since was kept."""
    text = as_text(raw)
    try:
        data = json.loads(text)
    except ValueError:
        return text, None
    if not isinstance(data, dict):
        return text, None
    return str(data.get("reason", "")), data.get("since_ms")


def _glob_escape(text: str) -> str:
    """`text` matched literally by a Redis SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
