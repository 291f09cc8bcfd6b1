"""Durable acknowledgements (issue 30): request-task and complete with each
`redis.durability` setting, as ratios to `none`, in the same run.

The settings reach serve by environment (`GITHUB_BROKER_REDIS__DURABILITY`,
`GITHUB_BROKER_REDIS__DURABLE_REPLICAS`, `GITHUB_BROKER_REDIS__DURABLE_TIMEOUT_MS`, the last
two at the broker's own defaults). The broker refuses an environment setting it does not
know at start, so each is passed only when `RedisSettings` has the field, and the figure is
skipped with a note while `durability` itself is not a setting (or lacks `none`).

`none` and `replica` run against the data set's Redis with a replica attached
(`redis-server --replicaof`, started here; `none` pays the replication stream too, so their
ratio is the wait for the replica's acknowledgement). `aof` runs against a copy of the data
set: a second redis-server that synced as a replica and was then detached (`REPLICAOF NO
ONE`), with the append-only file on as docs/operations.md asks: `appendonly yes` and, below
Redis 7.2 (no WAITAOF), `appendfsync always`, which the broker checks at start. Its ratio is
what the setting costs on the server it needs: the wait for WAITAOF, or an fsync per write.
Serve runs without its poller, one per setting, side by side; the runs alternate, the order
rotating each repetition.
"""

from __future__ import annotations

import logging
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


def _fields() -> dict[str, Any]:
    from github_broker.settings import RedisSettings

    return dict(RedisSettings.model_fields)


def unavailable() -> str | None:
    """Why the figure cannot run on this broker (None: it can)."""
    fields = _fields()
    if "durability" not in fields:
        return (
            "skipped: `redis.durability` is not a setting of this broker yet "
            "(github_broker.settings.RedisSettings has no such field)"
        )
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
    """The environment that selects `setting`: the wait's bounds at the broker's defaults,
    only the fields the broker has."""
    fields = _fields()
    env = {"GITHUB_BROKER_REDIS__DURABILITY": setting}
    if setting != "none" and "durable_timeout_ms" in fields:
        env["GITHUB_BROKER_REDIS__DURABLE_TIMEOUT_MS"] = str(fields["durable_timeout_ms"].default)
    if setting == "replica" and "durable_replicas" in fields:
        # One replica is started here: wait for it, whatever the default says.
        env["GITHUB_BROKER_REDIS__DURABLE_REPLICAS"] = "1"
    return env


def variants() -> tuple[list[str], list[str]]:
    """The settings this broker takes, and a note for each left out."""
    allowed = _allowed(_fields()["durability"])
    run = [s for s in SETTINGS if not allowed or s in allowed]
    notes = [f"`{s}` is not a value of `redis.durability` here" for s in SETTINGS if s not in run]
    return run, notes


def durability_figures(bench: Any, sim: SimulatorProcess, env: dict[str, str]) -> None:
    from benchmarks.scenarios import aggregate, rotated, spread

    o = bench.options
    rep = o.reproduce("durability")
    note = unavailable()
    if note is not None:
        bench.add("durability", {"skipped": note, "reproduce": rep})
        return
    settings, notes = variants()
    replica = RedisServer(bench.workdir, "redis-replica", replicaof=bench.redis)
    copy = RedisServer(bench.workdir, "redis-aof", replicaof=bench.redis)
    benches = {setting: bench for setting in settings}
    envs = {setting: env for setting in settings}
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        logger.info("durability: a replica of the data set's Redis")
        replica.start()
        if "aof" in settings:
            logger.info("durability: a copy of the data set with its append-only file on")
            copy.start()
            copy.detach()
            waitaof = copy.has_waitaof()
            copy.aof_on(always=not waitaof)
            notes.append(
                f"`aof` on Redis {copy.version()}: "
                + (
                    "WAITAOF, `appendfsync everysec`"
                    if waitaof
                    else "no WAITAOF (7.2), so `appendfsync always` (an fsync per write)"
                )
            )
            benches["aof"] = type(bench)(o, bench.workdir, copy, bench.figures)
            envs["aof"] = {**env, "GITHUB_BROKER_REDIS__URL": copy.url}
        with ExitStack() as started:
            serves = {
                setting: started.enter_context(
                    bench.serve(
                        envs[setting],
                        1,
                        GITHUB_BROKER_SERVER__RUN_POLLER="false",
                        **setting_env(setting),
                    )
                )
                for setting in settings
            }
            pairs = [(setting, flow) for setting in settings for flow in FLOWS]
            for r in range(o.repeats):
                logger.info("durability: repetition %d of %d", r + 1, o.repeats)
                done = {}
                for setting, flow in rotated(pairs, r):
                    done[(setting, flow)] = benches[setting].load(
                        serves[setting], sim, flow, watch={"replica": replica}
                    )
                for (setting, flow), row in done.items():
                    row["ratio_to_none"] = (
                        row["requests_per_s"] / done[(SETTINGS[0], flow)]["requests_per_s"]
                    )
                    runs.setdefault((setting, flow), []).append(row)
    finally:
        copy.stop()
        replica.stop()
    for (setting, _flow), rows in runs.items():
        row = aggregate(rows)
        row["ratio_to_none"] = spread([r["ratio_to_none"] for r in rows])
        bench.add(
            "durability",
            {
                **row,
                "setting": setting,
                "env": setting_env(setting),
                "notes": notes,
                "reproduce": rep,
            },
        )
