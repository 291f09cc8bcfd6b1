"""Which broker a command reads or steers: the configured deployment (`--config`, the
`GITHUB_BROKER_*` environment), or else the running `github-broker sandbox`."""

from __future__ import annotations

import argparse
import sys

from github_broker.errors import ConfigError
from github_broker.settings import ENV_PREFIX, Settings, default_config_dir, load_settings

#: What `--help` of the commands that use `broker_settings` says about finding the broker.
FINDS_BROKER = (
    "Which broker: the one configured by `github-broker --config DIR` (default "
    f"{default_config_dir()}) and {ENV_PREFIX}* environment variables (its Redis and "
    "repositories); when no repository is configured, the running `github-broker sandbox` "
    "(--sandbox asks for it)."
)
#: Help of `--sandbox` on those commands.
SANDBOX_HELP = (
    "look at the running `github-broker sandbox` (the default when no repository is "
    "configured and one runs)"
)


def configured(args: argparse.Namespace) -> Settings:
    """The settings `--config` (or the default directory) and the environment give."""
    if args.config is not None and not args.config.is_dir():
        raise ConfigError(
            f"--config {args.config}: no such directory. Pass the directory that holds "
            "broker.yaml (and agents.yml), or leave --config out to use the defaults."
        )
    return load_settings(args.config)


def require_repositories(settings: Settings) -> None:
    if not settings.repositories:
        raise ConfigError(
            "no repositories configured: set `repositories` in broker.yaml "
            f"or {ENV_PREFIX}REPOSITORIES=owner/name"
        )


def broker_settings(args: argparse.Namespace) -> Settings:
    """The configured deployment, or the running sandbox (`--sandbox`, or when no repository
    is configured and a sandbox runs; said on stderr)."""
    from github_broker.sandbox import state as sandbox_state

    settings = None if getattr(args, "sandbox", False) else configured(args)
    if settings is not None and settings.repositories:
        return settings
    running = sandbox_state.read()
    if running is None:
        if settings is None:
            raise ConfigError("no sandbox is running (`github-broker sandbox` starts one)")
        require_repositories(settings)
    assert running is not None
    from github_broker.sandbox.world import sandbox_settings

    print(
        f"github-broker: showing the sandbox running at {running.url} (pid {running.pid})",
        file=sys.stderr,
    )
    return sandbox_settings(running.github_url, running.redis_url, running.port)
