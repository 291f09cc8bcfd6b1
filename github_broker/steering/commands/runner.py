"""One comment with `/broker` commands, from either path: filtered for free, taken up once,
its author's access checked, its commands run through the steering use cases, answered.

Order matters for the cost: a body without a command line, a bot's comment, a comment older
than `commands.max_age_s`, an edited one and the broker's own are dropped before any Redis
or GitHub work; a comment is then taken up once (`comment:{id}`, SET NX) so the webhook
worker and the poller never both act on it; only then is GitHub asked who wrote it (cached).

Answers go straight through the gateway (paced by its write bucket), not through the durable
write queue: a reaction or a reply is an acknowledgement, not state GitHub and Redis must
agree on, and a reply is not idempotent (a retried POST posts twice). A crash between the
action and its answer loses the answer; the action stands and is in the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from github_broker.errors import (
    BrokerError,
    Forbidden,
    GitHubError,
    GitHubUnavailable,
    InvalidRequest,
    NotFound,
    RateLimited,
)
from github_broker.gateway import GitHubGateway
from github_broker.models import Actor, Authority
from github_broker.settings import Repository, Settings
from github_broker.steering.actions import ActionResult, Reindex, Steering
from github_broker.steering.authority import record_refusal
from github_broker.steering.commands import grammar
from github_broker.steering.commands.access import ALLOWED, Access
from github_broker.steering.commands.comment import Comment
from github_broker.steering.commands.scan import CommentScanner
from github_broker.store import Store
from github_broker.store.comments import CommentLedger

logger = logging.getLogger(__name__)

#: Seconds a taken-up comment is remembered beyond `commands.max_age_s`, for clocks that
#: differ between GitHub and the broker: any later sight of it is then too old to act on.
CLOCK_SKEW_S = 600
#: Reactions: every command did what it asks; or a command was refused, failed or had
#: nothing to act on (a reply says which).
DONE, NOT_DONE = "+1", "confused"


@dataclass(frozen=True)
class Outcome:
    command: grammar.Command
    text: str
    done: bool


class CommentCommands:
    """`/broker` commands from issue comments (webhook worker and poller alike)."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        gateway: GitHubGateway,
        reindex: Reindex | None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.gateway = gateway
        self.steering = Steering(settings, store, reindex)
        self.access = Access(settings, store, gateway)
        self.scanner = CommentScanner(settings, store, gateway, self.handle)

    # --- the two paths ------------------------------------------------------------------

    async def from_delivery(self, repo: Repository, payload: dict[str, Any]) -> str:
        """The webhook worker's `issue_comment` `created` delivery; a comment GitHub could
        not be asked about is left for the poller's next look."""
        if not self.settings.commands.enabled:
            return "commands off"
        issue = payload.get("issue")
        number = issue.get("number") if isinstance(issue, dict) else None
        comment = Comment.from_github(payload.get("comment"), number)
        if comment is None:
            return "no comment"
        try:
            return await self.handle(repo, comment)
        except (GitHubError, GitHubUnavailable, RateLimited) as e:
            # The comment was given back (or never taken up): the poll reads it again.
            return f"commands left for the poll: {e}"

    async def scan(self, repo: Repository) -> int:
        """The poller's look at new comments (one conditional read); how many were new."""
        if not self.settings.commands.enabled:
            return 0
        return await self.scanner.scan(repo)

    # --- one comment --------------------------------------------------------------------

    async def handle(self, repo: Repository, comment: Comment) -> str:
        """What became of one comment (for the log)."""
        if not grammar.has_command(comment.body):
            return "no command"
        if comment.bot:
            return "ignored: a bot's"
        max_age_s = self.settings.commands.max_age_s
        if comment.age_s(time.time()) > max_age_s:
            return "ignored: older than commands.max_age_s"
        if comment.edited:
            return "ignored: edited (commands are read as posted)"
        me = await self.access.own_login()
        if me and comment.login.lower() == me.lower():
            return "ignored: the broker's own"
        name = repo.full_name
        ledger = CommentLedger(self.store.repo(name))
        if not await ledger.take_up(comment.id, max_age_s + CLOCK_SKEW_S):
            return "already taken up"
        try:
            permission = await self.access.permission(name, comment.login)
        except BrokerError:
            await ledger.give_back(comment.id)
            raise
        if permission not in ALLOWED:
            # No answer: one that anybody can trigger is a way to make the broker spam.
            logger.info(
                "%s#%d: commands of %s ignored: %s access, not write",
                name,
                comment.number,
                comment.login,
                permission,
            )
            return f"refused: {comment.login} has {permission} access"
        return await self._run_all(name, comment, commenter(comment.login, name, permission))

    async def _run_all(self, repository: str, comment: Comment, actor: Actor) -> str:
        parsed = grammar.parse(comment.body, self.settings)
        if parsed.errors:
            lines = [f"- {error}" for error in parsed.errors]
            text = "Nothing was done:\n" + "\n".join(lines) + "\n\n" + grammar.usage()
            await self._answer(repository, comment, NOT_DONE, text)
            return "refused: " + "; ".join(parsed.errors)
        outcomes = [await self._run(repository, comment.number, c, actor) for c in parsed.commands]
        done = all(o.done for o in outcomes)
        asked_help = any(o.command.verb == "help" for o in outcomes)
        reply = None
        if not done or asked_help:
            reply = "\n".join(f"- `{_said(o.command)}`: {o.text}" for o in outcomes)
            if asked_help:
                reply += "\n\n" + grammar.usage()
        await self._answer(repository, comment, DONE if done else NOT_DONE, reply)
        return "; ".join(f"{_said(o.command)}: {o.text}" for o in outcomes)

    async def _run(
        self, repository: str, number: int, command: grammar.Command, actor: Actor
    ) -> Outcome:
        s, verb, agent, text = self.steering, command.verb, command.agent, command.text
        try:
            if verb == "help":
                return Outcome(command, "the commands are listed below", True)
            result: ActionResult
            if verb in ("release", "hold"):
                result = await s.revoke(repository, number, actor, text, hold=verb == "hold")
            elif verb == "retry":
                result = await s.retry(repository, number, actor, text)
            elif verb == "reassign":
                result = await s.reassign(repository, number, agent, actor, text)
            elif verb == "note":
                result = await s.note(repository, number, actor, text)
            elif verb in ("pause", "stop"):
                result = await s.pause_agent(agent, actor, text, stop=verb == "stop")
            else:
                result = await s.resume_agent(agent, actor, text)
        except Forbidden as e:
            await record_refusal(self.store, actor, _action(verb), str(e), repository=repository)
            return Outcome(command, f"refused: {e}", False)
        except (NotFound, InvalidRequest) as e:
            return Outcome(command, f"not done: {e}", False)
        except BrokerError as e:
            # Its message may name internal addresses: the log gets it, GitHub does not.
            logger.warning("%s#%d: %s by %s failed: %s", repository, number, verb, actor.name, e)
            return Outcome(command, "not done: the broker could not complete it; try again", False)
        return Outcome(command, result.outcome, _did(verb, result.outcome))

    async def _answer(
        self, repository: str, comment: Comment, reaction: str, reply: str | None
    ) -> None:
        """React, and reply where the outcome says more; a write GitHub refuses or that
        fails is logged and lost (the action itself stands)."""
        writes: list[tuple[str, Any]] = [
            ("reaction", lambda: self.gateway.react(repository, comment.id, reaction))
        ]
        if reply is not None:
            body = f"@{comment.login}\n{reply}"
            writes.append(("reply", lambda: self.gateway.comment(repository, comment.number, body)))
        for what, write in writes:
            try:
                await asyncio.to_thread(write)
            except BrokerError as e:
                logger.warning(
                    "%s#%d: %s to comment %d not posted: %s",
                    repository,
                    comment.number,
                    what,
                    comment.id,
                    e,
                )


def _did(verb: str, outcome: str) -> bool:
    """Whether the outcome is what the verb asks for (else the reply says what happened)."""
    if outcome.startswith("refused"):
        return False
    if verb == "release":
        return outcome.startswith("lease of ")
    if verb == "hold":
        return "held for a person" in outcome
    if verb == "retry":
        return not outcome.startswith("nothing to retry")
    if verb == "note":
        return outcome.startswith("queued for ")
    if verb == "reassign":
        return not outcome.startswith("refused")
    if verb == "resume":
        return outcome == "resumed"
    return True  # pause, stop: the agent is paused whatever it held


def _said(command: grammar.Command) -> str:
    """The command as the answer names it: verb and agent, never the free text (a reply
    must not carry @mentions or Markdown that the broker would then post)."""
    return grammar.shown(f"/broker {command.verb} {command.agent}".strip())


def commenter(login: str, repository: str, permission: str) -> Actor:
    """The person behind a comment command: named by their GitHub login, a maintainer where
    GitHub grants them maintain or admin, else a writer; acting within the comment's
    repository only (steering/authority.py)."""
    rank = Authority.MAINTAINER if permission in ("admin", "maintain") else Authority.COMMENTER
    return Actor(f"github:{login}", rank, frozenset({repository}))


def _action(verb: str) -> str:
    """The audit log's name of a comment verb's action."""
    return {
        "release": "revoke",
        "hold": "revoke",
        "pause": "pause_agent",
        "stop": "stop_agent",
        "resume": "resume_agent",
    }.get(verb, verb)
