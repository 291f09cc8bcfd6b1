"""Redis time of one claim script call, by INFO commandstats, for two script versions.

    .venv/bin/python -m benchmarks.lua_cost [--issues 100000] [--ref main] [--blocks 15]

Starts its own redis-server on a free port and fills one repository with ``--issues``
ready issues through the store's own sync script (``sync_upsert.lua``, batches of 200 as
the sync sends them). The filled data set is saved, and each script version gets a
redis-server of its own that loads it: the versions never read each other's keys (a
key-schema change stays comparable) and start from the same memory layout. Two flows are
timed:

- ``settle+claim``: one agent asks again and again with ``previous=completed`` (the
  original's request-task loop): each call ends the held lease as completed and claims the
  next task;
- ``claim``: a new agent id per call, holding nothing: an explicit claim without a settle.

Each block resets the server's statistics (``CONFIG RESETSTAT``), runs ``--calls`` calls
of one flow and one version, and reads ``INFO commandstats``: µs per EVALSHA (the time
Redis spent inside the script, its inner commands included) and the inner commands per
call (every command but EVALSHA). Blocks alternate between the versions; the report gives
the median and range of the blocks' µs per call, and the same for the server's CPU time per
call (its main thread's run time from /proc: request parsing and reply included, but not
the time it waited for a core, so less disturbed by a busy machine). Default settings but
no settle grace (agents ask again at once to say "done", as ``make bench``'s do); the
failure cool-downs stay on, so a claim also checks the agent's cool-down on its task.

``--ref`` names the git revision whose ``github_broker/lua`` scripts are the baseline
(``git show REF:github_broker/lua/...``), compiled with the working tree's repository
context (plus the ``lock`` prefix and the history's hour and totals keys, should the
working tree no longer have them); ``--ref ''``
times the working tree alone.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from benchmarks.scenarios import Bench
from benchmarks.servers import REPOSITORY, free_port
from github_broker.claim.rules import Rules
from github_broker.keys import RepoKeys
from github_broker.leader.sync import UPSERT_BATCH, index_item
from github_broker.models import Claimed, Issue
from github_broker.settings import Settings, load_settings
from github_broker.simulator.seed import generate_issues
from github_broker.store import RepoStore, Store
from github_broker.store.history import HISTORY_HOUR_TTL_S
from github_broker.store.scripts import Scripts, context_prelude

ROOT = Path(__file__).resolve().parent.parent
#: Commands of the harness itself, never a script's.
OWN = frozenset(
    {
        "evalsha",
        "eval",
        "info",
        "config|resetstat",
        "config",
        "ping",
        "script|load",
        "client|setinfo",
        "select",
    }
)


def _settings(redis_url: str) -> Settings:
    return load_settings(
        Path(tempfile.gettempdir()) / "gb-lua-cost-no-config",
        repositories=[REPOSITORY],
        redis={"url": redis_url},
        github={"base_url": "http://127.0.0.1:9", "token": "bench-token"},
        leases={"settle_grace_s": 0},
    )


class Server:
    """A redis-server of our own on a free port (optionally started from an RDB file)."""

    def __init__(self, workdir: Path, rdb: Path | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed (make install-redis)")
        workdir.mkdir(parents=True, exist_ok=True)
        if rdb is not None:
            shutil.copy(rdb, workdir / "dump.rdb")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
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
                str(workdir),
                "--dbfilename",
                "dump.rdb",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = redis.Redis(port=self.port, decode_responses=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.ping()
                return
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.05)

    def stats(self) -> dict[str, dict[str, int]]:
        raw = cast(dict[str, Any], self.client.info("commandstats"))
        return {
            k.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
            for k, v in raw.items()
        }

    def cpu_ns(self) -> int:
        """CPU time of the server's main thread (the one that runs scripts) so far, in ns:
        unlike commandstats it does not count the time the thread waited for a core."""
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/schedstat") as f:
            return int(f.read().split()[0])

    def stop(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def _issues(count: int) -> list[Issue]:
    out = []
    for data in generate_issues(count):
        data = {
            **data,
            "updated_at": data["created_at"],
            "user": {"login": "maintainer"},
            "html_url": f"https://github.com/{REPOSITORY}/issues/{data['number']}",
            "node_id": f"I_kw{data['number']:08d}",
        }
        out.append(Issue.from_github(data))
    return out


async def fill(url: str, count: int) -> None:
    """`count` ready issues through sync_upsert.lua, then the mirror marked rebuilt."""
    settings = _settings(url)
    store = Store.from_settings(settings)
    rstore = store.repo(REPOSITORY)
    rules = Rules(settings)
    issues = _issues(count)
    for start in range(0, count, UPSERT_BATCH):
        batch = [index_item(rules, i, "main") for i in issues[start : start + UPSERT_BATCH]]
        await rstore.upsert_issues(batch)
    await rstore.save_sync_state({"default_branch": "main"}, rebuilt=True)
    await store.close()


def _git_lua(ref: str, name: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:github_broker/lua/{name}.lua"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def _git_has(ref: str, name: str) -> bool:
    """Whether revision `ref` has script `name` (an older one may lack a newer script)."""
    return (
        subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}:github_broker/lua/{name}.lua"],
            capture_output=True,
        ).returncode
        == 0
    )


@dataclass
class Block:
    """One block's figures, per script call."""

    us: float  #: commandstats: µs inside EVALSHA
    cpu_us: float  #: the server's CPU time (request parsing and reply included)
    commands: float  #: inner commands
    inner: dict[str, tuple[float, float]]  #: command -> (calls, µs)


class Version:
    """One script version on its own server: a store whose claim script is that version's."""

    def __init__(self, label: str, server: Server, ref: str | None, tag: int) -> None:
        self.label, self.server, self.ref, self.tag = label, server, ref, tag
        self.settings = _settings(server.url)
        self.store = Store.from_settings(self.settings)
        self.rstore: RepoStore = self.store.repo(REPOSITORY)
        if ref is not None:
            context = dict(self.rstore.context)
            keys = RepoKeys("gb", *REPOSITORY.split("/"))
            context.setdefault("lock", keys.base + "issue_lock_")
            # Before the history's fold, the scripts counted in the hours and totals too.
            context.setdefault("history_hour", keys.history_hour_prefix)
            context.setdefault("history_total", keys.history_total)
            context.setdefault("history_hour_s", HISTORY_HOUR_TTL_S)
            lib = _git_lua(ref, "_lib")
            client = self.rstore.client
            self.rstore.scripts = Scripts(client, None)
            self.rstore.scripts.repo = {
                name: client.register_script(
                    context_prelude(context) + lib + "\n" + _git_lua(ref, name)
                )
                for name in Scripts.REPO_SCRIPTS
                if _git_has(ref, name)
            }
        for script in self.rstore.scripts.repo.values():
            server.client.script_load(script.script)
        self.serial = 0

    async def claim(self, agent: str) -> Claimed:
        got = await self.rstore.claim(
            agent, previous="completed", mode="strict", base_branch="main", roles=None
        )
        if not isinstance(got, Claimed):
            raise SystemExit(f"{self.label}: no task for {agent}: {got}")
        return got

    async def block(self, flow: str, calls: int) -> Block:
        """Run one block of `calls` calls of `flow`."""
        self.server.client.config_resetstat()
        cpu0 = self.server.cpu_ns()
        for _ in range(calls):
            if flow == "settle+claim":
                await self.claim(f"bench-settle-{self.tag}")
            else:
                self.serial += 1
                await self.claim(f"bench-new-{self.tag}-{self.serial}")
        cpu1 = self.server.cpu_ns()
        stats = self.server.stats()
        ev = stats.get("evalsha", {"calls": 0, "usec": 0})
        if ev["calls"] != calls:
            raise SystemExit(f"{self.label}: {ev['calls']} EVALSHA for {calls} calls")
        inner = {
            k: (v["calls"] / calls, v["usec"] / calls) for k, v in stats.items() if k not in OWN
        }
        return Block(
            ev["usec"] / calls,
            (cpu1 - cpu0) / 1000 / calls,
            sum(c for c, _ in inner.values()),
            inner,
        )

    async def close(self) -> None:
        await self.store.close()


#: The two flows timed, in the order they run.
FLOWS = ("settle+claim", "claim")


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


async def idle_cost(issues: int, blocks: int, calls: int) -> dict[str, dict[str, Any]]:
    """The working tree's claim script alone on an idle Redis filled with `issues` ready
    issues, per flow: µs inside EVALSHA and the server's CPU µs per call (median, min, max
    over `blocks` blocks of `calls` calls) and the commands each call runs (`make bench`'s
    `script` rows)."""
    work = Path(tempfile.mkdtemp(prefix="gb-lua-cost-"))
    server = Server(work / "0")
    version: Version | None = None
    try:
        await fill(server.url, issues)
        version = Version("working tree", server, None, 0)
        await version.claim("bench-settle-0")  # from here on the settle flow's agent holds one
        out: dict[str, dict[str, Any]] = {}
        for flow in FLOWS:
            got = [await version.block(flow, calls) for _ in range(blocks)]
            out[flow] = {
                "us": _spread([b.us for b in got]),
                "cpu_us": _spread([b.cpu_us for b in got]),
                "commands": statistics.median(b.commands for b in got),
            }
        return out
    finally:
        if version is not None:
            await version.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


#: `make bench`'s `script` rows: ready issues, blocks per flow, calls per block (full, quick).
BENCH_SIZES = {False: (20_000, 9, 200), True: (5_000, 5, 100)}


def script_figures(bench: Bench) -> None:
    """`make bench`'s `script` rows: claim.lua alone on an idle Redis of its own, per flow."""
    o = bench.options
    issues, blocks, calls = BENCH_SIZES[o.quick]
    got = asyncio.run(idle_cost(issues, blocks, calls))
    for flow, figures in got.items():
        bench.add(
            "script",
            {
                "flow": flow,
                "open_issues": issues,
                "calls": blocks * calls,
                **figures,
                "reproduce": o.reproduce("script"),
            },
        )


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):5.1f} µs ({min(values):.1f}-{max(values):.1f})"


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="gb-lua-cost-"))
    servers: list[Server] = []
    versions: list[Version] = []
    try:
        t0 = time.monotonic()
        filler = Server(work / "fill")
        try:
            await fill(filler.url, args.issues)
            filler.client.save()
            keys = filler.client.dbsize()
        finally:
            filler.stop()
        print(f"filled {args.issues} issues in {time.monotonic() - t0:.1f} s ({keys} keys)")
        # Every version's server loads the same saved data set: a server that ran the fill
        # itself has another memory layout (grown hash tables) than one that loaded it.
        refs: list[str | None] = [args.ref, None] if args.ref else [None]
        for i, ref in enumerate(refs):
            if not servers or not args.one_server:
                servers.append(Server(work / str(i), rdb=work / "fill" / "dump.rdb"))
            versions.append(Version(ref or "working tree", servers[-1], ref, i))
        for v in versions:  # warm-up: the settle flow's agent holds a task from here on
            await v.claim(f"bench-settle-{v.tag}")
        for flow in FLOWS:
            blocks: dict[str, list[Block]] = {v.label: [] for v in versions}
            for i in range(args.blocks):
                for v in versions if i % 2 == 0 else versions[::-1]:
                    blocks[v.label].append(await v.block(flow, args.calls))
            print(f"\n{flow}: {args.blocks} blocks of {args.calls} calls per version, per call:")
            for v in versions:
                got = blocks[v.label]
                print(
                    f"  {v.label:>14}: commandstats {_summary([b.us for b in got])};  "
                    f"CPU {_summary([b.cpu_us for b in got])};  "
                    f"{statistics.median(b.commands for b in got):4.1f} commands"
                )
                if args.commands:  # median block: calls per script call (µs in them)
                    inner = sorted(got, key=lambda b: b.us)[len(got) // 2].inner
                    print(
                        "      "
                        + ", ".join(
                            f"{k} {c:g} ({us:.1f})"
                            for k, (c, us) in sorted(inner.items(), key=lambda p: -p[1][1])
                        )
                    )
            if len(versions) == 2:
                for what in ("us", "cpu_us"):
                    a, b = (
                        statistics.median(getattr(x, what) for x in blocks[v.label])
                        for v in versions
                    )
                    print(f"  {what}: working tree / {versions[0].label}: {b / a:.2f}")
    finally:
        for v in versions:
            await v.close()
        for s in servers:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issues", type=int, default=100_000)
    parser.add_argument(
        "--ref", default="main", help="git revision of the baseline scripts ('' for none)"
    )
    parser.add_argument("--blocks", type=int, default=15, help="blocks per version and flow")
    parser.add_argument("--calls", type=int, default=200, help="calls per block")
    parser.add_argument(
        "--one-server",
        action="store_true",
        help="run both versions on one server (their agents apart): no bias "
        "between two servers' cores and memory, for versions that read and "
        "write the same key schema",
    )
    parser.add_argument("--commands", action="store_true", help="list the inner commands per call")
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
