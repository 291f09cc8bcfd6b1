"""The `mcp` subcommand's options; the MCP SDK is imported only when the command runs."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from github_broker.agent.runner import AGENT_ENV, TOKEN_ENV, URL_ENV

#: Environment variable of --admin-token (only `explain` uses it).
ADMIN_TOKEN_ENV = "GITHUB_BROKER_ADMIN_TOKEN"

EPILOG = """\
examples:
  github-broker mcp --agent-id claude-1 --role BACKENDCODER
  claude mcp add broker -e GITHUB_BROKER_AGENT_TOKEN=... -- github-broker mcp --agent-id claude-1
  github-broker mcp --agent-id codex-1 --transport http --port 8765   # http://127.0.0.1:8765/mcp
"""


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the broker's task calls as MCP tools for one agent (stdio or streamable HTTP)."""
    import anyio

    from github_broker.agent.aio import AsyncBrokerClient
    from github_broker.agent.mcp_server import build_server, serve
    from github_broker.agent.session import AgentSession

    # One INFO line per broker call would drown the server's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def run() -> None:
        client = AsyncBrokerClient(args.broker_url, args.agent_id, token=args.token)
        explainer = None
        if args.admin_token:
            explainer = AsyncBrokerClient(args.broker_url, args.agent_id, token=args.admin_token)
        session = AgentSession(client)
        mcp = build_server(
            session,
            explainer=explainer,
            roles=args.role or None,
            repositories=args.repository or None,
            host=args.host,
            port=args.port,
        )
        await serve(session, mcp, args.transport, explainer)

    try:
        anyio.run(run)
    except KeyboardInterrupt:
        print("github-broker mcp: stopped", file=sys.stderr)
    return 0


def add_mcp_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `mcp` on a parser's subcommands."""
    p = subparsers.add_parser(
        "mcp",
        help="serve the broker's task calls as MCP tools for one agent",
        description="An MCP server (stdio or streamable HTTP) with the tools request_task, "
        "heartbeat, complete, release and explain, and the held task as a resource. It renews "
        "the lease while a task is held and tells the client when the broker takes it back.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--broker-url",
        default=os.environ.get(URL_ENV, "http://127.0.0.1:8080"),
        help=f"broker base URL (env {URL_ENV}; default %(default)s)",
    )
    agent_id = os.environ.get(AGENT_ENV)
    p.add_argument(
        "--agent-id",
        default=agent_id,
        required=agent_id is None,
        help=f"this agent's id, also a GitHub label (env {AGENT_ENV})",
    )
    p.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"agent bearer token (env {TOKEN_ENV})"
    )
    p.add_argument(
        "--admin-token",
        default=os.environ.get(ADMIN_TOKEN_ENV),
        help=f"token for the explain tool; the broker answers /explain to its admin token "
        f"(env {ADMIN_TOKEN_ENV})",
    )
    p.add_argument("--role", action="append", help="default role for request_task (repeatable)")
    p.add_argument("--repository", action="append", help="default owner/name (repeatable)")
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP transport address")
    p.add_argument("--port", type=int, default=8765, help="HTTP transport port (path /mcp)")
    p.set_defaults(func=cmd_mcp)
    return p
