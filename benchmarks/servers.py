"""The processes a benchmark runs against: redis-server, the GitHub simulator, serve, baseline."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from github_broker.keys import RepoKeys

OWNER, NAME = "acme", "widgets"
REPOSITORY = f"{OWNER}/{NAME}"
KEYS = RepoKeys("gb", OWNER, NAME)
#: Commands SLOWLOG keeps while it times every script call.
SLOWLOG_LEN = 200_000
#: SLOWLOG's threshold while it times the script calls (µs). Redis also logs each command a
#: script runs; at 0 µs that is about 45 entries per claim (one per baseline request), and the
#: logging itself costs Redis CPU in the very runs it measures. The commands inside a script
#: take a few µs each and the shortest claim script call about 20 µs, so at this threshold the
#: log holds every claim call and hardly any inner command.
SLOWLOG_THRESHOLD_US = 15
#: Seconds a process may take to answer its first request.
START_TIMEOUT_S = 60.0
#: Seconds a replica may take for its first full sync (the throughput data set's primary
#: holds 800,000 issues: an RDB of it made, sent and loaded).
REPLICA_SYNC_TIMEOUT_S = 600.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def script_shas(env: dict[str, str]) -> dict[str, str]:
    """SHA -> script name of the repository scripts a serve with `env` runs (their text holds
    the repository's compiled context, so the SHA depends on the settings)."""
    from unittest import mock

    from github_broker.settings import load_settings
    from github_broker.store import Store, connect

    broker_vars = {k: v for k, v in env.items() if k.startswith("GITHUB_BROKER_")}
    with mock.patch.dict(os.environ, broker_vars):
        settings = load_settings(Path(env["GITHUB_BROKER_CONFIG_DIR"]))
    store = Store(connect(settings.redis.url), settings)
    return {script.sha: name for name, script in store.repo(REPOSITORY).scripts.repo.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _descendants(pid: int) -> list[int]:
    """`pid` and every live process below it."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parents[int(entry)] = int(raw[raw.rindex(")") + 2 :].split()[1])
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return out


def connection_split(pid: int, port: int) -> dict[int, int]:
    """Established connections to `port` per process under `pid`: which worker serves whom."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == "01":  # 01: ESTABLISHED
                    inodes.add(fields[9])
    split: dict[int, int] = {}
    for child in _descendants(pid):
        count = 0
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{child}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{child}/fd/{fd}")
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        count += 1
        if count:
            split[child] = count
    return split


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all cores), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process and all its live descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name may contain spaces and parentheses; fields follow the last ')'.
        fields = raw[raw.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == current)
    return total


def rss_bytes(pid: int) -> int:
    """Resident memory of a live process and its live descendants (VmRSS, Linux /proc)."""
    total = 0
    for process in _descendants(pid):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{process}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def cpu_exact_s(pid: int) -> float:
    """CPU time of a live process, its threads and its live descendants, from the
    scheduler's nanosecond accounting (/proc/<pid>/task/<tid>/schedstat): for windows too
    short for cpu_seconds' 10 ms ticks (an idle server uses a few ms a second)."""
    total = 0
    for process in _descendants(pid):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{process}/task"):
                with contextlib.suppress(OSError, ValueError):
                    total += int(
                        Path(f"/proc/{process}/task/{tid}/schedstat").read_text().split()[0]
                    )
    return total / 1e9


class Process:
    """A child process with a log file, stopped by SIGTERM (SIGKILL when it hangs)."""

    def __init__(self, name: str, log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=kw.pop("stdout", log), stderr=log, **kw
            )

    def cpu_s(self) -> float:
        return cpu_seconds(self.pid)

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class RedisServer(Process):
    """Our own redis-server on a free port, never the machine's shared one; `replicaof`: a
    replica of that server (`--replicaof`), started once its first sync is done."""

    def __init__(
        self, log_dir: Path, name: str = "redis", replicaof: RedisServer | None = None
    ) -> None:
        super().__init__(name, log_dir)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = log_dir / name
        self.replicaof = replicaof

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (make install-redis)")
        self.workdir.mkdir(exist_ok=True)
        argv = [
            exe,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        if self.replicaof is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replicaof.port)]
        self.spawn(argv)
        client = self.client()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, redis.BusyLoadingError):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer") from None
                time.sleep(0.05)
        if self.replicaof is not None:
            self.wait_in_sync(time.monotonic() + REPLICA_SYNC_TIMEOUT_S)
        return self

    def wait_in_sync(self, deadline: float) -> None:
        """Until this replica's link to its primary is up (its first full sync done)."""
        while (
            cast(dict[str, Any], self.client().info("replication")).get("master_link_status")
            != "up"
        ):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} never finished its sync with the primary")
            time.sleep(0.1)

    def detach(self) -> None:
        """A replica no more (`REPLICAOF NO ONE`): a copy of its primary's data that goes its
        own way."""
        self.client().execute_command("REPLICAOF", "NO", "ONE")

    def aof_on(self, *, always: bool) -> None:
        """The append-only file on (`appendfsync always`: an fsync per write, else everysec),
        once its first rewrite is done."""
        client = self.client()
        client.config_set("appendfsync", "always" if always else "everysec")
        client.config_set("appendonly", "yes")
        deadline = time.monotonic() + REPLICA_SYNC_TIMEOUT_S
        while True:
            info = cast(dict[str, Any], client.info("persistence"))
            if (
                int(info.get("aof_enabled", 0))
                and not int(info.get("aof_rewrite_in_progress", 0))
                and not int(info.get("aof_rewrite_scheduled", 0))
            ):
                return
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}'s AOF rewrite did not finish")
            time.sleep(0.1)

    def has_waitaof(self) -> bool:
        """Whether this server knows WAITAOF (Redis 7.2 or later); asked with nothing to wait
        for, it answers at once."""
        try:
            self.client().execute_command("WAITAOF", 0, 0, 0)
        except redis.ResponseError as e:
            if "unknown command" in str(e).lower():
                return False
            raise
        return True

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)

    def command_calls(self) -> dict[str, int]:
        """`INFO commandstats` as command -> calls (commands run by Lua scripts included)."""
        stats = cast(dict[str, Any], self.client().info("commandstats"))
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}

    def script_usec(self) -> tuple[int, int]:
        """(calls, microseconds) of EVALSHA so far: the time Redis spent inside Lua scripts."""
        stats = cast(dict[str, Any], self.client().info("commandstats")).get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0)), int(stats.get("usec", 0))

    def start_script_log(self) -> None:
        """Log the duration of every command slower than SLOWLOG_THRESHOLD_US from now on, for
        `script_times`."""
        client = self.client()
        client.config_set("slowlog-max-len", SLOWLOG_LEN)
        client.config_set("slowlog-log-slower-than", SLOWLOG_THRESHOLD_US)
        client.slowlog_reset()

    def script_times(self) -> dict[str, list[int]]:
        """µs per EVALSHA call since `start_script_log`, by script SHA; stops the log."""
        client = self.client()
        entries = cast(list[dict[str, Any]], client.slowlog_get(SLOWLOG_LEN))
        client.config_set("slowlog-log-slower-than", 10_000)
        out: dict[str, list[int]] = {}
        for entry in entries:
            command = entry["command"]
            words = (command.decode() if isinstance(command, bytes) else str(command)).split()
            if len(words) > 1 and words[0].upper() == "EVALSHA":
                out.setdefault(words[1], []).append(int(entry["duration"]))
        return out

    def version(self) -> str:
        return str(cast(dict[str, Any], self.client().info("server"))["redis_version"])

    def flush(self) -> None:
        client = self.client()
        client.flushall()
        client.config_resetstat()


class SimulatorProcess(Process):
    """`benchmarks.simserver` in a child process; counters through its /_sim control API.
    `repos`: that many repositories (`simserver.repo_names`), the issues in the one at
    `work_in`; `people`: a maintainer's and an agent's token beside the broker's; `links`:
    that many dependencies among the issues (`simserver.link`)."""

    def __init__(
        self,
        log_dir: Path,
        issues: int,
        *,
        repos: int = 0,
        work_in: int = -1,
        people: bool = False,
        links: int = 0,
    ) -> None:
        super().__init__(f"simulator-{issues}" + (f"-{repos}repos" if repos else ""), log_dir)
        self.issues = issues
        self.args = ["--issues", str(issues)]
        if repos:
            self.args += ["--repos", str(repos), "--work-in", str(work_in)]
        if people:
            self.args.append("--people")
        if links:
            self.args += ["--links", str(links)]
        self.base_url = ""
        self._http = httpx.Client(timeout=60)

    def start(self) -> SimulatorProcess:
        self.spawn(
            [sys.executable, "-m", "benchmarks.simserver", *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.proc is not None and self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().decode().strip()
        if not self.base_url.startswith("http"):
            raise RuntimeError(f"simulator did not start:\n{self.log_tail()}")
        return self

    def stats(self) -> dict[str, Any]:
        return dict(self._http.get(f"{self.base_url}/_sim/stats").json())

    def reset_stats(self) -> None:
        self._http.post(f"{self.base_url}/_sim/stats/reset").raise_for_status()

    def edit_issue(self, number: int, title: str) -> None:
        url = f"{self.base_url}/_sim/issues/{OWNER}/{NAME}/{number}"
        self._http.patch(url, json={"title": title}).raise_for_status()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self._http.close()
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()  # the child serves until its stdin closes
        super().stop(sig)


def broker_env(redis_url: str, github_url: str, config_dir: Path, **extra: str) -> dict[str, str]:
    """The environment `tests/processes.py::broker_env` gives a serve process, plus `extra`."""
    env = {
        "GITHUB_BROKER_CONFIG_DIR": str(config_dir),
        "GITHUB_BROKER_REPOSITORIES": REPOSITORY,
        "GITHUB_BROKER_REDIS__URL": redis_url,
        "GITHUB_BROKER_GITHUB__BASE_URL": github_url,
        "GITHUB_BROKER_GITHUB__TOKEN": "bench-token",
        "GITHUB_BROKER_GITHUB__SECONDS_BETWEEN_WRITES": "0",
        "GITHUB_BROKER_POLL__INTERVAL_S": "1",
        "GITHUB_BROKER_POLL__OUTBOX_INTERVAL_S": "0.2",
        "GITHUB_BROKER_POLL__LEADER_TTL_S": "3",
        "GITHUB_BROKER_SERVER__RUN_POLLER": "true",
        # Benchmark agents ask again at once to say "done" (the original's request-task flow);
        # the settle grace would hand them the same task back instead.
        "GITHUB_BROKER_LEASES__SETTLE_GRACE_S": "0",
        # The claim-abandon flow gives every task back at once, by design: without this the
        # failure budget would (rightly) park the whole backlog as needs-human within seconds,
        # and the circuit breaker would pause every agent after three abandons.
        "GITHUB_BROKER_FAILURES__MAX_FAILURES": "1000000000",
        "GITHUB_BROKER_FAILURES__COOLDOWN_S": "0",
        "GITHUB_BROKER_FAILURES__BREAKER_STREAK": "0",
    }
    env.update(extra)
    return {**os.environ, **env}


class HTTPServer(Process):
    """A uvicorn-served app: `github-broker serve` or the baseline, on a free port."""

    def __init__(self, name: str, log_dir: Path, argv: list[str], env: dict[str, str]) -> None:
        super().__init__(name, log_dir)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [part.replace("{port}", str(self.port)) for part in argv]
        self.env = env

    def start(self) -> HTTPServer:
        self.spawn(self.argv, env=self.env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGINT) -> None:
        # uvicorn re-raises the signal once it has shut down: SIGTERM would then kill a
        # profiled process before pyinstrument writes, SIGINT becomes a KeyboardInterrupt.
        super().stop(sig)


def serve_argv(workers: int, profile: Path | None = None) -> list[str]:
    """`github-broker serve` as the Makefile and the tests start it, optionally profiled."""
    argv = ["-m", "github_broker", "serve", "--port", "{port}", "--workers", str(workers)]
    if profile is None:
        return [sys.executable, *argv]
    # Profiled: the API alone in the profiled process (in production the poller runs in a
    # process of its own, so it is not part of the request path either).
    return [
        sys.executable,
        "-m",
        "pyinstrument",
        "--renderer",
        "pyisession",
        "--outfile",
        str(profile),
        *argv,
        "--single-process",
    ]


def baseline_argv(workers: int, kind: str = "fastapi") -> list[str]:
    """A baseline app served like serve (processes, protocol, log level, no access log)."""
    return [
        sys.executable,
        "-m",
        "benchmarks.baseline",
        "--port",
        "{port}",
        "--workers",
        str(workers),
        "--kind",
        kind,
    ]


def size(client: redis.Redis, key: str) -> int:
    """Members of a sorted set or a set (redis-py types its sync answers as maybe-awaitable)."""
    kind = client.type(key)
    return int(cast(int, client.scard(key) if kind == "set" else client.zcard(key)))


def wait_for_ready(
    client: redis.Redis, count: int, timeout_s: float, keys: RepoKeys = KEYS
) -> float:
    """Seconds until `count` tasks are claimable (the sync has indexed the backlog)."""
    started = time.monotonic()
    while size(client, keys.ready) < count:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"only {size(client, keys.ready)} of {count} tasks became ready")
        time.sleep(0.1)
    return time.monotonic() - started


def wait_for_outbox_empty(client: redis.Redis, timeout_s: float) -> float:
    """Seconds until every queued GitHub write has been applied."""
    started = time.monotonic()
    while size(client, KEYS.outbox) > 0:
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{size(client, KEYS.outbox)} GitHub writes still queued")
        time.sleep(0.05)
    return time.monotonic() - started
