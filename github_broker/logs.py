"""Logging of every command: text or JSON lines on stderr, written by a background thread.

A log call only puts the record on a queue (`QueueHandler`); a `QueueListener` thread
formats and writes it, so logging on the request path never waits on the terminal. Library
chatter (APScheduler's "Running job ...", once per job per second) is kept at WARNING
unless DEBUG is asked for.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import os
import queue
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

#: Structured fields a log call may pass with `extra=`; JSON lines carry them as keys.
FIELDS = ("repository", "issue", "agent", "task")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Environment variable read when `--log-format` is not given.
FORMAT_ENV = "GITHUB_BROKER_LOG_FORMAT"
#: Loggers that talk at INFO about routine work; raised to WARNING unless level is DEBUG.
CHATTY = ("apscheduler",)

_listener: logging.handlers.QueueListener | None = None
_progress: Any = None  # the live tqdm bar, if any: log lines are printed above it


def log_fields(
    repository: str, issue: int | None = None, agent: str | None = None, task: str | None = None
) -> dict[str, Any]:
    """`extra=` of a log call about one repository, issue, agent or task."""
    return {"repository": repository, "issue": issue, "agent": agent, "task": task}


def default_format() -> str:
    fmt = os.environ.get(FORMAT_ENV, "text").lower()
    return fmt if fmt in FORMATS else "text"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=str)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]  # generic in typeshed only
    """Writes to whatever `sys.stderr` is now (tests swap it), above a live progress bar."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        bar = _progress
        if bar is None:
            super().emit(record)
            return
        try:
            bar.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


class _Prepared(logging.handlers.QueueHandler):
    """Keeps the record's exception for the formatter at the other end of the queue."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.message = record.getMessage()
        record.msg, record.args = record.message, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None
        return record


def formatter(fmt: str) -> logging.Formatter:
    # The queue drops exc_info but keeps exc_text, which both formatters print.
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def queued_handler(fmt: str = "text") -> logging.Handler:
    """A QueueHandler whose listener thread writes to stderr; replaces any earlier one.

    Also a `logging.config.dictConfig` factory (`"()"`), which is how every uvicorn worker
    process gets the same setup."""
    global _listener
    if _listener is not None:
        _listener.stop()
    out = StderrHandler()
    out.setFormatter(formatter(fmt))
    q: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(q, out, respect_handler_level=False)
    _listener.start()
    return _Prepared(q)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """Root logger -> queue -> stderr, at `level`; for every CLI command."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, logging.handlers.QueueHandler)]:
        root.removeHandler(old)
    root.addHandler(queued_handler(fmt))
    root.setLevel(level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(level if level == "DEBUG" else "WARNING")


def flush() -> None:
    """Write out everything queued so far (the listener keeps running)."""
    if _listener is not None:
        _listener.stop()
        _listener.start()


@atexit.register
def _stop() -> None:
    if _listener is not None:
        _listener.stop()


def uvicorn_config(level: str, fmt: str) -> dict[str, Any]:
    """`log_config` for uvicorn: its loggers and ours through the queue, in every worker."""
    chatty = level if level == "DEBUG" else "WARNING"
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"queue": {"()": "github_broker.logs.queued_handler", "fmt": fmt}},
        "root": {"handlers": ["queue"], "level": level},
        "loggers": {
            "uvicorn": {"level": level},
            **{name: {"level": chatty} for name in CHATTY},
        },
    }


@contextmanager
def progress_bar(total: int | None, description: str) -> Iterator[Any]:
    """A tqdm bar on stderr (a TTY only) with total and ETA; log lines print above it."""
    global _progress
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        desc=description,
        unit="issue",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
        leave=True,
        dynamic_ncols=True,
    )
    _progress = bar if not bar.disable else None
    try:
        yield bar
    finally:
        _progress = None
        bar.close()
