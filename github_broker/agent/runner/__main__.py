"""`python -m github_broker.agent.runner agent ...`: the `agent` command without the full CLI."""

import sys

from github_broker.agent.runner.cli import main

sys.exit(main())
