"""The `/broker` command language: which lines of a comment are commands, what each verb
takes, and the bounds, all checked before anything is done.

A command is a line of its own that starts with `/broker` (up to three spaces before it, as
Markdown allows); the rest of the comment is prose and is not read. Lines inside fenced code
blocks are not commands (a maintainer quoting the syntax does not run it), nor are quoted
lines (`> /broker …` starts with `>`). A comment may hold up to `MAX_COMMANDS` of them, run
in order; if any of them does not parse, none runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from github_broker.settings import AGENT_ID_RE, Settings
from github_broker.steering.actions import MAX_TEXT

#: A comment longer than this (characters) is not read for commands; GitHub allows 65,536.
MAX_BODY_CHARS = 10_000
#: Commands one comment may hold.
MAX_COMMANDS = 5
#: Characters of one command line (verb, agent id, and a reason of up to steering.MAX_TEXT).
MAX_LINE_CHARS = MAX_TEXT + 80

#: A command line: `/broker` then the verb and its arguments, or nothing.
_COMMAND = re.compile(r"^ {0,3}/broker(?:[ \t]+(?P<rest>.*?))?[ \t]*$")
#: Whether a body holds a command at all (the cheap test run before anything else).
_ANY_COMMAND = re.compile(r"^ {0,3}/broker(?:[ \t]|$)", re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


@dataclass(frozen=True)
class Verb:
    """One verb: its argument (an agent id, required text, or none) and what it does."""

    name: str
    takes: str  # "agent", "text" (required) or "" (an optional reason follows)
    usage: str


VERBS = {
    v.name: v
    for v in (
        Verb("release", "", "revoke the issue's lease; its task goes back to the pool"),
        Verb("hold", "", "revoke the lease and hold the issue for a person (until retry)"),
        Verb("retry", "", "give an issue the broker gave up on another round"),
        Verb("reassign", "agent", "hand the issue's task to AGENT, branch and PR kept"),
        Verb("note", "text", "send TEXT to the agent holding the issue (next heartbeat)"),
        Verb("pause", "agent", "AGENT finishes its task and gets no new one (everywhere)"),
        Verb("stop", "agent", "AGENT's lease is revoked now and it gets no new task"),
        Verb("resume", "agent", "AGENT gets work again after pause, stop or the breaker"),
        Verb("help", "", "this list"),
    )
}


@dataclass(frozen=True)
class Command:
    verb: str
    agent: str = ""
    #: The reason (or the note's text), possibly empty.
    text: str = ""
    #: The line as written, for the answer.
    line: str = ""


@dataclass
class Parsed:
    """The commands of one comment, or why none of them runs."""

    commands: list[Command] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def has_command(body: str) -> bool:
    """Whether the body has a line that starts with `/broker` (nothing else is read yet)."""
    return _ANY_COMMAND.search(body) is not None


def parse(body: str, settings: Settings) -> Parsed:
    """Every command of the body, checked; `errors` non-empty means none may run."""
    if len(body) > MAX_BODY_CHARS:
        return Parsed(errors=[f"the comment is longer than {MAX_BODY_CHARS} characters"])
    out = Parsed()
    fenced = False
    for raw in body.splitlines():
        if _FENCE.match(raw):
            fenced = not fenced
            continue
        found = None if fenced else _COMMAND.match(raw)
        if found is None:
            continue
        if len(out.commands) + len(out.errors) >= MAX_COMMANDS:
            return Parsed(errors=[f"more than {MAX_COMMANDS} commands in one comment"])
        line = raw.strip()
        if len(line) > MAX_LINE_CHARS:
            out.errors.append(f"`{shown(line)}`: longer than {MAX_LINE_CHARS} characters")
            continue
        try:
            out.commands.append(_command(found.group("rest") or "", line, settings))
        except ValueError as e:
            out.errors.append(f"`{shown(line)}`: {e}")
    return out


def _command(rest: str, line: str, settings: Settings) -> Command:
    words = rest.split(maxsplit=1)
    if not words:
        raise ValueError("no verb")
    name = words[0].lower()
    verb = VERBS.get(name)
    if verb is None:
        raise ValueError(f"unknown verb `{shown(words[0], 40)}`")
    after = words[1].strip() if len(words) > 1 else ""
    agent = ""
    if verb.takes == "agent":
        parts = after.split(maxsplit=1)
        agent = _agent(parts[0] if parts else "", settings)
        after = parts[1] if len(parts) > 1 else ""
    if verb.takes == "text" and not after:
        raise ValueError(f"`{name}` needs a text")
    if len(after) > MAX_TEXT:
        raise ValueError(f"a reason or note of more than {MAX_TEXT} characters")
    return Command(name, agent=agent, text=after, line=line)


def _agent(agent: str, settings: Settings) -> str:
    if not agent:
        raise ValueError("needs an agent id")
    if not AGENT_ID_RE.match(agent):
        raise ValueError(
            f"`{shown(agent, 60)}` is not an agent id (1-50 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit)"
        )
    clash = settings.label_clash(agent)
    if clash is not None:
        raise ValueError(f"{agent!r} is the label {clash}, not an agent id")
    return agent


def usage() -> str:
    lines = [f"- `/broker {v.name}{_argument(v)}`: {v.usage}" for v in VERBS.values()]
    return (
        "Commands, one per line (at most "
        f"{MAX_COMMANDS} per comment), from people with write access to the repository; "
        "the issue is the one commented on, a reason may follow:\n" + "\n".join(lines)
    )


def _argument(verb: Verb) -> str:
    return {"agent": " AGENT", "text": " TEXT"}.get(verb.takes, "")


def shown(text: str, limit: int = 80) -> str:
    """`text` safe inside a Markdown code span of the answer, cut to `limit` characters."""
    text = text.replace("`", "'")
    return text if len(text) <= limit else text[: limit - 1] + "…"
