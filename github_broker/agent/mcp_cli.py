"""The `mcp` subcommand's options and start-up checks; the MCP SDK is imported only when the
command runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from github_broker.agent.runner.cli import add_broker_options
from github_broker.agent.session import DEFAULT_CHECK_INTERVAL_S

#: Environment variable of --admin-token (only `explain` uses it).
ADMIN_TOKEN_ENV = "GITHUB_BROKER_ADMIN_TOKEN"
#: Environment variable of the bearer token the HTTP transport requires (see --mcp-token-file).
MCP_TOKEN_ENV = "GITHUB_BROKER_MCP_TOKEN"
#: Bounds of --check-interval (seconds): faster is a heartbeat storm, slower a stale client.
CHECK_INTERVAL_RANGE = (1.0, 60.0)

if TYPE_CHECKING:
    from github_broker.agent.mcp_http import HttpEndpoint

EPILOG = f"""\
examples:
  github-broker mcp --agent-id claude-1 --role BACKENDCODER
  claude mcp add broker -e GITHUB_BROKER_AGENT_TOKEN=... -- github-broker mcp --agent-id claude-1
  github-broker mcp --agent-id codex-1 --transport http --port 8765   # http://127.0.0.1:8765/mcp
  {MCP_TOKEN_ENV}=$(openssl rand -hex 32) \\
    github-broker mcp --agent-id codex-1 --transport http --host 0.0.0.0 --allowed-host box.lan
"""


def agent_id_problem(agent_id: str, roles: list[str], config_dir: Path | None = None) -> str | None:
    """Why the broker would refuse `agent_id` (its pattern, or a label it equals), or None.

    The labels are those of the broker configuration this process can read (as `serve` would
    load it here), else the defaults; `roles` (--role) count as labels too."""
    from github_broker.errors import ConfigError
    from github_broker.settings import AGENT_ID_RE, LabelNames, label_clash, load_settings

    if not AGENT_ID_RE.match(agent_id):
        return (
            f"agent id {agent_id!r} is not usable as a GitHub label: use 1-50 characters from "
            "A-Z a-z 0-9 . _ -, starting with a letter or digit"
        )
    try:
        settings = load_settings(config_dir)
        labels, known_roles = settings.labels, settings.roles
    except ConfigError:
        labels, known_roles = LabelNames(), []
    clash = label_clash(agent_id, labels, [*known_roles, *roles])
    if clash is None:
        return None
    return (
        f"agent id {agent_id!r} equals the label {clash} when compared case-insensitively, as "
        "GitHub compares labels (the broker refuses it); pick another id"
    )


def http_token(args: argparse.Namespace) -> str | None:
    if args.mcp_token_file is not None:
        try:
            return Path(args.mcp_token_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SystemExit(f"github-broker mcp: --mcp-token-file: {e.strerror}") from e
    return os.environ.get(MCP_TOKEN_ENV) or None


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the broker's task calls as MCP tools for one agent (stdio or streamable HTTP)."""
    problem = _arguments_problem(args)
    if problem is not None:
        print(f"github-broker mcp: {problem}", file=sys.stderr)
        return 2
    from github_broker.agent.mcp_http import EndpointRefused, HttpEndpoint

    http = None
    if args.transport == "http":
        http = HttpEndpoint(args.host, args.port, http_token(args), tuple(args.allowed_host or ()))
        try:
            http.check()
        except EndpointRefused as e:
            print(f"github-broker mcp: {e}", file=sys.stderr)
            return 2
    _quiet_libraries()
    try:
        _serve(args, http)
    except KeyboardInterrupt:
        print("github-broker mcp: stopped", file=sys.stderr)
    return 0


def _arguments_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the agent id, its roles or the check interval, if anything."""
    problem = agent_id_problem(args.agent_id, args.role or [], getattr(args, "config", None))
    if problem is not None:
        return problem
    low, high = CHECK_INTERVAL_RANGE
    if not low <= args.check_interval <= high:
        return f"--check-interval {args.check_interval:g} is outside {low:g}..{high:g} seconds"
    return None


def _quiet_libraries() -> None:
    from mcp import MCPDeprecationWarning

    # Pre-2026 clients (most in use) learn of a lost lease by a log message, a feature the
    # 2026-07-28 revision deprecates; the SDK warns about it on every use.
    warnings.filterwarnings("ignore", category=MCPDeprecationWarning)
    # One INFO line per call (httpx's requests, the SDK's sessions and refused arguments)
    # would drown the server's own log.
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        for name in ("httpx", "mcp"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _serve(args: argparse.Namespace, http: HttpEndpoint | None) -> None:
    """One agent's session served until interrupted."""
    import anyio

    from github_broker.agent.aio import AsyncBrokerClient
    from github_broker.agent.mcp_server import build_server, serve
    from github_broker.agent.session import AgentSession

    async def run() -> None:
        client = AsyncBrokerClient(args.broker_url, args.agent_id, token=args.token)
        explainer = None
        if args.admin_token:
            explainer = AsyncBrokerClient(args.broker_url, args.agent_id, token=args.admin_token)
        session = AgentSession(client, check_interval_s=args.check_interval)
        mcp = build_server(
            session,
            explainer=explainer,
            roles=args.role or None,
            repositories=args.repository or None,
        )
        await serve(session, mcp, http, explainer)

    anyio.run(run)


def add_mcp_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register `mcp` on a parser's subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "mcp",
        help="serve the broker's task calls as MCP tools for one agent",
        description="An MCP server (stdio or streamable HTTP) with the tools request_task, "
        "heartbeat, complete, release and explain, and the held task as a resource. It checks "
        "(and so renews) the lease every few seconds while a task is held and tells the client "
        "when the broker takes it back.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_broker_options(p)
    _add_default_options(p)
    _add_transport_options(p)
    p.set_defaults(func=cmd_mcp)
    return p


def _add_broker_options(p: argparse.ArgumentParser) -> None:
    """Which broker, as which agent."""
    add_broker_options(p)
    p.add_argument(
        "--admin-token",
        default=os.environ.get(ADMIN_TOKEN_ENV),
        help=f"token for the explain tool; the broker answers /explain to its admin token "
        f"(env {ADMIN_TOKEN_ENV})",
    )


def _add_default_options(p: argparse.ArgumentParser) -> None:
    """request_task's defaults, and how often the held task is checked."""
    p.add_argument("--role", action="append", help="default role for request_task (repeatable)")
    p.add_argument("--repository", action="append", help="default owner/name (repeatable)")
    p.add_argument(
        "--check-interval",
        type=float,
        default=DEFAULT_CHECK_INTERVAL_S,
        metavar="SECONDS",
        help="how often the held task's lease is checked (a heartbeat); a lost lease reaches "
        "the client within about this long (default %(default)g)",
    )


def _add_transport_options(p: argparse.ArgumentParser) -> None:
    """stdio, or streamable HTTP and who may reach it."""
    p.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (the MCP client starts this command) or http (a server at --host/--port); "
        "default %(default)s",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP transport address; beyond loopback only with a bearer token",
    )
    p.add_argument("--port", type=int, default=8765, help="HTTP transport port (path /mcp)")
    p.add_argument(
        "--mcp-token-file",
        metavar="PATH",
        help=f"file holding the bearer token every HTTP request must carry (or env "
        f"{MCP_TOKEN_ENV}); required for a --host beyond loopback",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name clients use to reach the HTTP transport (repeatable); loopback, the "
        "--host address and this machine's names are always allowed",
    )
