"""`github-broker serve`: the API workers and the poller under one supervisor, or all of it
in one process; and the Prometheus multiprocess directory they share."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

from github_broker import logs
from github_broker.processes.api_worker import ServeSpec, run_api_worker
from github_broker.processes.connections import raise_file_limit
from github_broker.processes.supervisor import Supervisor
from github_broker.settings import ENV_PREFIX, load_settings

logger = logging.getLogger(__name__)

#: prometheus-client's multiprocess directory (read when prometheus-client is imported).
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The ASGI app factory every API worker serves.
APP_FACTORY = "github_broker.api.app:create_app"


def serve(
    config: Path | None,
    *,
    host: str | None,
    port: int | None,
    workers: int,
    log_level: str,
    log_format: str,
    access_log: bool,
    single_process: bool,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code."""
    settings = load_settings(config)  # fail fast, before workers start
    host = _hand_down(config, host or settings.server.host, settings.server.host)
    port = port if port is not None else settings.server.port
    prepare_metrics_dir()
    os.environ[logs.FORMAT_ENV] = log_format  # the poller child logs alike
    spec = ServeSpec(
        app=APP_FACTORY,
        host=host,
        port=port,
        workers=workers,
        log_config=logs.uvicorn_config(log_level, log_format),
        log_level=log_level.lower(),
        access_log=access_log,
        # The poller runs beside the API workers, never inside them.
        env={} if single_process else {f"{ENV_PREFIX}SERVER__RUN_POLLER": "false"},
        max_connections=settings.server.max_connections,
        header_timeout_s=settings.server.header_timeout_s,
    )
    _raise_file_limit()
    shown = f"[{host}]" if ":" in host else host
    logger.info("serving on http://%s:%d (dashboard /ui, API reference /docs)", shown, port)
    if single_process:
        # One process: the API, and the poller inside it unless server.run_poller is false.
        run_api_worker(spec)
        return 0
    return Supervisor(spec, poller=settings.server.run_poller).run()


def _hand_down(config: Path | None, host: str, configured_host: str) -> str:
    """The config directory and a --host the workers must use, put in the environment they
    inherit; a --host is checked against the settings' rules first."""
    if config:
        os.environ[f"{ENV_PREFIX}CONFIG_DIR"] = str(config)
    if host != configured_host:
        os.environ[f"{ENV_PREFIX}SERVER__HOST"] = host
        # the loopback-without-auth rule applies to --host too
        load_settings(config, flags={f"{ENV_PREFIX}SERVER__HOST": "--host"})
    return host


def _raise_file_limit() -> None:
    before, files = raise_file_limit()  # the children inherit it
    if files > before:
        logger.info("file limit raised from %d to %d", before, files)


def prepare_metrics_dir() -> Path:
    """An empty multiprocess metrics directory for `serve` and the workers uvicorn starts.

    Must run before anything imports prometheus-client (github_broker.metrics does). An
    operator's directory is emptied (files of an earlier run would add up), otherwise a
    fresh temporary one is made and removed at exit."""
    given = os.environ.get(METRICS_DIR_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for old in path.glob("*.db"):
            old.unlink()
        return path
    path = Path(tempfile.mkdtemp(prefix="github-broker-metrics-"))
    os.environ[METRICS_DIR_ENV] = str(path)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
