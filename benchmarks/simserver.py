"""Child-process entry: the GitHub simulator seeded with generated issues for one benchmark.

The simulator serves from threads; in the benchmark process they would share the GIL with
the load generator and inflate every measured latency, so it runs as a process of its own.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from github_broker.simulator import Simulator, generate_issues

logger = logging.getLogger(__name__)

#: GitHub's real quota (5,000 an hour) would stop the write queue after a few seconds of load.
UNLIMITED_QUOTA = 10**9
#: Tokens of the people `--people` adds, by login: the broker's own token (`bench-token`,
#: as in `servers.broker_env`), a maintainer who reviews and an agent's account that opens
#: pull requests. Without `--people` every token is the broker's login, so a review posted
#: through the API would be the broker's own (ignored as feedback).
PEOPLE = {"bench-token": "broker-bot", "maintainer-token": "alice", "agent-token": "dev-bot"}


def repo_names(count: int) -> list[str]:
    """The repositories of a many-repository data set, in configuration order."""
    return [f"acme/repo-{i:04d}" for i in range(count)]


def seed(repos: list[str], issues: int, work_in: int, priority: str) -> dict[str, Any]:
    """`issues` open issues in `repos[work_in]`, the other repositories empty."""
    out = []
    for i, full_name in enumerate(repos):
        owner, name = full_name.split("/", 1)
        items = generate_issues(issues, priorities=(priority,)) if i == work_in else []
        out.append({"owner": owner, "name": name, "issues": items})
    return {"repositories": out}


def link(sim: Simulator, repo: str, links: int, issues: int) -> None:
    """`links` dependencies spread over the backlog: issue k*step+2 blocked by k*step+1."""
    owner, name = repo.split("/", 1)
    step = max(2, issues // max(1, links))
    for k in range(links):
        blocker = k * step + 1
        sim.state.block(owner, name, blocker + 1, by=(owner, name, blocker))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simserver")
    parser.add_argument("--repo", default="acme/widgets")
    parser.add_argument(
        "--repos",
        type=int,
        default=0,
        help="serve this many repositories (`repo_names`) instead of --repo",
    )
    parser.add_argument(
        "--work-in",
        type=int,
        default=-1,
        help="index of the repository holding the issues (default: the last)",
    )
    parser.add_argument("--issues", type=int, default=0)
    parser.add_argument("--priority", default="P1")
    parser.add_argument(
        "--people",
        action="store_true",
        help="tokens for a maintainer and an agent beside the broker's",
    )
    parser.add_argument(
        "--links", type=int, default=0, help="that many dependencies among the issues (`link`)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    repos = repo_names(args.repos) if args.repos else [args.repo]
    sim = Simulator(
        seed(repos, args.issues, args.work_in % len(repos), args.priority),
        rate_limit=UNLIMITED_QUOTA,
        tokens={t: login for t, login in PEOPLE.items()} if args.people else None,
    )
    if args.links:
        link(sim, repos[args.work_in % len(repos)], args.links, args.issues)
    sim.start()
    print(sim.base_url, flush=True)
    # Serve until the parent closes our stdin (or dies, which closes it too).
    sys.stdin.read()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
