"""What keeps an issue waiting in the dependency graph, in words (explain, /status, the
dashboard): the blocker and its state, an unreadable blocker and why, a dependency cycle."""

from __future__ import annotations

from github_broker.store import RepoStore

#: Each state a blocker can be in, as a person reads it.
STATES = {
    "open": "open",
    "not_planned": "closed as not planned: a person must remove the link or reopen it "
    "(dependencies.not_planned: unblock counts it as done)",
    "duplicate": "closed as a duplicate: a person must link the issue it duplicates instead "
    "(dependencies.not_planned: unblock counts it as done)",
    "gone": "deleted or transferred: the links are read again",
    "completed": "closed as completed",
}


def blocker_words(ref: str, state: str, cycle: list[str] | None = None) -> str:
    """`blocked by acme/api#12 (open)`, `blocker unreadable: ...`."""
    if ref == "?hidden":
        text = "blocker unreadable: GitHub counts a blocker it does not show the broker (no "
        text += "permission to read its repository)"
    elif ref == "?error":
        text = "blocker unreadable: GitHub's list of its blockers could not be read (read "
        text += "again at the next pass)"
    elif state == "unserved":
        text = f"blocker unreadable: {ref} is in a repository this broker does not serve, so "
        text += "its state cannot be followed (serve it, or set dependencies.unserved: last_read)"
    elif state == "unknown":
        text = f"blocker unreadable: the state of {ref} is not known yet"
    else:
        text = f"blocked by {ref} ({STATES.get(state, state)})"
    if cycle:
        text += f"; on a dependency cycle ({' -> '.join([*cycle, cycle[0]])}): a person must "
        text += "remove one of its links"
    return text


def verdict_words(verdict: str, cycle: list[str] | None = None) -> str:
    """graph:blocked's `<ref> <state>` in words."""
    ref, _, state = verdict.rpartition(" ")
    return blocker_words(ref, state, cycle)


def same_repository(rstore: RepoStore, ref: str) -> int | None:
    """The number of `ref` when it is an issue of `rstore`'s repository."""
    repo, _, number = ref.rpartition("#")
    if repo.lower() == rstore.repository.lower() and number.isdigit():
        return int(number)
    return None
