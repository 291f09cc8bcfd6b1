"""Durable acknowledgements (issue 30): request-task and complete with each
`redis.durability` setting, as ratios to `none`, in the same run.

The settings reach serve by environment (`GITHUB_BROKER_REDIS__DURABILITY`,
`GITHUB_BROKER_REDIS__DURABLE_REPLICAS`, `GITHUB_BROKER_REDIS__DURABLE_TIMEOUT_MS`). The
broker refuses an environment setting it does not know at start, so each is passed only when
`RedisSettings` has the field, and the figure is skipped with a note while `durability`
itself is not a setting (or lacks the value `none` to compare against).

Every variant shares one primary (the data set's Redis) with a replica attached
(`--replicaof`, started here) and, when `aof` is measured, the append-only file switched on
(`appendfsync everysec`): the ratio is the cost of waiting for the acknowledgement, not of
replicating or of writing the file, which every variant pays alike. `aof` runs only on a
server with WAITAOF (Redis 7.2 or later). Serve runs without its poller, one per setting,
side by side; the runs alternate, the order rotating each repetition.
"""

from __future__ import annotations

import logging
import time
import typing
from contextlib import ExitStack
from typing import Any

from benchmarks.servers import RedisServer, SimulatorProcess

logger = logging.getLogger("benchmarks")

#: The settings compared, the first being the one the others are divided by.
SETTINGS = ("none", "replica", "aof")
#: Flows measured with each setting: the original's request-task (asking again completes
#: the held task) and claim, then complete with the lease token.
FLOWS = ("request-task", "claim-complete")
#: Replicas a `replica` acknowledgement waits for.
DURABLE_REPLICAS = 1
#: Milliseconds an acknowledgement may wait for its replica or the file.
DURABLE_TIMEOUT_MS = 1000
#: Seconds the primary's AOF rewrite may take once appendonly is switched on.
AOF_TIMEOUT_S = 600.0


def _fields() -> dict[str, Any]:
    from github_broker.settings import RedisSettings

    return dict(RedisSettings.model_fields)


def unavailable() -> str | None:
    """Why the figure cannot run on this broker (None: it can)."""
    fields = _fields()
    if "durability" not in fields:
        return ("skipped: `redis.durability` is not a setting of this broker yet "
                "(github_broker.settings.RedisSettings has no such field)")
    allowed = _allowed(fields["durability"])
    if allowed and SETTINGS[0] not in allowed:
        return f"skipped: `redis.durability` takes {sorted(allowed)}, not {SETTINGS[0]!r}"
    return None


def _allowed(field: Any) -> set[str]:
    """The values a Literal (or Enum) field takes; empty when it is free text."""
    annotation = field.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return {str(v) for v in typing.get_args(annotation)}
    members = getattr(annotation, "__members__", None)
    return {str(getattr(m, "value", m)) for m in members.values()} if members else set()


def setting_env(setting: str) -> dict[str, str]:
    """The environment that selects `setting`, with only the fields the broker has."""
    fields = _fields()
    env = {"GITHUB_BROKER_REDIS__DURABILITY": setting}
    if setting != "none" and "durable_timeout_ms" in fields:
        env["GITHUB_BROKER_REDIS__DURABLE_TIMEOUT_MS"] = str(DURABLE_TIMEOUT_MS)
    if setting == "replica" and "durable_replicas" in fields:
        env["GITHUB_BROKER_REDIS__DURABLE_REPLICAS"] = str(DURABLE_REPLICAS)
    return env


def variants(primary: RedisServer) -> tuple[list[str], list[str]]:
    """The settings this broker and server can run, and a note for each left out."""
    allowed = _allowed(_fields()["durability"])
    run, notes = [], []
    for setting in SETTINGS:
        if allowed and setting not in allowed:
            notes.append(f"`{setting}` is not a value of `redis.durability` here")
        elif setting == "aof" and not primary.has_waitaof():
            notes.append(f"`aof` not measured: Redis {primary.version()} has no WAITAOF "
                         "(7.2 or later)")
        else:
            run.append(setting)
    return run, notes


def _aof_on(primary: RedisServer) -> None:
    client = primary.client()
    client.config_set("appendfsync", "everysec")
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + AOF_TIMEOUT_S
    while True:
        info = typing.cast(dict[str, Any], client.info("persistence"))
        if int(info.get("aof_enabled", 0)) and not int(info.get("aof_rewrite_in_progress", 0)) \
                and not int(info.get("aof_rewrite_scheduled", 0)):
            return
        if time.monotonic() > deadline:
            raise RuntimeError("the primary's AOF rewrite did not finish")
        time.sleep(0.1)


def durability_figures(bench: Any, sim: SimulatorProcess, env: dict[str, str]) -> None:
    from benchmarks.scenarios import aggregate, rotated, spread

    o = bench.options
    rep = o.reproduce("durability")
    note = unavailable()
    if note is not None:
        bench.add("durability", {"skipped": note, "reproduce": rep})
        return
    settings, notes = variants(bench.redis)
    replica = RedisServer(bench.workdir, "redis-replica", replicaof=bench.redis)
    try:
        logger.info("durability: starting a replica of the data set's Redis")
        replica.start()
        if "aof" in settings:
            _aof_on(bench.redis)
        with ExitStack() as started:
            serves = {setting: started.enter_context(bench.serve(
                env, 1, GITHUB_BROKER_SERVER__RUN_POLLER="false", **setting_env(setting)))
                for setting in settings}
            runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
            pairs = [(setting, flow) for setting in settings for flow in FLOWS]
            for r in range(o.repeats):
                done = {}
                for setting, flow in rotated(pairs, r):
                    done[(setting, flow)] = bench.load(serves[setting], sim, flow,
                                                       watch={"replica": replica})
                for (setting, flow), row in done.items():
                    row["ratio_to_none"] = row["requests_per_s"] / done[
                        (SETTINGS[0], flow)]["requests_per_s"]
                    runs.setdefault((setting, flow), []).append(row)
    finally:
        replica.stop()
        if "aof" in settings:
            bench.redis.client().config_set("appendonly", "no")
    for (setting, _flow), rows in runs.items():
        row = aggregate(rows)
        row["ratio_to_none"] = spread([r["ratio_to_none"] for r in rows])
        bench.add("durability", {**row, "setting": setting, "env": setting_env(setting),
                                 "notes": notes, "reproduce": rep})
