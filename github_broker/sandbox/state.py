"""Where a running sandbox says how to reach it, so `status`, `explain` and the steering
verbs can reach it.

The sandbox keeps its Redis in its own process (fakeredis); it serves that store on a
loopback port and writes this file, and the CLI builds the sandbox's settings from it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunningSandbox:
    pid: int
    #: The broker API.
    url: str
    #: The simulated GitHub.
    github_url: str
    #: A Redis URL another process can open (the in-process store served on loopback).
    redis_url: str
    port: int


def state_path() -> Path:
    """`$XDG_RUNTIME_DIR/github-broker-sandbox.json`, else in the temporary directory with the
    user id in its name (one sandbox per user: the last one started is the one shown)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "github-broker-sandbox.json"
    return Path(tempfile.gettempdir()) / f"github-broker-sandbox-{os.getuid()}.json"


def write(state: RunningSandbox) -> Path:
    path = state_path()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state)))
    tmp.replace(path)
    return path


def remove(pid: int) -> None:
    """Remove the file if it still names process `pid` (a later sandbox may own it now)."""
    found = read()
    if found is not None and found.pid == pid:
        with contextlib.suppress(OSError):
            state_path().unlink()


def read() -> RunningSandbox | None:
    """The sandbox the file names, if its process is still alive."""
    try:
        state = RunningSandbox(**json.loads(state_path().read_text()))
    except (OSError, ValueError, TypeError):
        return None
    try:
        os.kill(state.pid, 0)
    except ProcessLookupError:
        return None  # it died without cleaning up
    except PermissionError:
        pass  # alive, someone else's: its port tells
    return state
