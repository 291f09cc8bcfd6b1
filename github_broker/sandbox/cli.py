"""`github-broker sandbox`: the command line of the offline sandbox (world.py holds
the world it runs), its event log and banner."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from github_broker.agent.runner import stop_on_signals
from github_broker.errors import BrokerError, ConfigError
from github_broker.gateway.label_set import add_labels_command
from github_broker.sandbox.servers import SandboxError, port_free
from github_broker.sandbox.world import SANDBOX_OWNER, SANDBOX_REPO, Options, Sandbox

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8080
#: Loggers whose lines make the event log.
EVENT_LOGGERS = (
    "github_broker.agent.runner",
    __name__,
    "github_broker.sandbox.world",
    "github_broker.sandbox.watch",
    "github_broker.sandbox.maintainer",
)


@contextlib.contextmanager
def event_log() -> Iterator[None]:
    """Print runner and watcher events as short timestamped lines; quiet the rest."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(asctime)s  %(message)s", datefmt="%H:%M:%S"))
    loud = [logging.getLogger(n) for n in EVENT_LOGGERS]
    quiet = [logging.getLogger(n) for n in ("github_broker", "uvicorn", "apscheduler")]
    saved = [(lg, lg.level, lg.propagate) for lg in loud + quiet]
    verbose = logging.getLogger().getEffectiveLevel() <= logging.DEBUG
    for lg in loud:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
        lg.propagate = False
    if not verbose:  # broker internals only when asked for with --log-level DEBUG
        for lg in quiet:
            lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level, propagate in saved:
            lg.setLevel(level)
            lg.propagate = propagate
        for lg in loud:
            lg.removeHandler(handler)


#: How to point your own agent at a running sandbox (`url`: the broker's, `sim_url`: the
#: simulated GitHub's).
HOW_TO_TRY = """\
Point your own agent at it (start with --agents 0 to leave all the work to it):
  curl -s -X POST {url}/request-task -H 'Content-Type: application/json' \\
       -d '{{"agent_id": "my-agent", "wait_seconds": 30}}'

  from github_broker.agent.client import BrokerClient, BrokerClientError
  client = BrokerClient("{url}", "my-agent")
  task = client.request_task(wait_seconds=30)  # None when there is no task
  if task:
      print(task.branch_name, task.prompt)
      client.complete(task)

  github-broker agent --broker-url {url} --agent-id my-agent -- your-agent-command

Development is done when the branch has commits and a PR is open (the broker reads GitHub;
a task completed without one comes back after {grace_s:.0f} s), and the PR goes to review once
its required checks pass; a failing check becomes a fix task. On this simulated GitHub:
  curl -s -X POST {sim_url}/_sim/repos/{repo}/push \\
       -d '{{"branch": "feature/issue-1", "author": "my-agent"}}'
  curl -s -X POST {sim_url}/repos/{repo}/pulls -H 'Authorization: token me' \\
       -d '{{"title": "Fix it", "head": "feature/issue-1", "base": "main", "body": "Closes #1"}}'

Look at it from another terminal: github-broker status, github-broker explain

--- event log (Ctrl-C stops the sandbox) ---"""


def banner(sandbox: Sandbox) -> str:
    """What is running, and how to point your own agent at it."""
    url, sim, options = sandbox.url, sandbox.sim, sandbox.options
    open_issues = sim.state.list_issues(SANDBOX_OWNER, SANDBOX_REPO.split("/")[1], per_page=1)[1]
    agents = ", ".join(sandbox.agent_ids) if sandbox.agent_ids else "none (--agents 0)"
    maintainer = (
        "on: a stand-in for a person merges reviewed PRs (--no-maintainer: you do)"
        if options.maintainer
        else "off: the event log says what a person must do"
    )
    grace_s = sandbox.settings.progress.no_pr_grace_s if sandbox.settings else 0
    how_to = HOW_TO_TRY.format(url=url, sim_url=sim.base_url, repo=SANDBOX_REPO, grace_s=grace_s)
    return f"""\
github-broker sandbox: everything runs in this process, offline, no GitHub token
  simulated GitHub  {sim.base_url}  ({SANDBOX_REPO}, {open_issues} open issues and PRs)
  dashboard         {url}/ui
  broker API        {url}  (OpenAPI: {url}/docs, queues: {url}/status)
  redis             {options.redis_url}
  demo agents       {agents}
  maintainer        {maintainer}
  fake CI           {_fake_ci(sandbox)}
  agent output      {sandbox.logs} (kept after exit)

{how_to}"""


def _fake_ci(sandbox: Sandbox) -> str:
    """The simulated CI's check and when it fails, or off."""
    ci, red_every = sandbox.sim.state.ci, sandbox.options.red_every
    if ci is None:
        return "off"
    red = f"every {red_every}th issue's first push fails it" if red_every else ""
    return (
        f"{ci.check} on every push, red while {ci.marker}/… is in the "
        f"branch; main requires it ({red or 'the demo agents never fail it'})"
    )


def cmd_sandbox(args: argparse.Namespace) -> int:
    """Simulated GitHub, broker, demo agents and maintainer in one offline process."""
    if not port_free("127.0.0.1", args.port):
        raise SandboxError(f"port {args.port} on 127.0.0.1 is in use; pick another with --port")
    options = Options(
        port=args.port,
        redis_url=args.redis_url,
        agents=args.agents,
        work_s=args.work_seconds,
        maintainer=args.maintainer,
        changes_every=args.ask_changes_every,
    )
    with event_log():
        sandbox = Sandbox(options)
        with stop_on_signals(sandbox.stop):
            try:  # closed also when starting fails half-way
                sandbox.start()
                print(banner(sandbox), flush=True)
                sandbox.start_agents()
                sandbox.wait()
                logger.info("stopping: demo agents release their tasks")
            finally:
                sandbox.close()
    print("sandbox stopped", flush=True)
    return 0


def add_sandbox_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register `sandbox` on a parser's subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "sandbox",
        help="try the broker offline: simulated GitHub, broker and demo agents",
        description="Start a simulated GitHub seeded with a demo backlog, the broker API and "
        "its poller, demo agents that push and open PRs, and a simulated maintainer who merges "
        "reviewed PRs; all in one offline process.",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="API port (default %(default)s)")
    p.add_argument(
        "--redis-url", default="memory://", help="Redis to use (default: in-process memory://)"
    )
    _add_world_options(p)
    p.set_defaults(func=cmd_sandbox)
    return p


def _add_world_options(p: argparse.ArgumentParser) -> None:
    """The demo agents and the simulated maintainer."""
    p.add_argument(
        "--agents",
        type=int,
        default=Options.agents,
        choices=range(0, 11),
        metavar="N",
        help="demo agents to run, 0-10 (default %(default)s)",
    )
    p.add_argument(
        "--work-seconds",
        type=float,
        default=Options.work_s,
        metavar="SECONDS",
        help="how long a demo agent works on a task (default %(default)s)",
    )
    p.add_argument(
        "--maintainer",
        action=argparse.BooleanOptionalAction,
        default=Options.maintainer,
        help="a simulated maintainer merges reviewed PRs (default: on); with --no-maintainer "
        "the event log says what a person must do instead",
    )
    p.add_argument(
        "--ask-changes-every",
        type=int,
        default=Options.changes_every,
        metavar="N",
        help="the maintainer asks for changes once on every Nth reviewed PR, to show a fix "
        "round (0: never; default %(default)s)",
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m github_broker.sandbox.cli sandbox|labels ...` without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m github_broker.sandbox")
    parser.add_argument("--config", type=Path, default=None, help="config directory")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_sandbox_command(sub)
    add_labels_command(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except BrokerError as e:
        print(f"github-broker: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        return 130
