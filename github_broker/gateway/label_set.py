"""`labels init`: the label set the broker reads and writes, created on GitHub once."""

from __future__ import annotations

import argparse
import re

from github_broker.errors import ConfigError
from github_broker.settings import Settings, load_settings

#: Colours (hex, no #) and descriptions of the labels `labels init` creates.
PRIORITY_LABELS = [
    ("P0", "b60205", "Priority 0: most urgent"),
    ("P1", "d93f0b", "Priority 1"),
    ("P2", "fbca04", "Priority 2"),
    ("P3", "0e8a16", "Priority 3"),
    ("P4", "c2e0c6", "Priority 4: least urgent"),
]
ROLE_COLOR = "1d76db"
#: GitHub refuses label descriptions longer than this.
MAX_LABEL_DESCRIPTION = 100


def label_set(settings: Settings) -> list[tuple[str, str, str]]:
    """(name, colour, description) of every label the broker reads or writes."""
    pattern = re.compile(settings.labels.priority_pattern)
    if not all(pattern.match(name) for name, _, _ in PRIORITY_LABELS):
        raise ConfigError(
            f"labels.priority_pattern {settings.labels.priority_pattern!r} does not accept "
            "P0-P4, the priority labels `labels init` creates; create yours by hand"
        )
    names = settings.labels
    broker = [
        (names.in_progress, "0052cc", "An agent holds this issue (written by github-broker)"),
        (names.needs_review, "5319e7", "The work is done and a PR is open"),
        (names.review_done, "c2e0c6", "The reviewing window of this PR is over"),
        (names.needs_human, "d73a4a", "github-broker gave up on it: a person must look"),
        (names.story, "c5def5", "Groups issues; never handed out"),
        (names.epic, "3e4b9e", "Groups stories; never handed out"),
    ]
    roles = [
        (a.role, ROLE_COLOR, a.description or f"Work for a {a.role} agent") for a in settings.agents
    ]
    return [(n, c, d[:MAX_LABEL_DESCRIPTION]) for n, c, d in PRIORITY_LABELS + roles + broker]


def cmd_labels_init(args: argparse.Namespace) -> int:
    """Create the broker's labels on GitHub (idempotent)."""
    from github_broker.gateway import GitHubGateway

    settings = load_settings(getattr(args, "config", None))
    repos = [args.repo] if args.repo else [r.full_name for r in settings.repositories]
    if not repos:
        raise ConfigError(
            "no repository: pass --repo owner/name or set `repositories` "
            "in broker.yaml (or GITHUB_BROKER_REPOSITORIES)"
        )
    labels = label_set(settings)
    gateway = GitHubGateway(settings.github)
    try:
        for repo in repos:
            # One listing, then only the missing labels: creating is a paced write (~1 s).
            existing = {name.lower() for name in gateway.label_names(repo)}
            created = 0
            for name, color, description in labels:
                made = name.lower() not in existing and gateway.ensure_label(
                    repo, name, color, description
                )
                created += made
                print(f"{'created' if made else 'exists ':<8} {repo}  {name}")
            print(f"{repo}: {created} created, {len(labels) - created} already there")
    finally:
        gateway.close()
    return 0


def _repo_name(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not of the form owner/name")
    return value


def add_labels_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """Register `labels init` on a parser's subcommands."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "labels",
        help="manage the labels the broker uses on GitHub",
        description="Manage the labels the broker reads and writes on GitHub (`labels init` "
        "creates them).",
    )
    sub = p.add_subparsers(dest="labels_command", required=True)
    init = sub.add_parser(
        "init",
        help="create priorities P0-P4, the roles of agents.yml and the broker's labels",
        description="Create the label set (priorities P0-P4, roles from agents.yml, "
        "in-progress, needs-review, review-done, needs-human, story, epic). "
        "Labels that exist are left as they are.",
    )
    init.add_argument(
        "--repo",
        type=_repo_name,
        metavar="OWNER/NAME",
        help="only this repository (default: every configured one)",
    )
    init.set_defaults(func=cmd_labels_init)
    return p
