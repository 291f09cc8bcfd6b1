"""The `github-broker` command's papercuts: pipes, config errors, empty configs, labels."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from github_broker import __version__, logs
from github_broker.cli.main import main
from github_broker.gateway.label_set import cmd_labels_init, label_set
from github_broker.sandbox.servers import port_free
from github_broker.settings import DEFAULTS_DIR, load_settings
from github_broker.simulator import Simulator
from tests.factories import body
from tests.world import simulated

ROOT = Path(__file__).resolve().parent.parent
NO_CONFIG = str(Path(__file__).parent / "no-config")


@pytest.fixture(autouse=True)
def restore_logging(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """main() configures the root logger; leave it as the test found it (lines still queued
    go to this test's captured stderr)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    logs.flush()
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """No broker variables from the machine; config from the embedded defaults."""
    for name in list(os.environ):
        if name.startswith("GITHUB_BROKER_") or name == "GITHUB_TOKEN":
            monkeypatch.delenv(name)
    monkeypatch.setenv("GITHUB_BROKER_CONFIG_DIR", NO_CONFIG)
    yield monkeypatch


def _cli(*args: str, env: dict[str, str], stdout: int | None = subprocess.PIPE) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "github_broker", *args],
        env={**os.environ, "GITHUB_BROKER_CONFIG_DIR": NO_CONFIG, **env},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _many_issues(n: int) -> list[dict[str, object]]:
    return [
        {"number": i, "title": f"Task {i}", "body": body(), "labels": ["P1", "BACKENDCODER"]}
        for i in range(1, n + 1)
    ]


@pytest.mark.slow
def test_explain_and_status_into_a_closed_pipe_end_quietly(redis_url: str) -> None:
    with simulated(_many_issues(300)) as sim:
        env = {
            "GITHUB_BROKER_REPOSITORIES": "acme/widgets",
            "GITHUB_BROKER_REDIS__URL": redis_url,
            "GITHUB_BROKER_GITHUB__BASE_URL": sim.base_url,
            "GITHUB_BROKER_GITHUB__TOKEN": "test-token",
        }
        assert _cli("sync", env=env).returncode == 0
        for command in ("explain", "status --json"):
            piped = subprocess.run(
                f"{sys.executable} -m github_broker {command} | head -2",
                shell=True,
                env={**os.environ, "GITHUB_BROKER_CONFIG_DIR": NO_CONFIG, **env},
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            assert len(piped.stdout.splitlines()) == 2
            assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
        # Deterministic: the reader is gone before the first byte is written.
        read, write = os.pipe()
        os.close(read)
        closed = subprocess.run(
            [sys.executable, "-m", "github_broker", "explain"],
            env={**os.environ, "GITHUB_BROKER_CONFIG_DIR": NO_CONFIG, **env},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
        os.close(write)
    assert closed.stderr == ""
    assert closed.returncode == 141


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"github-broker {__version__}"


def test_missing_config_directory_is_an_error(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["--config", str(tmp_path / "nonexistent"), "status"]) == 2
    err = capsys.readouterr().err
    assert "nonexistent: no such directory" in err and "Traceback" not in err


def test_config_error_names_the_environment_variable(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("GITHUB_BROKER_REPOSITORIES", "acme/widgets")
    clean_env.setenv("GITHUB_BROKER_LEASES__LEASE_TTL_S", "99999")
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "environment variable GITHUB_BROKER_LEASES__LEASE_TTL_S" in err
    assert "broker.yaml" not in err


def test_config_error_names_the_host_option(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve hands --host to its workers through this variable: restore it afterwards.
    clean_env.setenv("GITHUB_BROKER_SERVER__HOST", "127.0.0.1")
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host" in err and "not loopback" in err
    assert "broker.yaml" not in err and "GITHUB_BROKER_SERVER__HOST" not in err


def test_config_error_in_the_file_still_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broker.yaml").write_text("leases:\n  lease_ttl_s: 99999\n")
    with pytest.raises(Exception, match=r"broker\.yaml: field `leases`"):
        load_settings(tmp_path)


@pytest.mark.parametrize("command", ["status", "explain"])
def test_status_and_explain_say_when_no_repository_is_configured(
    command: str, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([command]) == 2
    assert "no repositories configured" in capsys.readouterr().err


def test_bad_app_private_key_is_one_line(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("GITHUB_BROKER_REPOSITORIES", "acme/widgets")
    clean_env.setenv("GITHUB_BROKER_GITHUB__APP_ID", "1")
    clean_env.setenv("GITHUB_BROKER_GITHUB__APP_INSTALLATION_ID", "2")
    clean_env.setenv("GITHUB_BROKER_GITHUB__APP_PRIVATE_KEY", "not a key")
    assert main(["sync"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "not a PEM private key" in err and "Traceback" not in err


def test_sync_without_a_token_says_so(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("GITHUB_BROKER_REPOSITORIES", "acme/widgets")
    clean_env.setenv("GITHUB_BROKER_GITHUB__BASE_URL", "http://127.0.0.1:9")
    assert main(["sync"]) == 2
    assert "no GitHub credentials" in capsys.readouterr().err


def test_sync_prints_its_summary(
    clean_env: pytest.MonkeyPatch, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with simulated(_many_issues(3)) as sim:
        clean_env.setenv("GITHUB_BROKER_REPOSITORIES", "acme/widgets")
        clean_env.setenv("GITHUB_BROKER_REDIS__URL", redis_url)
        clean_env.setenv("GITHUB_BROKER_GITHUB__BASE_URL", sim.base_url)
        clean_env.setenv("GITHUB_TOKEN", "test-token")
        assert main(["sync"]) == 0
    assert "acme/widgets: full pass" in capsys.readouterr().out


def test_labels_init_lists_once_when_every_label_exists(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Simulator({"repositories": [{"owner": "acme", "name": "widgets"}]}) as sim:
        clean_env.setenv("GITHUB_BROKER_GITHUB__BASE_URL", sim.base_url)
        clean_env.setenv("GITHUB_BROKER_GITHUB__TOKEN", "test-token")
        args = argparse.Namespace(config=tmp_path / "no-config", repo="acme/widgets")
        # The default pacing of writes (0.75 s) is what made this take 10 s.
        assert load_settings(args.config).github.seconds_between_writes > 0.5
        clean_env.setenv("GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES", "0")
        assert cmd_labels_init(args) == 0
        clean_env.delenv("GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES")
        sim.stats.reset()
        started = time.monotonic()
        assert cmd_labels_init(args) == 0
        elapsed = time.monotonic() - started
        calls = sim.stats.snapshot()
    assert calls["by_method"] == {"GET": 1}, calls
    assert elapsed < 5.0  # was 10 s: one paced POST per label
    assert " 0 created" in capsys.readouterr().out


def test_labels_init_and_readme_agree_on_p0_to_p4() -> None:
    names = [name for name, _, _ in label_set(load_settings(DEFAULTS_DIR))]
    assert [n for n in names if n.startswith("P")] == ["P0", "P1", "P2", "P3", "P4"]
    assert "`P0`…`P4`" in (ROOT / "README.md").read_text()


def test_config_prompts_are_files_equal_to_the_packaged_defaults() -> None:
    shipped = sorted((DEFAULTS_DIR / "prompts").glob("*.md"))
    assert shipped
    for default in shipped:
        copy = ROOT / "config" / "prompts" / default.name
        assert not copy.is_symlink(), f"{copy} is a symlink: a copied config/ would lose it"
        assert copy.read_text() == default.read_text(), f"{copy} differs from {default}"


def test_a_port_in_time_wait_counts_as_free() -> None:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    # The server side closes first, as a stopped sandbox does: its end goes to TIME-WAIT.
    conn.close()
    server.close()
    time.sleep(0.1)
    client.close()
    # A plain bind is refused now (the old check said "in use"); uvicorn's bind is not.
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    assert port_free("127.0.0.1", port)
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", port))
        held.listen()
        assert not port_free("127.0.0.1", port)


def test_make_sandbox_passes_args() -> None:
    out = subprocess.run(
        ["make", "-n", "sandbox", "ARGS=--port 8099 --agents 2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "github-broker sandbox --port 8099 --agents 2" in out


def test_json_log_format_from_the_environment(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from github_broker.cli.main import build_parser

    clean_env.setenv("GITHUB_BROKER_LOG_FORMAT", "json")
    assert build_parser().parse_args(["status"]).log_format == "json"
    clean_env.delenv("GITHUB_BROKER_LOG_FORMAT")
    assert build_parser().parse_args(["status"]).log_format == "text"
