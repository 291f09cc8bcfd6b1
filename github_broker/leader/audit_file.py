"""The audit log's long-term copy: the leader appends every new entry of every audit stream
(the deployment's and each repository's) to `audit.file` as JSON lines.

Redis keeps a bounded audit log (`audit.max_entries` per stream); the file keeps everything.
The last id appended per stream is kept in Redis, so a new leader goes on where the last one
stopped (give every poller the same path on shared storage, or run one). An entry is appended
before its id is recorded: a leader killed in between appends it once more after a restart
(at least once, never lost while Redis keeps it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from github_broker.clock import iso_from_ms
from github_broker.models import AuditEntry
from github_broker.store import Store

logger = logging.getLogger(__name__)


def line(entry: AuditEntry) -> str:
    data = {"at": iso_from_ms(entry.at_ms), **entry.model_dump(exclude={"at_ms"})}
    return json.dumps(data, ensure_ascii=False, sort_keys=True)


class AuditFile:
    """Appends new audit entries to one JSONL file."""

    def __init__(self, path: Path, store: Store) -> None:
        self.path = path
        self.store = store

    async def append_new(self) -> int:
        """Append what was added since the last pass; returns how many entries."""
        written = 0
        for key, _after, entries in await self.store.audit_export():
            text = "".join(line(e) + "\n" for e in entries)
            await asyncio.to_thread(self._append, text)
            await self.store.audit_exported(key, entries[-1].id)
            written += len(entries)
        return written

    def _append(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
