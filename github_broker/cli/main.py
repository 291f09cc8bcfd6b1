"""`github-broker` command line: short functions that call the library."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from github_broker import __version__, logs
from github_broker.cli import target
from github_broker.cli.common import add_command
from github_broker.errors import BrokerError, ConfigError
from github_broker.settings import ENV_PREFIX, Settings, default_config_dir

if TYPE_CHECKING:
    from github_broker.gateway import GitHubGateway
    from github_broker.store import Store

logger = logging.getLogger("github_broker")


def _require_github_auth(settings: Settings) -> None:
    github = settings.github
    if github.app_id is None and not github.resolved_token():
        raise ConfigError(
            "no GitHub credentials: set GITHUB_TOKEN (or "
            f"{ENV_PREFIX}GITHUB__TOKEN, github.token_file, or a GitHub App in broker.yaml)"
        )


def cmd_sync(args: argparse.Namespace) -> int:
    """One sync pass over every configured repository."""
    from github_broker.gateway import GitHubGateway
    from github_broker.leader.sync import Syncer
    from github_broker.store import Store

    settings = target.configured(args)
    target.require_repositories(settings)
    _require_github_auth(settings)

    async def run() -> None:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            syncer = Syncer(settings, store, gateway)
            for repo in settings.repositories:
                if args.repo and repo.full_name != args.repo:
                    continue
                total = await _expected_issues(store, gateway, repo.full_name)
                with logs.progress_bar(total, repo.full_name) as bar:

                    def progress(_repository: str, _page: int, seen: int) -> None:
                        bar.total = max(bar.total or 0, seen)
                        bar.update(seen - bar.n)

                    report = await syncer.sync(
                        repo, full=True if args.full else None, progress=progress
                    )
                    # GitHub's open count includes pull requests: end the bar at what was seen.
                    bar.total = bar.n
                print(report.summary())
        finally:
            await store.close()
            await asyncio.to_thread(gateway.close)

    asyncio.run(run())
    return 0


async def _expected_issues(store: Store, gateway: GitHubGateway, full_name: str) -> int | None:
    """The bar's total: the issues mirrored last time, else GitHub's open count (with PRs)."""
    mirrored = len(await store.repo(full_name).open_numbers())
    if mirrored:
        return mirrored
    try:
        info = await asyncio.to_thread(gateway.repository, full_name)
    except BrokerError:
        return None  # the sync itself reports what is wrong
    count = info.get("open_issues_count")
    return int(count) if isinstance(count, int) else None


def cmd_poll(args: argparse.Namespace) -> int:
    """The polling daemon (sync, write queue, lease reaping) until SIGINT/SIGTERM."""
    from github_broker.processes.poller import run_poller

    run_poller(target.configured(args), metrics_port=args.metrics_port)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """The HTTP API (and, unless disabled, the polling daemon) under uvicorn."""
    from github_broker.processes.serve import serve

    return serve(
        args.config,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        log_format=args.log_format,
        access_log=args.access_log,
        single_process=args.single_process,
    )


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def cmd_status(args: argparse.Namespace) -> int:
    """Who holds what until when, what waits, what is skipped and why."""
    from github_broker.reports import status
    from github_broker.store import Store

    settings = target.broker_settings(args)

    async def run() -> dict[str, Any]:
        store = Store.from_settings(settings)
        try:
            return await status.status(store, settings)
        finally:
            await store.close()

    if args.json:
        _print(asyncio.run(run()))
        return 0
    print(_render_status(settings))
    return 0


def _render_status(settings: Settings) -> str:
    from github_broker.reports import overview, render
    from github_broker.store import Store

    async def run() -> str:
        store = Store.from_settings(settings)
        try:
            return render.status_text(await overview.overview(store, settings))
        finally:
            await store.close()

    return asyncio.run(run())


def cmd_explain(args: argparse.Namespace) -> int:
    """What an agent with the given roles would get, and why not each other issue."""
    from github_broker.reports import overview, render
    from github_broker.store import Store

    settings = target.broker_settings(args)
    if args.repo and args.repo not in {r.full_name for r in settings.repositories}:
        raise ConfigError(f"--repo {args.repo}: not a configured repository")

    async def run() -> list[overview.Explained]:
        store = Store.from_settings(settings)
        try:
            return await overview.explained(
                store, settings, args.role or None, args.repo, agent_id=args.agent
            )
        finally:
            await store.close()

    rows = None if args.all else render.ROWS_SHOWN
    print(render.explain_text(asyncio.run(run()), issue=args.issue, rows=rows))
    return 0


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config directory: broker.yaml, agents.yml, prompts/ (default: "
        f"{default_config_dir()}); give it before the command",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="least severe log lines shown (default %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        default=logs.default_format(),
        choices=logs.FORMATS,
        help=f"log lines as text or JSON (default: ${logs.FORMAT_ENV} or text)",
    )
    parser.add_argument("--version", action="version", version=f"github-broker {__version__}")


def _add_broker_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The broker's own commands: sync, poll, serve, status, explain."""
    _add_running_commands(sub)
    _add_reading_commands(sub)


def _add_running_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """sync, poll and serve: the commands that run the broker's work."""
    p = add_command(sub, "sync", cmd_sync)
    p.add_argument("--full", action="store_true", help="full pass (catches deletions)")
    p.add_argument("--repo", help="only this owner/name")
    p = add_command(sub, "poll", cmd_poll)
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve this process's Prometheus metrics (GitHub calls, write lag) on this port",
    )
    p = add_command(sub, "serve", cmd_serve)
    p.add_argument("--host", help="address to bind (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default: server.port, 8080)")
    p.add_argument("--workers", type=int, default=1, help="API worker processes")
    p.add_argument(
        "--single-process",
        action="store_true",
        help="API and poller in this one process (debugging, profiling); ignores --workers",
    )
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")


def _add_reading_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """status and explain: what maintainers read, from a running broker or the sandbox."""
    sandbox_help = target.SANDBOX_HELP
    p = add_command(sub, "status", cmd_status)
    p.epilog = target.FINDS_BROKER
    p.add_argument("--json", action="store_true", help="the /status JSON instead of tables")
    p.add_argument("--sandbox", action="store_true", help=sandbox_help)
    p = add_command(sub, "explain", cmd_explain)
    p.epilog = target.FINDS_BROKER
    p.add_argument("--agent", help="the agent asking (its cool-downs, pause, reviews of its work)")
    p.add_argument("--sandbox", action="store_true", help=sandbox_help)
    p.add_argument("--role", action="append", help="a role the agent accepts (repeatable)")
    p.add_argument("--repo", help="only this owner/name")
    p.add_argument("--issue", type=int, help="only this issue number")
    p.add_argument(
        "--all", action="store_true", help="list every issue, not the first of each group"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="github-broker",
        description="Hands GitHub issues to AI coding agents as leased tasks.",
    )
    _add_global_options(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_broker_commands(sub)
    from github_broker.agent.runner.cli import add_agent_command
    from github_broker.gateway.label_set import add_labels_command
    from github_broker.sandbox.cli import add_sandbox_command

    add_agent_command(sub)
    from github_broker.agent.mcp_cli import add_mcp_command

    add_mcp_command(sub)
    add_sandbox_command(sub)
    add_labels_command(sub)
    from github_broker.cli.steer import add_steer_commands

    add_steer_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    try:
        code = int(args.func(args))
        if not sys.stdout.closed:  # `mcp` over stdio: its transport closed stdout at EOF
            sys.stdout.flush()  # a reader that left shows up here, inside this handler
        return code
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly like other Unix tools. Point stdout at
        # /dev/null so the flush at exit does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except ConfigError as e:
        print(f"github-broker: {e}", file=sys.stderr)
        return 2
    except BrokerError as e:
        print(f"github-broker: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
