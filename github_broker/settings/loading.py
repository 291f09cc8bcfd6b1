"""Reading the config directory: `broker.yaml`, `agents.yml`, `GITHUB_TOKEN`, into `Settings`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)
from pydantic_settings import (
    SettingsError,
)

from github_broker.errors import ConfigError
from github_broker.settings.base import DEFAULTS_DIR, ENV_PREFIX
from github_broker.settings.messages import Origin, explain
from github_broker.settings.root import Settings


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"{path}{where}: not valid YAML ({e.problem}). Fix the syntax there; "
            "indent with spaces and quote values that contain ':' or '#'."
        ) from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot be read ({e.strerror}).") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of settings, not a list or text."
        )
    return data


def default_config_dir() -> Path:
    """`$GITHUB_BROKER_CONFIG_DIR`, else `./config` when it has a broker.yaml, else defaults."""
    env = os.environ.get(f"{ENV_PREFIX}CONFIG_DIR")
    if env:
        return Path(env)
    local = Path("config")
    return local if (local / "broker.yaml").exists() else DEFAULTS_DIR


def _read_agents(source: Path) -> list[Any]:
    """The roles of agents.yml; any other top-level key is refused."""
    agents_data = _read_yaml(source)
    unknown = set(agents_data) - {"agents"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}; the file holds "
            "`agents: [{role: NAME, description: TEXT}, ...]`."
        )
    agents: list[Any] = agents_data.get("agents") or []
    return agents


def _token_from_environment(data: dict[str, Any]) -> None:
    """$GITHUB_TOKEN as github.token, unless the file or $GITHUB_BROKER_GITHUB__TOKEN sets
    one."""
    if "GITHUB_TOKEN" in os.environ and f"{ENV_PREFIX}GITHUB__TOKEN" not in os.environ:
        data.setdefault("github", {})
        if isinstance(data["github"], dict) and "token" not in data["github"]:
            data["github"]["token"] = os.environ["GITHUB_TOKEN"]


def load_settings(
    config_dir: Path | None = None, *, flags: dict[str, str] | None = None, **overrides: Any
) -> Settings:
    """Build Settings from a config directory; raise ConfigError with a readable message.

    `flags` names the command-line option behind an environment variable the CLI set
    (`{"GITHUB_BROKER_SERVER__HOST": "--host"}`), so errors blame the option."""
    config_dir = config_dir or default_config_dir()
    broker_file = config_dir / "broker.yaml"
    agents_file = config_dir / "agents.yml"
    data: dict[str, Any] = {}
    if broker_file.exists():
        data.update(_read_yaml(broker_file))
    elif config_dir != DEFAULTS_DIR and config_dir.exists():
        raise ConfigError(f"{broker_file}: missing. Copy {DEFAULTS_DIR / 'broker.yaml'} there.")
    agents_source = agents_file if agents_file.exists() else DEFAULTS_DIR / "agents.yml"
    data["agents"] = _read_agents(agents_source)
    _token_from_environment(data)
    data.update(overrides)
    try:
        return Settings(**data)
    except ValidationError as e:
        own_file = broker_file.exists() and config_dir != DEFAULTS_DIR
        file_keys = set(data) - set(overrides) - {"agents"} if own_file else set()
        origin = Origin(broker_file, agents_source, file_keys, flags or {})
        raise ConfigError(explain(e, origin)) from e
    except SettingsError as e:
        raise ConfigError(
            f"Invalid configuration in the environment: {e}. Fix: complex values such as "
            f"{ENV_PREFIX}SERVER__AGENT_TOKENS must be JSON."
        ) from e
