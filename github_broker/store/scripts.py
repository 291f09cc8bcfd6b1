"""The Lua scripts: loaded with their shared library, compiled once with the deployment's
context and shared by every repository (each call names its repository)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import redis.asyncio as aioredis

from github_broker.store.resp import PipelinedScript, pipelined_for


@cache
def _read(name: str) -> str:
    return (resources.files("github_broker") / "lua" / f"{name}.lua").read_text(encoding="utf-8")


def _load(name: str, with_lib: bool = True) -> str:
    text = _read(name)
    return _read("_lib") + "\n" + text if with_lib else text


def _lua_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "{" + ", ".join(_lua_literal(v) for v in value) + "}"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"[{_lua_literal(k)}] = {_lua_literal(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).encode("utf-8")
    # A decimal escape per byte outside printable ASCII, quotes and backslashes escaped.
    return (
        '"'
        + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}" for b in text)
        + '"'
    )


def context_prelude(context: dict[str, Any]) -> str:
    """Lua source defining `base_context()`: the deployment's constant context (label names,
    times, bounds), compiled into the scripts instead of sent with each call (the repository
    comes with the call: `_lib.lua` `context`). A table-valued entry becomes a function of
    its own (`key_suffixes()`), built only by the calls that read it."""
    tables = {name: v for name, v in context.items() if isinstance(v, dict)}
    fields = [f"{name} = {_lua_literal(v)}" for name, v in context.items() if name not in tables]
    # An integer also as the text a command takes (`<name>_arg`): Redis formats a number
    # argument of redis.call with "%.17g" on every call, about 0.8 µs each.
    fields += [
        f"{name}_arg = {_lua_literal(str(v))}"
        for name, v in context.items()
        if isinstance(v, int) and not isinstance(v, bool)
    ]
    functions = "".join(
        f"local function {name}() return {_lua_literal(v)} end\n" for name, v in tables.items()
    )
    return functions + f"local function base_context() return {{{', '.join(fields)}}} end\n"


class Scripts:
    """Lua scripts registered once per client (EVALSHA, loading the script on NOSCRIPT).
    Repository scripts are compiled once with the deployment's context (`context_prelude`)
    and serve every repository: one copy in this process and in Redis's script cache, however
    many repositories are configured (a copy per repository cost 1.15 MB each).
    A plain Redis client's scripts run over its pipelined connection (`resp.pipelined_for`);
    the others' (fakeredis, Cluster, TLS, Sentinel) through redis-py's `register_script`."""

    REPO_SCRIPTS = (
        "claim",
        "explain",
        "control",
        "lease_upkeep",
        "task_put",
        "checks_upkeep",
        "labels_want",
        "heartbeat",
        "finish",
        "reap",
        "sync_upsert",
        "sync_remove",
        "sync_save",
        "outbox_take",
        "outbox_done",
        "graph_save",
    )

    def __init__(self, client: aioredis.Redis, context: dict[str, Any] | None = None) -> None:
        prelude = context_prelude(context) if context is not None else ""
        pipelined = pipelined_for(client)

        def register(script: str) -> Any:
            if pipelined is not None:
                return PipelinedScript(pipelined, script)
            return client.register_script(script)

        #: Each repository script's source (with the context), for the durable path
        #: (base.py `_run_durable`: the script and WAIT on one pooled connection).
        self.sources = (
            {name: prelude + _load(name) for name in self.REPO_SCRIPTS}
            if context is not None
            else {}
        )
        self.repo = {name: register(text) for name, text in self.sources.items()}
        self.leader = register(_load("leader", with_lib=False))
        self.webhook_enqueue = register(_load("webhook_enqueue", with_lib=False))
        self.login_attempt = register(_load("login_attempt", with_lib=False))
        self.mutex_release = register(_load("mutex_release", with_lib=False))
        # With the library for its decision rules; it never calls `context()`.
        self.agent_record = register(_load("agent_record"))
        #: The pipelined client the scripts run over (None: redis-py's, see above), for
        #: callers that write several commands in one round trip (`store/agents.py`).
        self.pipelined = pipelined
