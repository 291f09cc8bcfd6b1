"""`python -m github_broker.sandbox` runs the sandbox's own command line."""

import sys

from github_broker.sandbox.cli import main

sys.exit(main())
