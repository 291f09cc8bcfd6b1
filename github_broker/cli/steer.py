"""`github-broker` verbs of maintainers steering running work: revoke, reassign, note, retry,
pause, stop, resume, audit. Short functions over `steering.Steering`, talking to the Redis of
the broker `status` looks at (cli/target.py: the configured one, or the running sandbox); each
action is recorded in the audit log as `cli:<user>`. With `--broker-url` they go through the
broker's API as the person a token names instead (remote.py)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from github_broker.cli import remote
from github_broker.cli.common import add_command, issue_ref, print_audit
from github_broker.cli.target import FINDS_BROKER, SANDBOX_HELP, broker_settings
from github_broker.errors import ConfigError
from github_broker.models import Actor
from github_broker.settings import Settings
from github_broker.steering.actions import ActionResult, Steering

#: Audit entries shown by default.
AUDIT_SHOWN = 30


def actor() -> Actor:
    """Whoever runs the CLI verbs holds the deployment's configuration (its Redis): an
    administrator, named by their login on this machine."""
    try:
        return Actor.admin(f"cli:{getpass.getuser()}")
    except (KeyError, OSError):
        return Actor.admin("cli")


def _run(args: argparse.Namespace, act: Callable[[Steering, Settings], Awaitable[Any]]) -> int:
    if remote.wanted(args):
        return remote.run(args)
    from github_broker.gateway import GitHubGateway
    from github_broker.leader.sync import Syncer
    from github_broker.store import Store

    settings = broker_settings(args)

    async def run() -> Any:
        store = Store.from_settings(settings)
        gateway = GitHubGateway(settings.github)
        try:
            steering = Steering(settings, store, Syncer(settings, store, gateway).reindex)
            return await act(steering, settings)
        finally:
            await store.close()
            await asyncio.to_thread(gateway.close)

    result = asyncio.run(run())
    if isinstance(result, ActionResult):
        print(f"{result.action} {result.target}: {result.outcome}")
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    """End a task's lease now (its agent hears the reason at its next heartbeat).

    The task goes back to the pool, or with --hold the issue waits for a person until
    `github-broker retry`."""
    return _run(
        args,
        lambda st, s: st.revoke(*issue_ref(args.issue, s), actor(), args.reason, hold=args.hold),
    )


def cmd_reassign(args: argparse.Namespace) -> int:
    """Give a task to another agent; the branch and PR stay.

    The current holder's lease is revoked; the named agent's next task request gets the
    task, with the holder's last progress note."""
    return _run(
        args, lambda st, s: st.reassign(*issue_ref(args.issue, s), args.agent, actor(), args.reason)
    )


def cmd_note(args: argparse.Namespace) -> int:
    """Send a note to the agent holding a task (delivered with its next heartbeat).

    Delivered once; the runner appends it to .broker-notes.md where the agent works."""
    return _run(args, lambda st, s: st.note(*issue_ref(args.issue, s), actor(), args.text))


def cmd_retry(args: argparse.Namespace) -> int:
    """Another round for an issue the broker gave up on (needs-human, budgets, a hold).

    Failures, usage, fix rounds and a hold are cleared, needs-human is removed, and the
    issue's tasks go back to the pool."""
    return _run(args, lambda st, s: st.retry(*issue_ref(args.issue, s), actor(), args.reason))


def _agent_or_scope(args: argparse.Namespace, st: Steering, *, resume: bool) -> Awaitable[Any]:
    if args.all:
        return st.pause_broker(actor(), args.reason, resume=resume)
    if args.repo:
        return st.pause_repo(args.repo, actor(), args.reason, resume=resume)
    if not args.agent:
        raise ConfigError("name an agent, or --repo owner/name, or --all")
    if resume:
        return st.resume_agent(args.agent, actor(), args.reason)
    return st.pause_agent(args.agent, actor(), args.reason)


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause an agent (its task may finish, no new one), a repository or the whole broker.

    A paused agent's task requests are refused (409 agent_paused) until `github-broker
    resume`; a paused repository (--repo) or broker (--all) hands out nothing new while
    running leases go on."""
    return _run(args, lambda st, _s: _agent_or_scope(args, st, resume=False))


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume a paused agent (also after the circuit breaker), a repository or the broker.

    The agent's failure streak starts again; its next task request gets work."""
    return _run(args, lambda st, _s: _agent_or_scope(args, st, resume=True))


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop an agent: its lease is revoked now and it gets no new task.

    As pause, and the task it holds goes back to the pool at once; `github-broker resume`
    lifts it."""
    return _run(args, lambda st, _s: st.pause_agent(args.agent, actor(), args.reason, stop=True))


def cmd_audit(args: argparse.Namespace) -> int:
    """The audit log, newest first: actions by maintainers and by the broker.

    Each line: when, who (cli:<user>, dashboard, github:<login>, broker), the action, its
    target, the reason and the outcome that really happened."""
    if remote.wanted(args):
        return remote.run(args)
    from github_broker.store import Store

    settings = broker_settings(args)

    async def run() -> list[Any]:
        store = Store.from_settings(settings)
        try:
            return list(await store.audit_log(args.limit))
        finally:
            await store.close()

    print_audit(asyncio.run(run()), as_json=args.json)
    return 0


#: `--reason` of each verb: where the reason goes.
REASON_HELP = {
    "revoke": "why; the agent hears it at its next heartbeat, and the audit log keeps it",
    "reassign": "why; the agent losing the task hears it, the one taking it over reads it "
    "with the task, and the audit log keeps it",
    "retry": "why (kept in the audit log)",
    "pause": "why; a paused agent hears it with its next heartbeat or task request, "
    "status shows it, and the audit log keeps it",
    "stop": "why; the agent hears it at its next heartbeat, and the audit log keeps it",
    "resume": "why (kept in the audit log)",
}
ISSUE_HELP = "the issue: owner/name#N (or N when the broker serves one repository)"


def _steer_command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A steering verb: it finds the broker like status does and may carry a reason."""
    p = add_command(sub, name, func, epilog=FINDS_BROKER)
    p.add_argument("--sandbox", action="store_true", help=SANDBOX_HELP)
    if name in REASON_HELP:
        p.add_argument("--reason", default="", help=REASON_HELP[name])
    remote.add_options(p)
    return p


def add_steer_commands(sub: Any) -> None:
    _add_task_verbs(sub)
    _add_agent_verbs(sub)


def _add_task_verbs(sub: Any) -> None:
    """revoke, reassign, note, retry: one issue's task."""
    add = partial(_steer_command, sub)
    p = add("revoke", cmd_revoke)
    p.add_argument("issue", help=ISSUE_HELP)
    p.add_argument(
        "--hold",
        action="store_true",
        help="the issue then waits for a person (not handed out) until `github-broker retry`",
    )
    p = add("reassign", cmd_reassign)
    p.add_argument("issue", help=ISSUE_HELP)
    p.add_argument("agent", help="the agent that continues the task (its next request gets it)")
    p = add("note", cmd_note)
    p.add_argument("issue", help=ISSUE_HELP)
    p.add_argument("text", help="the message (quote it); delivered with the holder's heartbeat")
    p = add("retry", cmd_retry)
    p.add_argument("issue", help=ISSUE_HELP)


def _add_agent_verbs(sub: Any) -> None:
    """pause, resume, stop, audit: agents, repositories, the whole broker."""
    add = partial(_steer_command, sub)
    for name, func in (("pause", cmd_pause), ("resume", cmd_resume)):
        p = add(name, func)
        p.add_argument("agent", nargs="?", help="the agent id (or give --repo or --all instead)")
        p.add_argument(
            "--repo", metavar="OWNER/NAME", help="a repository (maintenance) instead of an agent"
        )
        p.add_argument("--all", action="store_true", help="the whole broker (maintenance)")
    p = add("stop", cmd_stop)
    p.add_argument("agent", help="the agent id")
    p = add("audit", cmd_audit)
    p.add_argument(
        "--limit", type=int, default=AUDIT_SHOWN, help="entries shown (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="the entries as JSON")
