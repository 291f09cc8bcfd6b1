"""One repository's store: its parts (mirror, leases, reviews, write queue, webhooks,
timeline, control, checks) over one client, one key set and the deployment's scripts."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from github_broker.keys import RepoKeys
from github_broker.models import SCORE_GROUP
from github_broker.settings import Settings
from github_broker.store.checks import ChecksStore
from github_broker.store.control import ControlStore
from github_broker.store.ended import EndedLeases
from github_broker.store.graph import GraphStore
from github_broker.store.history import HISTORY_MINUTE_TTL_S, History
from github_broker.store.leases import LeaseRegistry
from github_broker.store.mirror import IssueMirror
from github_broker.store.reviews import ReviewStore
from github_broker.store.scripts import Scripts
from github_broker.store.timeline import TIMELINE_MAX, Timeline
from github_broker.store.tokens import Signer
from github_broker.store.webhooks import WebhookQueue
from github_broker.store.write_queue import WriteQueue

#: How long the reason a lease ended stays readable for a late heartbeat.
LEASE_END_TTL_S = 86400


class RepoStore(
    IssueMirror,
    LeaseRegistry,
    ReviewStore,
    WriteQueue,
    WebhookQueue,
    Timeline,
    ControlStore,
    History,
    ChecksStore,
    GraphStore,
):
    """Redis state of one repository: every part's reads and writes."""

    def __init__(
        self, client: aioredis.Redis, scripts: Scripts, keys: RepoKeys, settings: Settings
    ) -> None:
        self.client = client
        self.scripts = scripts
        self.keys = keys
        self.settings = settings
        self.repository = keys.full_name
        #: Longest one store call may take, reconnects included (seconds).
        self.call_timeout_s = settings.redis.socket_timeout_s
        # Sent with every script call: encoded once here, not by redis-py per call. The
        # scripts are the deployment's (compiled with `shared_context`): they find this
        # repository's other keys from KEYS[1] and its name, ARGV[1].
        self._fixed = fixed_keys(keys)
        self._name_arg = keys.full_name.encode()
        #: Signs the lease tokens agents get, and checks them (tokens.py).
        self.signer = Signer.from_settings(settings)
        #: The lease ends this process heard (the deployment's Store shares one).
        self.ended = EndedLeases()
        self.durable_wait = durability_command(settings)

    @property
    def context(self) -> dict[str, Any]:
        """This repository's whole script context, as scripts compiled for it alone would
        have it (benchmarks/lua_cost.py compiles earlier versions of the scripts so)."""
        return script_context(self.keys, self.settings)


def fixed_keys(keys: RepoKeys) -> list[bytes]:
    """The KEYS of every repository script, in the order `_lib.lua` `context` reads them."""
    return [
        key.encode()
        for key in (
            keys.tasks,
            keys.ready,
            keys.work,
            keys.leases,
            keys.intent,
            keys.outbox,
            keys.outbox_data,
            keys.skipped,
            keys.open,
            keys.reviewing,
        )
    ]


def shared_context(settings: Settings) -> dict[str, Any]:
    """The constants the deployment's scripts are compiled with: the rules' names, times and
    bounds, the events channel, and each of a repository's key names as a suffix of its key
    base (`_lib.lua` `context` completes them: the base is KEYS[1] less `tasks_suffix_len`
    bytes), so one compiled script set serves every repository."""
    sample = RepoKeys(settings.redis.key_prefix, "o", "n")
    suffixes = {
        name: value.removeprefix(sample.base)
        for name, value in _key_context(sample).items()
        if value.startswith(sample.base)
    }
    return {
        **_rule_context(settings),
        "events": sample.events,
        "key_suffixes": suffixes,
        "tasks_suffix_len": len(sample.tasks) - len(sample.base),
    }


def script_context(keys: RepoKeys, settings: Settings) -> dict[str, Any]:
    """The repository's constants the scripts are compiled with: where its keys are, and
    the rules' names, times and bounds (store/scripts.py `context_prelude`)."""
    return {**_key_context(keys), **_rule_context(settings)}


def _key_context(keys: RepoKeys) -> dict[str, Any]:
    return {
        "issue": keys.issue_prefix,
        "lock": keys.lock_prefix,
        "lease": keys.lease_prefix,
        "agent": keys.agent_task_prefix,
        "cand": keys.candidate_prefix,
        "ready_role": keys.ready_role_prefix,
        "tomb": keys.lease_end_prefix,
        "review": keys.review_detected_prefix,
        "review_state": keys.review_state_prefix,
        "version": keys.issue_version_prefix,
        "fix": keys.fix_prefix,
        "outbox_attempts": keys.outbox_attempts,
        "events": keys.events,
        "timeline": keys.timeline,
        "handout": keys.handout_prefix,
        "cooldowns": keys.cooldowns_prefix,
        "reserved": keys.reserved_prefix,
        "task_failures": keys.task_failures,
        "agent_streaks": keys.agent_streaks,
        "streak_first": keys.streak_first,
        "instant_failures": keys.instant_failures,
        "trips": keys.trips,
        "failure_charges": keys.failure_charges,
        "revived": keys.revived,
        "recovering": keys.recovering,
        "paused_agents": keys.paused_agents,
        "control": keys.control,
        "waiting": keys.waiting,
        "reservations": keys.reservations,
        "usage": keys.usage,
        "kept_away": keys.kept_away,
        "reserved_issues": keys.reserved_issues,
        "audit": keys.audit,
        "idx": keys.idx,
        "quarantine": keys.quarantine,
        "repository": keys.full_name,
        "fence": keys.fence,
        "mirror": keys.mirror,
        "server": keys.server,
        "orphans": keys.orphans,
        "outbox_taken": keys.outbox_taken,
        "sync": keys.sync,
        "sync_pages": keys.sync_pages,
        "history": keys.history_minute_prefix,
        "history_unfolded": keys.history_unfolded,
        "deps": keys.graph_deps,
        "dependents": keys.graph_dependents,
        "dep_state": keys.graph_state,
        "blocked": keys.graph_blocked,
        "order": keys.graph_order,
        "cycles": keys.graph_cycles,
        "repository_lower": keys.full_name.lower(),
    }


def _rule_context(settings: Settings) -> dict[str, Any]:
    return {
        "timeline_max": TIMELINE_MAX,
        "history_minute_s": HISTORY_MINUTE_TTL_S,
        "in_progress": settings.labels.in_progress,
        "needs_review": settings.labels.needs_review,
        "lease_ms": settings.leases.lease_ttl_s * 1000,
        "agent_s": settings.leases.agent_task_ttl_s,
        "cand_s": settings.leases.candidate_ttl_s,
        "tomb_s": LEASE_END_TTL_S,
        "author_fallback_ms": int(settings.review.author_fallback_s * 1000),
        "fix_author_ms": int(settings.checks.author_first_s * 1000),
        "priority_unit": 4 * SCORE_GROUP,
        "indexed": len(settings.repositories) > 1,
        "roles": sorted(set(settings.roles) | ({settings.review.review_role} - {None})),
        "audit_max": settings.audit.max_entries,
        "people_hold": settings.bucket_holds_for_people,
        "breaker_streak": settings.failures.breaker_streak,
        "instant_failures_allowed": settings.failures.instant_failures_allowed,
        "budget_tokens": settings.budgets.tokens,
        "budget_cost": settings.budgets.cost,
        "needs_human": settings.labels.needs_human,
        "settle_grace_ms": int(settings.leases.settle_grace_s * 1000),
        "max_failures": settings.failures.max_failures,
        "cooldown_s": settings.failures.cooldown_s,
        "keep_away_ms": settings.steering.revoke_keeps_agent_away_s * 1000,
        # Whether any cool-down can exist (failures or revokes): the claim reads them only then.
        "cools": settings.failures.cooldown_s > 0
        or settings.steering.revoke_keeps_agent_away_s > 0,
        **_graph_context(settings),
    }


def _graph_context(settings: Settings) -> dict[str, Any]:
    """The dependency rules the claim and graph_save.lua apply (docs/dependencies.md)."""
    deps = settings.dependencies
    done = ["completed"]
    if deps.not_planned == "unblock":
        done += ["not_planned", "duplicate"]
    return {"graph": deps.enabled, "dep_done": done, "after_handout": deps.after_handout}


def durability_command(settings: Settings) -> tuple[Any, ...]:
    """The command sent after a write that must be durable before it is answered
    (`redis.durability`); empty for none."""
    redis_settings = settings.redis
    if redis_settings.durability == "replica":
        return ("WAIT", redis_settings.durable_replicas, redis_settings.durable_timeout_ms)
    if redis_settings.durability == "aof":
        # Checked against the server at start (Store.check_durability).
        return ("WAITAOF", 1, 0, redis_settings.durable_timeout_ms)
    return ()
