"""Configuration: files, environment overrides and the errors a broken config gives."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from github_broker.claim.prompts import Prompts
from github_broker.errors import ConfigError
from github_broker.settings import load_settings


def write(tmp_path: Path, broker: str = "", agents: str | None = None) -> Path:
    (tmp_path / "broker.yaml").write_text(broker)
    if agents is not None:
        (tmp_path / "agents.yml").write_text(agents)
    return tmp_path


def test_files_load_and_environment_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path,
        "repositories: [acme/widgets]\nleases:\n  lease_ttl_s: 120\n",
        "agents:\n  - role: WRITER\n    description: Writes docs.\n",
    )
    monkeypatch.setenv("GITHUB_BROKER_LEASES__LEASE_TTL_S", "90")
    settings = load_settings(tmp_path)
    assert [r.full_name for r in settings.repositories] == ["acme/widgets"]
    assert settings.leases.lease_ttl_s == 90
    assert settings.roles == ["WRITER"]


def test_broken_yaml_names_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "repositories: [acme/widgets\nleases: {\n")
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path)
    assert str(tmp_path / "broker.yaml") in str(e.value) and "line" in str(e.value)


def test_wrong_value_names_field_and_fix(tmp_path: Path) -> None:
    write(tmp_path, "leases:\n  lease_ttl_s: -5\n")
    with pytest.raises(ConfigError) as e:
        load_settings(tmp_path)
    message = str(e.value)
    assert "broker.yaml" in message and "leases.lease_ttl_s" in message and "Fix:" in message


def test_unknown_field_suggests_the_right_one(tmp_path: Path) -> None:
    write(tmp_path, "poll:\n  intervl_s: 5\n")
    with pytest.raises(ConfigError, match="did you mean `interval_s`"):
        load_settings(tmp_path)


def test_bad_agents_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, "", "agents:\n  - description: no role here\n")
    with pytest.raises(ConfigError, match=r"agents\.yml"):
        load_settings(tmp_path)


def test_prompt_with_unknown_placeholder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "development.md").write_text("Work on $branch for $customer\n")
    with pytest.raises(ConfigError, match=r"\$customer"):
        Prompts.load(tmp_path)


def test_cli_reports_broken_config_in_one_paragraph_without_traceback(tmp_path: Path) -> None:
    write(tmp_path, "leases:\n  lease_ttl_s: soon\n")
    proc = subprocess.run(
        [sys.executable, "-m", "github_broker", "--config", str(tmp_path), "sync"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "leases.lease_ttl_s" in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_empty_agent_tokens_file_does_not_open_the_server(tmp_path: Path) -> None:
    (tmp_path / "tokens.yml").write_text("")
    write(tmp_path, f"server:\n  host: 0.0.0.0\n  agent_tokens_file: {tmp_path / 'tokens.yml'}\n")
    with pytest.raises(ConfigError, match="holds no tokens"):
        load_settings(tmp_path)


def test_agent_ids_that_are_labels_are_refused_in_the_token_map(tmp_path: Path) -> None:
    tokens = "    BACKENDCODER: tok-1-0123456789ab\n    claude-1: tok-2-0123456789ab\n"
    write(tmp_path, "server:\n  agent_tokens:\n" + tokens)
    with pytest.raises(ConfigError, match="BACKENDCODER"):
        load_settings(tmp_path)
