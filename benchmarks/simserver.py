"""Child-process entry: the GitHub simulator seeded with generated issues for one benchmark.

The simulator serves from threads; in the benchmark process they would share the GIL with
the load generator and inflate every measured latency, so it runs as a process of its own.
"""

from __future__ import annotations

import argparse
import logging
import sys

from github_broker.simulator import Simulator, generate_issues

logger = logging.getLogger(__name__)

#: GitHub's real quota (5,000 an hour) would stop the write queue after a few seconds of load.
UNLIMITED_QUOTA = 10**9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.simserver")
    parser.add_argument("--repo", default="acme/widgets")
    parser.add_argument("--issues", type=int, default=0)
    parser.add_argument("--priority", default="P1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    owner, name = args.repo.split("/", 1)
    issues = generate_issues(args.issues, priorities=(args.priority,))
    seed = {"repositories": [{"owner": owner, "name": name, "issues": issues}]}
    sim = Simulator(seed, rate_limit=UNLIMITED_QUOTA)
    sim.start()
    print(sim.base_url, flush=True)
    # Serve until the parent closes our stdin (or dies, which closes it too).
    sys.stdin.read()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
