"""`python -m github_broker` runs the CLI."""

from github_broker.cli.main import main

raise SystemExit(main())
