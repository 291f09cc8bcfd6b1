"""Command line entry point: serve the GitHub simulator until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from .seed import DEMO_SEED_PATH, generate_issues, load_seed
from .server import Simulator

logger = logging.getLogger(__name__)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m github_broker.simulator",
        description="Local GitHub REST API simulator (prints its base URL, then serves).",
    )
    parser.add_argument("--seed", help=f"YAML seed file (default: {DEMO_SEED_PATH.name})")
    parser.add_argument("--empty", action="store_true", help="start without any seed data")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    parser.add_argument(
        "--generate", type=int, default=0, metavar="N", help="add N generated issues to --repo"
    )
    parser.add_argument("--repo", metavar="OWNER/NAME", help="repository for --generate")
    parser.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN=LOGIN",
        help="accept only these tokens (repeatable); default accepts any",
    )
    parser.add_argument("--rate-limit", type=int, default=5000, help="requests per token-hour")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.generate and (not args.repo or "/" not in args.repo):
        parser.error("--generate needs --repo OWNER/NAME")
    if any("=" not in t for t in args.token):
        parser.error("--token takes TOKEN=LOGIN")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    seed = None if args.empty else load_seed(args.seed or DEMO_SEED_PATH)
    tokens = dict(t.split("=", 1) for t in args.token) or None
    sim = Simulator(seed, host=args.host, port=args.port, tokens=tokens, rate_limit=args.rate_limit)
    if args.generate:
        owner, name = args.repo.split("/", 1)
        if args.repo.lower() not in (n.lower() for n in sim.state.repo_names()):
            sim.state.add_repo(owner, name)
        for issue in generate_issues(args.generate):
            # Numbers are re-assigned so generated issues follow any seeded ones.
            del issue["number"]
            sim.state.create_issue(owner, name, **issue)

    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    sim.start()
    print(sim.base_url, flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
