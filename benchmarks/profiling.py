"""Summaries of a pyinstrument session of the serve process: where the CPU time goes."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
from pyinstrument.session import Session

#: Leaf functions that mean "the event loop is waiting", not work.
IDLE_LEAVES = frozenset({"select", "poll", "epoll", "_run_once"})
#: Inclusive share (% of busy time) above which a frame is scaffolding, not a cost centre.
SPINE_PCT = 90.0
_SITE = re.compile(r"site-packages/([^/]+)/")
_STDLIB = re.compile(r"/lib/python3\.\d+/([^/]+?)(?:\.py$|/)")


def _package(path: str) -> str:
    if "github_broker/" in path and "site-packages" not in path:
        return "github_broker"
    found = _SITE.search(path)
    if found:
        return found.group(1)
    found = _STDLIB.search(path)
    return f"stdlib {found.group(1)}" if found else (path.rsplit("/", 1)[-1] or "?")


def _frame(info: str) -> tuple[str, str, str]:
    """(function, file, package) of one pyinstrument frame string."""
    identifier = info.split("\x01", 1)[0]
    parts = identifier.split("\x00")
    function = parts[0]
    path = parts[1] if len(parts) > 1 else ""
    return function, path, _package(path)


def _label(function: str, path: str) -> str:
    short = path.split("site-packages/")[-1]
    short = short.split("/work/main/")[-1] if "/work/main/" in short else short
    return f"{function} ({short.rsplit('/lib/', 1)[-1]})"


def summarise(session: Session, top: int = 15) -> dict[str, Any]:
    """Self time per package and per function, inclusive time per function (idle excluded)."""
    total = idle = 0.0
    by_package: dict[str, float] = defaultdict(float)
    by_self: dict[str, float] = defaultdict(float)
    inclusive: dict[str, float] = defaultdict(float)
    broker_inclusive: dict[str, float] = defaultdict(float)
    for stack, seconds in session.frame_records:
        total += seconds
        frames = [_frame(info) for info in stack]
        if not frames:
            continue
        leaf_fn, leaf_path, leaf_pkg = frames[-1]
        if leaf_fn in IDLE_LEAVES or leaf_fn.startswith("[await]") or leaf_fn == "[self]":
            idle += seconds
            continue
        by_package[leaf_pkg] += seconds
        by_self[_label(leaf_fn, leaf_path)] += seconds
        seen = {_label(fn, path) for fn, path, _ in frames}
        for label in seen:
            inclusive[label] += seconds
        for label in {_label(fn, path) for fn, path, pkg in frames if pkg == "github_broker"}:
            broker_inclusive[label] += seconds
    busy = total - idle

    def pct(seconds_by: dict[str, float]) -> list[tuple[str, float]]:
        # Frames under (nearly) every sample are the spine (runpy, uvicorn.run, the loop).
        ordered = sorted(seconds_by.items(), key=lambda item: -item[1])
        shares = [(name, round(100 * s / busy, 1)) for name, s in ordered]
        return [(n, p) for n, p in shares if p < SPINE_PCT][:top] if busy else []

    return {
        "sampled_s": round(total, 2),
        "busy_s": round(busy, 2),
        "idle_pct": round(100 * idle / total, 1) if total else 0.0,
        "self_by_package_pct_of_busy": pct(by_package),
        "self_by_function_pct_of_busy": pct(by_self),
        "inclusive_pct_of_busy": pct(inclusive),
        "github_broker_inclusive_pct_of_busy": pct(broker_inclusive),
    }


def render(session_path: Path) -> dict[str, Any]:
    """Write .html and .txt next to the session file; return the summary."""
    session = Session.load(session_path)
    html = session_path.with_suffix(".html")
    text = session_path.with_suffix(".txt")
    html.write_text(HTMLRenderer().render(session), encoding="utf-8")
    text.write_text(
        ConsoleRenderer(unicode=False, color=False, short_mode=False).render(session),
        encoding="utf-8",
    )
    summary = summarise(session)
    summary["files"] = [str(session_path), str(html), str(text)]
    return summary
