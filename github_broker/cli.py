"""`github-broker` command line: short functions that call the library."""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from github_broker.errors import BrokerError, ConfigError
from github_broker.settings import Settings, default_config_dir, load_settings

logger = logging.getLogger("github_broker")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Seconds serve lets in-flight requests finish after SIGTERM before closing them.
SHUTDOWN_GRACE_S = 5


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(args.config)


def _progress(repository: str, page: int, seen: int) -> None:
    if sys.stderr.isatty():
        print(
            f"\r{repository}: page {page}, {seen} open issues", end="", file=sys.stderr, flush=True
        )
    elif page % 10 == 0:
        print(f"{repository}: page {page}, {seen} open issues", file=sys.stderr, flush=True)


def cmd_sync(args: argparse.Namespace) -> int:
    """One sync pass over every configured repository."""
    from github_broker.gateway import GitHubGateway
    from github_broker.store import Store
    from github_broker.sync import Syncer

    settings = _settings(args)
    if not settings.repositories:
        raise ConfigError(
            "no repositories configured: set `repositories` in broker.yaml "
            "or GITHUB_BROKER_REPOSITORIES=owner/name"
        )

    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            syncer = Syncer(settings, store, gateway)
            for repo in settings.repositories:
                if args.repo and repo.full_name != args.repo:
                    continue
                report = await syncer.sync(
                    repo, full=True if args.full else None, progress=_progress
                )
                if sys.stderr.isatty():
                    print(file=sys.stderr)
                print(report.summary())
        finally:
            await store.close()
            await asyncio.to_thread(gateway.close)

    asyncio.run(run())
    return 0


def cmd_poll(args: argparse.Namespace) -> int:
    """The polling daemon (sync, write queue, lease reaping) until SIGINT/SIGTERM."""
    from github_broker.gateway import GitHubGateway
    from github_broker.poller import Daemon
    from github_broker.store import Store

    settings = _settings(args)

    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            await Daemon(settings, store, gateway).run_forever()
        finally:
            await store.close()
            await asyncio.to_thread(gateway.close)

    asyncio.run(run())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP API (and, unless disabled, the polling daemon) under uvicorn."""
    import os

    import uvicorn

    settings = _settings(args)  # fail fast, before workers start
    host = args.host or settings.server.host
    port = args.port if args.port is not None else settings.server.port
    if args.config:
        os.environ["GITHUB_BROKER_CONFIG_DIR"] = str(args.config)
    if host != settings.server.host:
        os.environ["GITHUB_BROKER_SERVER__HOST"] = host
        load_settings(args.config)  # the loopback-without-auth rule applies to --host too
    from github_broker.api.protocol import NoDelayH11Protocol

    uvicorn.run(
        "github_broker.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=args.workers,
        http=NoDelayH11Protocol,
        log_config=_uvicorn_logging(args.log_level),
        log_level=args.log_level.lower(),
        access_log=args.access_log,
        # Long-polls are answered at once on SIGTERM (ReadyWaker.close): what is left are
        # short calls, well inside an orchestrator's grace period.
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    return 0


def _uvicorn_logging(level: str) -> dict[str, Any]:
    """uvicorn's logging plus the broker's own loggers; applied in every worker process."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["broker"] = {"format": LOG_FORMAT}
    config["handlers"]["broker"] = {
        "formatter": "broker",
        "class": "logging.StreamHandler",
        "stream": "ext://sys.stderr",
    }
    config["loggers"]["github_broker"] = {
        "handlers": ["broker"],
        "level": level,
        "propagate": False,
    }
    return config


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def cmd_status(args: argparse.Namespace) -> int:
    """Who holds what until when, what waits, what is skipped and why."""
    from github_broker import status
    from github_broker.store import Store

    settings = _settings(args)

    async def run() -> dict[str, Any]:
        store = Store.from_settings(settings)
        try:
            return await status.status(store)
        finally:
            await store.close()

    data = asyncio.run(run())
    if args.json:
        _print(data)
        return 0
    for repo in data["repositories"]:
        bucket = "none" if repo["bucket"] is None else f"P{repo['bucket']}"
        print(
            f"{repo['repository']}  bucket {bucket}  ready {repo['ready_by_priority'] or '{}'}  "
            f"pending GitHub writes {repo['pending_github_writes']}"
        )
        for lease in repo["leases"]:
            print(
                f"  held  #{lease['issue']:<6} {lease['task_type']:<12} {lease['agent_id']:<20} "
                f"until {lease['expires_at']}"
            )
        for number, reason in repo["skipped"].items():
            print(f"  skip  #{number:<6} {reason['code']}: {reason['reason']}")
    quota = data["github_quota"]
    if quota:
        print(f"GitHub quota: {quota['remaining']}/{quota['limit']}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """What an agent with the given roles would get, and why not each other issue."""
    from github_broker import status
    from github_broker.store import Store

    settings = _settings(args)

    async def run() -> dict[str, list[Any]]:
        store = Store.from_settings(settings)
        try:
            return {
                name: await status.explain(rstore, settings, args.role or None)
                for name, rstore in store.repos.items()
            }
        finally:
            await store.close()

    for name, verdicts in asyncio.run(run()).items():
        print(name)
        for v in verdicts:
            prio = "-" if v.priority is None else f"P{v.priority}"
            print(f"  #{v.issue:<6} {prio:<4} {v.verdict:<15} {v.detail}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="github-broker",
        description="Hands GitHub issues to AI coding agents as leased tasks.",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config directory (default: {default_config_dir()})",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=(func.__doc__ or "").strip().splitlines()[0])
        p.set_defaults(func=func)
        return p

    p = add("sync", cmd_sync)
    p.add_argument("--full", action="store_true", help="full pass (catches deletions)")
    p.add_argument("--repo", help="only this owner/name")
    add("poll", cmd_poll)
    p = add("serve", cmd_serve)
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--access-log", action="store_true")
    p = add("status", cmd_status)
    p.add_argument("--json", action="store_true")
    p = add("explain", cmd_explain)
    p.add_argument("--role", action="append", help="a role the agent accepts (repeatable)")
    from github_broker.runner import add_agent_command
    from github_broker.sandbox import add_labels_command, add_sandbox_command

    add_agent_command(sub)
    add_sandbox_command(sub)
    add_labels_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format=LOG_FORMAT)
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"github-broker: {e}", file=sys.stderr)
        return 2
    except BrokerError as e:
        print(f"github-broker: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
