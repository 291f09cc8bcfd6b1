"""What the CLI's commands share: a subcommand made from its function; and for the steering
verbs, run on Redis here or sent through a broker's API (remote.py), naming an issue and
printing the audit log."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import Any

from github_broker.errors import ConfigError
from github_broker.settings import Settings

#: `owner/name#12`, or `12` when one repository is configured.
_REF = re.compile(r"^(?:(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#)?(?P<n>[1-9][0-9]{0,15})$")


def issue_ref(text: str, settings: Settings) -> tuple[str, int]:
    """`owner/name#12` (or `12` with one repository) as (repository, number)."""
    m = _REF.match(text)
    if m is None:
        raise ConfigError(f"{text!r}: name the issue as owner/name#12 (or 12 with one repository)")
    repo = m.group("repo")
    if repo is None:
        names = [r.full_name for r in settings.repositories]
        if len(names) != 1:
            listed = f" ({', '.join(names[:5])}{', …' if len(names) > 5 else ''})" if names else ""
            raise ConfigError(
                f"{text!r}: {len(names)} repositories are served{listed}; name the issue as "
                "owner/name#N"
            )
        repo = names[0]
    return repo, int(m.group("n"))


def print_audit(entries: list[Any], *, as_json: bool) -> None:
    """Audit entries as text lines (or JSON), newest first."""
    from github_broker.clock import iso_from_ms

    if as_json:
        print(json.dumps([e.model_dump() for e in entries], indent=2, ensure_ascii=False))
        return
    if not entries:
        print("the audit log is empty: no maintainer or broker action yet")
    for e in entries:
        where = f"{e.repository}#{e.issue}" if e.issue else (e.repository or "broker")
        who = f" {e.agent}" if e.agent else ""
        why = f" ({e.reason})" if e.reason else ""
        print(
            f"{iso_from_ms(e.at_ms)}  {e.actor:<16} {e.action:<14} {where}{who}{why}: {e.outcome}"
        )


def add_command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], **options: Any
) -> argparse.ArgumentParser:
    """Subcommand `name` running `func`: its help and description are `func`'s docstring."""
    doc = (func.__doc__ or "").strip()
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=doc.splitlines()[0], description=doc, **options
    )
    p.set_defaults(func=func)
    return p
