"""The steering verbs as a named person, through the broker's API (`--broker-url` with your
token in `GITHUB_BROKER_TOKEN` or `--token`), instead of as an administrator holding Redis:
the broker checks the token, names the person in the audit log and refuses (403, audited) what
their rights do not cover."""

from __future__ import annotations

import argparse
import os
from typing import Any
from urllib.parse import quote

import requests

from github_broker.errors import (
    AuthError,
    BrokerError,
    ConfigError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    StoreUnavailable,
)
from github_broker.settings import load_settings

#: Where the broker is, and the person's token, when not given as options.
URL_ENV = "GITHUB_BROKER_URL"
TOKEN_ENV = "GITHUB_BROKER_TOKEN"
#: Seconds one API call may take.
TIMEOUT_S = 30.0
_ERRORS: dict[int, type[BrokerError]] = {
    401: AuthError,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: InvalidRequest,
}


def add_options(p: argparse.ArgumentParser) -> None:
    """`--broker-url` and `--token` on a steering verb."""
    p.add_argument(
        "--broker-url",
        default=os.environ.get(URL_ENV),
        help=f"act through this broker's API as the person the token names (${URL_ENV})",
    )
    p.add_argument(
        "--token",
        default=None,
        help=f"your token for --broker-url (default: ${TOKEN_ENV}; an option shows in ps)",
    )


def wanted(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "broker_url", None))


def run(args: argparse.Namespace) -> int:
    """Run `args.command` through the API; print what it did, as the local verbs do."""
    method, path, body = _request(args)
    answer = _call(args, method, path, body)
    if args.command == "audit":
        from github_broker.cli.common import print_audit
        from github_broker.models import AuditEntry

        print_audit([AuditEntry.model_validate(e) for e in answer], as_json=args.json)
        return 0
    print(f"{answer['action']} {answer['target']}: {answer['outcome']}")
    return 0


def _issue_path(args: argparse.Namespace, verb: str) -> str:
    from github_broker.cli.common import issue_ref

    text = args.issue
    if "#" in text:
        repository, _, number = text.partition("#")
        if not number.isdigit():
            raise ConfigError(f"{text!r}: name the issue as owner/name#12")
    else:
        try:
            repository, n = issue_ref(text, load_settings(args.config))
        except ConfigError as e:
            raise ConfigError(f"{e} (with --broker-url, name the issue as owner/name#N)") from e
        number = str(n)
    owner, _, name = repository.partition("/")
    return f"/admin/tasks/{quote(owner, safe='')}/{quote(name, safe='')}/{number}/{verb}"


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    verb, reason = args.command, getattr(args, "reason", "")
    if verb == "audit":
        return "GET", f"/admin/audit?limit={int(args.limit)}", None
    if verb == "revoke":
        return "POST", _issue_path(args, verb), {"reason": reason, "hold": bool(args.hold)}
    if verb == "reassign":
        return "POST", _issue_path(args, verb), {"agent_id": args.agent, "reason": reason}
    if verb == "note":
        return "POST", _issue_path(args, verb), {"text": args.text}
    if verb == "retry":
        return "POST", _issue_path(args, verb), {"reason": reason}
    if verb == "stop":
        return "POST", f"/admin/agents/{quote(args.agent, safe='')}/stop", {"reason": reason}
    if args.all:
        return "POST", f"/admin/broker/{verb}", {"reason": reason}
    if args.repo:
        owner, _, name = args.repo.partition("/")
        repo = f"{quote(owner, safe='')}/{quote(name, safe='')}"
        return "POST", f"/admin/repos/{repo}/{verb}", {"reason": reason}
    if not args.agent:
        raise ConfigError("name an agent, or --repo owner/name, or --all")
    return "POST", f"/admin/agents/{quote(args.agent, safe='')}/{verb}", {"reason": reason}


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None) -> Any:
    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError(f"--broker-url needs your token: set {TOKEN_ENV} (or --token)")
    url = args.broker_url.rstrip("/") + path
    try:
        r = requests.request(
            method,
            url,
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=TIMEOUT_S,
        )
    except requests.RequestException as e:
        raise StoreUnavailable(f"the broker at {args.broker_url} cannot be reached ({e})") from e
    if r.status_code < 400:
        return r.json()
    try:
        detail = str(r.json().get("detail", r.text))
    except ValueError:
        detail = r.text[:500]
    raise _ERRORS.get(r.status_code, StoreUnavailable)(f"{r.status_code}: {detail}")
