"""`github-broker agent`: its options, the runner's own signals, and the command itself."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from github_broker.agent.client import BrokerClient, BrokerClientError
from github_broker.agent.presets import PRESETS
from github_broker.agent.runner.config import (
    DEFAULT_GIVE_UP_S,
    DEFAULT_KILL_GRACE_S,
    DEFAULT_WAIT_S,
    RunnerConfig,
    RunnerError,
)
from github_broker.agent.runner.loop import Runner
from github_broker.agent.workspace import DEFAULT_CLONE_URL, Workspaces

logger = logging.getLogger(__name__)

#: Environment variables the `agent` options default to.
TOKEN_ENV, URL_ENV, AGENT_ENV = (
    "GITHUB_BROKER_AGENT_TOKEN",
    "GITHUB_BROKER_URL",
    "GITHUB_BROKER_AGENT_ID",
)

AGENT_EPILOG = """\
The command gets the prompt on its stdin and these environment variables:
  GB_AGENT_ID GB_REPOSITORY GB_ISSUE_ID GB_ISSUE_URL GB_TITLE GB_BRANCH GB_BASE_BRANCH
  GB_TASK_TYPE GB_ROLE GB_PR_URL GB_PROMPT_FILE GB_TASK_FILE GB_TASK_JSON
  GB_NOTES_FILE (maintainers' notes appear there, .broker-notes.md in its directory)
  GB_USAGE_FILE (write {"tokens": N, "cost": X} so far; sent with each heartbeat)
Exit 0 completes the task; any other exit releases it as failed. Several arguments after
`--` are run as they are; a single one goes through the shell. Its last line of output is
sent with each heartbeat as the progress note maintainers see.

examples:
  github-broker agent --agent-id claude-1 --preset claude --workspace ~/gb-work
  github-broker agent --agent-id claude-1 --workdir ~/src/app -- claude -p
  github-broker agent --agent-id bot-1 --role TESTER -- './work.sh "$GB_BRANCH" < "$GB_PROMPT_FILE"'
"""


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[list[int]]:
    """SIGINT/SIGTERM set `stop`: the runner stops the command, releases the task and returns.

    Yields the list of signals received. A second signal quits at once (KeyboardInterrupt).
    """
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        received.append(signum)
        stop.set()
        logger.warning(
            "%s: stopping after the current step (send it again to quit at once)",
            signal.Signals(signum).name,
        )

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def command_from_argv(argv: Sequence[str]) -> Sequence[str] | str:
    """The words after `--`: several run as argv, a single one through the shell."""
    words = list(argv[1:] if argv and argv[0] == "--" else argv)
    return words[0] if len(words) == 1 else words


def config_from_args(args: argparse.Namespace) -> RunnerConfig:
    """The runner's configuration from `agent`'s parsed options."""
    preset = PRESETS[args.preset] if args.preset else None
    words = args.agent_command[1:] if args.agent_command[:1] == ["--"] else args.agent_command
    workspaces = None
    if args.workspace:
        workspaces = Workspaces(args.workspace.expanduser(), args.clone_url)
    return RunnerConfig(
        command=list(words) if preset else command_from_argv(args.agent_command),
        preset=preset,
        workspaces=workspaces,
        workdir=args.workdir,
        timeout_s=args.timeout,
        roles=tuple(args.role or ()),
        repositories=tuple(args.repository or ()),
        once=args.once,
        wait_s=args.wait,
        kill_grace_s=args.kill_grace,
        give_up_s=args.give_up_after,
    )


def cmd_agent(args: argparse.Namespace) -> int:
    """Run an agent command on tasks from a broker until stopped."""
    config = config_from_args(args)
    try:
        config.check()
    except RunnerError as e:
        print(f"github-broker agent: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    with (
        BrokerClient(args.broker_url, args.agent_id, token=args.token) as client,
        stop_on_signals(stop) as received,
    ):
        logger.info(
            "%s asking %s for tasks (roles %s)",
            args.agent_id,
            args.broker_url,
            ", ".join(config.roles) or "any",
        )
        try:
            code = Runner(client, config, stop).run()
        except (RunnerError, BrokerClientError) as e:
            print(f"github-broker agent: {type(e).__name__}: {e}", file=sys.stderr)
            return 2 if isinstance(e, RunnerError) else 1
    # The shell convention for "stopped by signal N".
    return 128 + received[0] if received else code


def add_agent_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register `agent` on a parser's subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        help="run an agent command on tasks from a broker",
        description="Ask a broker for tasks and run an agent command on each, heartbeating "
        "while it runs and reporting how it ended.",
        epilog=AGENT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_identity_options(p)
    _add_command_options(p)
    _add_limit_options(p)
    p.add_argument(
        "agent_command",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the agent command and its arguments",
    )
    p.set_defaults(func=cmd_agent)
    return p


def _add_identity_options(p: argparse.ArgumentParser) -> None:
    """Which broker, as which agent, for which work."""
    add_broker_options(p)
    p.add_argument("--role", action="append", help="a role this agent accepts (repeatable)")
    p.add_argument("--repository", action="append", help="only this owner/name (repeatable)")


def add_broker_options(p: argparse.ArgumentParser) -> None:
    """Which broker, as which agent (`agent` and `mcp` alike)."""
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


def _add_command_options(p: argparse.ArgumentParser) -> None:
    """What runs on each task, and where."""
    p.add_argument("--workdir", type=Path, default=Path("."), help="where the command runs")
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="run this coding CLI with the task's prompt; words after `--` are added to it",
    )
    p.add_argument(
        "--workspace",
        type=Path,
        metavar="DIR",
        help="run each task in a git worktree on its branch under DIR (one clone per repository)",
    )
    p.add_argument(
        "--clone-url",
        default=DEFAULT_CLONE_URL,
        help="clone URL template with {repository}, {owner}, {name} (default %(default)s)",
    )
    p.add_argument("--once", action="store_true", help="take one task, report it and exit")


def _add_limit_options(p: argparse.ArgumentParser) -> None:
    """How long to wait, to let run, and to keep asking."""
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop the command after this long and release the task as failed",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help="long-poll of each task request, 0-60 (default %(default)s)",
    )
    p.add_argument(
        "--kill-grace",
        type=float,
        default=DEFAULT_KILL_GRACE_S,
        metavar="SECONDS",
        help="time between SIGTERM and SIGKILL (default %(default)s)",
    )
    p.add_argument(
        "--give-up-after",
        type=float,
        default=DEFAULT_GIVE_UP_S,
        metavar="SECONDS",
        help="stop when the broker has been unreachable for this many seconds, counted from "
        "the first failed request, its retries included (default %(default)s)",
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m github_broker.agent.runner agent ...`: the same command without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m github_broker.agent.runner")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    add_agent_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
