"""Every Redis key name, and nothing else.

All keys of one repository share the prefix ``{key_prefix}:{repo::<owner>::<name>}:`` (owner
and name URL-encoded). The braces are a Redis Cluster hash tag: every key of a repository
lives in one slot, so each multi-key Lua script touches a single slot.

Seed schema (``seeds/001``), kept verbatim after the prefix:

======================================  ===========  ===============================  ======
key                                     type         content                          TTL
======================================  ===========  ===============================  ======
``issue:{n}``                           string JSON  cached GitHub issue              none
``issue_lock_{n}``                      string       agent id holding the lease       600 s
``review_issue_detected_timestamp:{n}`` string       ISO 8601 UTC, needs-review seen  none
``agent_current_task:{agent}``          string       issue number the agent holds     3600 s
``task_candidate:{n}:{agent}``          string JSON  hand-out record and status       86400 s
                                                     (and the lease token while assigned)
``task:fix:{pr}``                       string JSON  fix task from review comments    86400 s
======================================  ===========  ===============================  ======

Added by this project (no TTL unless said):

=======================  ======  ==============================================================
``lease:{n}``            hash    agent, token, task_id, task_type, claimed_ms, expires_ms,
                                 beats (heartbeats), note + note_ms (the agent's progress note),
                                 progress + progress_ms (the last progress and when), stalled
                                 (evidence), paused (a budget reached: JSON), notes
                                 (maintainers' notes not delivered yet), used_tokens + used_cost
                                 (this attempt's reported usage), continues (JSON: the
                                 reassignment it continues), budget_since_ms (a retry
                                 restarts the wall-clock budget), checks_note (the overlap
                                 the agent was last told of, checks_upkeep.lua);
                                 ``contested`` (JSON ``[{n, t}]``) on a lease adopted after a
                                 loss: other issues GitHub labels for the same agent, waiting
                                 for its next lease call; deleted when the lease ends
                                 (``issue_lock_{n}`` carries the TTL)
``leases``               zset    issue number -> lease expiry (ms): the reaper's index
``lease_end:{token}``    string  why the lease with this token ended (TTL 1 day)
``tasks``                hash    task id (``development:{n}``, ``review:{n}``, ``fix:{n}``) ->
                                 ``score|role|pr|author|since_ms|branch``: every task the
                                 rules allow, held or not
``ready``                zset    task id -> score: the tasks in ``tasks`` not held now
``ready:{role}``         zset    the same, one per role
``work``                 zset    issue number -> priority of every open work issue (bucket)
``skipped``              hash    issue number -> JSON reason it is not handed out
``open``                 set     numbers of the open issues mirrored in ``issue:{n}``
``sync``                 hash    sync cursors: ``since``, the incremental ETag, default branch,
                                 ``full_at`` and ``synced_at`` (epoch seconds of the last passes)
``sync:pages``           hash    full pass: per page its ETag and the issue numbers on it
``intent``               hash    number -> JSON ``{add, remove, on, v}``: label writes still
                                 to do, labels written but not yet seen by a sync; kept
                                 until a sync sees it applied
``outbox``               zset    write job (``labels:{n}``, ``branch:{n}``) -> due time (ms)
``outbox:data``          hash    write job -> JSON payload (branch jobs)
``outbox:attempts``      hash    write job -> times GitHub refused it (4xx) so far
``outbox:taken``         hash    write job -> epoch of the leader that has it in hand; a new
                                 leader makes these due at once
``reviewing``            set     issues whose labels (with pending writes) say needs-review
``review_state:{n}``     hash    dev_agent, pr, payload, reviewed, handled, fix_rounds,
                                 review_done, needs_human, merged_pr (the linked PR, once
                                 seen merged), link (JSON: linked PR or null,
                                 due time), ci_rounds + ci_history (fix and rebase rounds
                                 from checks, leader/checks.py); deleted with the
                                 needs-review label
``quarantine``           string  until when (ms) nothing new is handed out after the mirror was
                                 rebuilt from a loss: agents prove their leases with their signed
                                 tokens meanwhile (one heartbeat interval)
``idx``                  string  this repository's line in the deployment's index of
                                 repositories with work: ``<bucket>|<any ready>|<roles with
                                 ready tasks>`` (several repositories only; repo_index.py)
``timeline``             stream  recent events (kind, n, agent, detail): claims, lease ends,
                                 GitHub writes; capped ``MAXLEN ~ 2000``
``outbox:stats``         hash    applied, refused, dropped: GitHub write outcomes so far
``history:m:{minute}``   hash    counts of the timeline events the scripts wrote in that minute
                                 (epoch ms // 60000; store/history.py names the fields) and
                                 the leader's sample of the queue by priority and of the work
                                 waiting on a person; TTL 24 h + 1 min
``history:unfolded``     zset    minute -> minute: the minutes with events not yet folded into
                                 their hour and the totals (the scripts add a minute with its
                                 hash; the leader's history_fold.lua takes it out when it folds
                                 it, once the timeline's last id is past it); readers add these
                                 minutes' events to the hours and the totals
``history:h:{hour}``     hash    the same counts per hour (epoch ms // 3600000): its minutes'
                                 events as folded, and the samples summed with their number
                                 (written by each sample); TTL 26 h
``history:total``        hash    the same counts since the start, folded minutes only (exported
                                 by /metrics with the unfolded minutes); its fields grow with the
                                 agents seen, not with traffic
``fence``                string  highest leader epoch that wrote this repository's mirror or
                                 write queue; scripts refuse a caller with a lower one
``mirror``               string  the time (ms) a complete sync pass finished: the mirror is
                                 rebuilt (gone after Redis lost its data)
``server``               string  "<run_id> <mark>": the redis-server this repository's data
                                 was last checked on, and the mark the leader wrote then.
                                 Another server (a restart that loaded a persistence file, a
                                 failover) and not the leader's last mark: the data may be
                                 older than GitHub, and the leader rebuilds it from GitHub
``sync:failing``         string  JSON {reason, since_ms, kind}: why the leader's sync of this
                                 repository keeps failing (404, 403, unreachable, ...) and
                                 since when; set while it fails, gone after a successful pass
                                 or the TTL. With several repositories, one whose mirror is not
                                 rebuilt and that is marked so is left out of claims
``orphans``              hash    issue -> first time (ms) a sync saw it ``in-progress`` with no
                                 single agent label and no lease; cleaned after the lease TTL
``handout:{agent}:{rid}``  string  JSON ``{n, task_id, token}`` handed out for that request id
                                 (TTL: the lease TTL): a repeated request gets the same lease
``task_failures``        hash    issue number -> failures charged so far (the first failure of
                                 each agent's streak); cleared by a completion or when the issue
                                 gets needs-human
``cooldowns:{agent}``    zset    issue number -> until (ms): the agent's cool-down on the issues
                                 it failed, abandoned or let expire (``failures.cooldown_s``)
``agent_streaks``        hash    agent id -> consecutive failures, cleared by a completion
``streak_first``         hash    agent id -> the issue its streak's one charged failure went to
                                 (given back if the circuit breaker trips)
``instant_failures``     hash    agent id -> failures in a row reported inside the settle grace
``trips``                list    agents the circuit breaker paused here since the poller's last
                                 sweep (it pauses them in every repository)
``failure_charges``      hash    issue number -> JSON list of the agents whose failures it was
                                 charged with in this round (a convicted agent's is taken back)
``recovering``           hash    issue number -> agent: a development lease rebuilt from labels
                                 after a loss that its agent never proved; the leader reads
                                 GitHub (a PR: completed; none: back to the pool)
``revived``              list    issues given up (needs-human) on a convicted agent's charge and
                                 revived: the leader indexes their tasks again
``paused_agents``        hash    agent id -> JSON ``{kind: pause|stop|breaker, by, reason,
                                 at_ms}``: this repository's copy of the deployment's paused
                                 agents (the claim reads it atomically)
``control``              hash    ``repo`` / ``broker`` -> JSON pause (maintenance): nothing new
                                 is handed out here while either is set
``waiting``              hash    issue number -> JSON ``{code, since_ms, detail, prio, by, rank,
                                 what}``: work that waits on a person (awaiting_feedback,
                                 needs_human, budget, held, no_pr) and who decided it; out of
                                 the strict bucket unless ``bucket_holds_for_people``
``reserved:{agent}``     string  JSON ``{task_id, n, from, by, reason, note, progress, at_ms}``:
                                 a task a maintainer reassigned to the agent (TTL: lease TTL)
``reservations``         zset    issue number -> until (ms) a reservation waits; then its task
                                 returns to the pool
``reserved_issues``      hash    issue number -> the reservation's JSON (as ``reserved:{agent}``,
                                 with the ``rank`` of who reassigned it): a later reassignment
                                 by a lower authority is refused
``kept_away``            hash    issue number -> JSON list of agents a person revoked it from
                                 (each in its ``cooldowns:{agent}`` until
                                 ``steering.revoke_keeps_agent_away_s``; a retry lets them back)
``usage``                hash    issue number -> JSON ``{tokens, cost}`` its attempts reported
                                 (since the last retry), and ``tokens_budget`` /
                                 ``cost_budget`` when a retry raised the issue's budget
``audit``                stream  actions by maintainers and the broker (actor, action, n, agent,
                                 reason, outcome); capped ``MAXLEN ~ audit.max_entries``
``webhooks``             list    verified GitHub deliveries waiting for the leader's worker
``webhooks:inflight``    list    deliveries the worker took and has not finished (re-queued
                                 when a worker starts, so a crash loses none)
``webhooks:seen_ms``     string  ms time of the last verified delivery (webhook health)
``webhook_delivery:{id}`` string X-GitHub-Delivery already queued (TTL ``delivery_ttl_s``)
``webhook_body:{sha256}`` string the SHA-256 of a signed delivery body already queued (TTL
                                 ``delivery_ttl_s``): a replay under a fresh delivery id is
                                 refused (the signature covers the body, not the id)
``issue_version:{n}``    string  ``updated_at`` of the newest GitHub state a webhook applied
                                 (``~`` once deleted or transferred); TTL 1 day
``comments``             hash    the poller's read of new issue comments (comment commands):
                                 ``since`` (newest ``updated_at`` read) and ``etag`` of the
                                 listing's first page, so an unchanged listing is a free 304
``comment:{id}``         string  an issue comment whose ``/broker`` commands were taken up (by
                                 the webhook worker or the poller), so each runs once; TTL
                                 ``commands.max_age_s`` + 10 min
``permission:{login}``   string  the repository permission GitHub reported for that login
                                 (lower case): ``admin``, ``write``, ``read``, ``none``;
                                 TTL ``commands.permission_cache_s``
``checks``               hash    issue number -> JSON: what the broker last read of the CI and
                                 mergeability of the issue's PR (head, base, checks with their
                                 state, mergeable, files) and its verdict (running, failed,
                                 conflict, green, ...); entries of PRs no longer tracked
                                 are dropped by the leader's next pass (docs/checks.md)
``graph:deps``           hash    issue -> JSON list of the refs (``owner/name#n``) of its
                                 blockers as GitHub last listed them; ``?hidden`` / ``?error``
                                 for one GitHub counts but did not show / could not be read
``graph:dependents``     hash    blocker ref -> JSON list of the issues here it blocks (the
                                 reverse of ``graph:deps``)
``graph:state``          hash    blocker ref -> what the leader last learnt of it: ``open``,
                                 ``completed``, ``not_planned``, ``duplicate``, ``unserved``
                                 (a blocker of this repository is read from ``open`` first)
``graph:blocked``        hash    issue -> ``<ref> <state>``: the blocker that keeps it from
                                 being handed out, as the leader last judged (reports, metrics;
                                 the claim judges again itself)
``graph:order``          hash    sub-issue -> JSON ``{parent, pos, base_s}``: its place in its
                                 parent's order (the task score's order time)
``graph:cycles``         hash    issue -> JSON list of refs: the dependency cycle it is on
``credential:{n}``       string  JSON ``{nonce, token, expires_at, permissions}``: the scoped
                                 GitHub token minted for the lease on n (its nonce); TTL the
                                 token's own expiry; taken when the lease completes or is
                                 released (and the token revoked)
=======================  ======  ==============================================================

Deployment-wide keys: ``{key_prefix}:events`` (pub/sub: ``ready`` whenever a task becomes
claimable in any repository, ``idx <repository> <line>`` whenever a repository's ``idx``
changes), ``{key_prefix}:agent_repos:{agent}`` (sorted set: the repositories where the agent
may hold a task or a remembered request id -> when it was last pointed at (ms): before each
claim there, by each heartbeat there and by the sync's adoption of a lease there; read in the
round trip that takes ``agent_busy``; a request settles and replays in those alone),
``{key_prefix}:leader`` (the poller's leader lease: ``id`` of the holder),
``{{key_prefix}:leader}:epoch`` (the last leader epoch handed out; same Cluster slot as the
leader key; never expires), ``{key_prefix}:quota`` (the last GitHub
rate-limit headers seen) and ``{key_prefix}:timeline`` (stream of deployment-wide events
such as leader changes, capped like the repositories' ones) and
``{key_prefix}:agent_busy:{agent}`` (a short mutex, held while one request of that agent
settles and claims across several repositories, so concurrent requests of one agent never
claim in two of them; its scripts refuse to run past the hold, read on Redis's clock),
``{key_prefix}:history:sampled`` (sorted set: the minutes the leader sampled the queues
in, minute -> minute, the last 24 h),
``{key_prefix}:agents`` (hash: agent id -> JSON pause, the deployment's record that each
repository's ``paused_agents`` copies), ``{key_prefix}:control`` (hash: ``broker`` -> JSON
pause of the whole broker), ``{key_prefix}:audit`` (stream: deployment-wide actions such as
pausing an agent or the broker) and ``{key_prefix}:webhooks:refused`` (hash: ``at_ms``,
``reason``, ``count`` of webhook deliveries refused, e.g. for a wrong signature: their body is
not trusted, so no repository is named) and ``{key_prefix}:audit:exported`` (hash: audit
stream key -> the last entry id appended to the ``audit.file`` JSONL file) and
``{key_prefix}:graph:repos`` (set: the repositories some of whose issues have blockers; the
leader mirrors a blocker's state into these).

The dashboard's keys share the hash tag ``{<key_prefix>:ui}``: ``{<key_prefix>:ui}:logins:<client>``
(hash ``fails``, ``until_ms``: one client's failed logins and the end of its delay, the client
named by a digest of its address, an IPv6 one of its /64; TTL ``signin.login_forget_s``),
``{<key_prefix>:ui}:session:<id>`` (string, JSON: whom a dashboard session names, ``{via:
token, name, stamp}`` or ``{via: github, login}``; deleted by logout, TTL the session's),
``{<key_prefix>:ui}:secret`` (string: the dashboard's secret, the HMAC key of its cookies and
CSRF tokens, made once with SET NX; never expires) and ``{<key_prefix>:ui}:device:<id>``
(string, JSON: a GitHub device-flow sign-in waiting for its code; TTL the code's).

``{key_prefix}:rights:<login>`` (hash: served repository -> ``role|read_ms``, the role GitHub
gave that GitHub login there when last read, at sign-in or per repository; entries older than
``signin.github_rights_s`` are ignored, the key expires after it).
"""

from __future__ import annotations

from urllib.parse import quote


def _enc(part: str) -> str:
    # '{' and '}' must never appear inside the hash tag, so encode everything unsafe.
    return quote(part, safe="")


class RepoKeys:
    """Key names for one repository."""

    def __init__(self, key_prefix: str, owner: str, name: str) -> None:
        self.full_name = f"{owner}/{name}"
        self.base = f"{key_prefix}:{{repo::{_enc(owner)}::{_enc(name)}}}:"
        # The deployment's channel: one subscription per process, however many repositories.
        self.events = f"{key_prefix}:events"
        self._prefixes()
        self._fixed()
        self._from_github()

    def _prefixes(self) -> None:
        """Prefixes that Lua scripts complete with an issue number or agent id."""
        self.issue_prefix = self.base + "issue:"
        self.lock_prefix = self.base + "issue_lock_"
        self.review_detected_prefix = self.base + "review_issue_detected_timestamp:"
        self.agent_task_prefix = self.base + "agent_current_task:"
        self.candidate_prefix = self.base + "task_candidate:"
        self.fix_prefix = self.base + "task:fix:"
        self.lease_prefix = self.base + "lease:"
        self.ready_role_prefix = self.base + "ready:"
        self.lease_end_prefix = self.base + "lease_end:"
        self.review_state_prefix = self.base + "review_state:"
        self.handout_prefix = self.base + "handout:"
        self.cooldowns_prefix = self.base + "cooldowns:"
        self.reserved_prefix = self.base + "reserved:"

    def _fixed(self) -> None:
        """Fixed keys: the mirror, the claims' indexes, the write queue, steering."""
        self.leases = self.base + "leases"
        self.tasks = self.base + "tasks"
        self.ready = self.base + "ready"
        self.work = self.base + "work"
        self.skipped = self.base + "skipped"
        self.open = self.base + "open"
        self.sync = self.base + "sync"
        self.sync_pages = self.base + "sync:pages"
        self.intent = self.base + "intent"
        self.outbox = self.base + "outbox"
        self.outbox_data = self.base + "outbox:data"
        self.outbox_attempts = self.base + "outbox:attempts"
        self.idx = self.base + "idx"
        self.quarantine = self.base + "quarantine"
        self.reviewing = self.base + "reviewing"
        self.timeline = self.base + "timeline"
        self.outbox_stats = self.base + "outbox:stats"
        self.history_minute_prefix = self.base + "history:m:"
        self.history_hour_prefix = self.base + "history:h:"
        self.history_total = self.base + "history:total"
        self.history_unfolded = self.base + "history:unfolded"
        self.fence = self.base + "fence"
        self.mirror = self.base + "mirror"
        self.server = self.base + "server"
        self.sync_failing = self.base + "sync:failing"
        self.orphans = self.base + "orphans"
        self.outbox_taken = self.base + "outbox:taken"
        self._failures()
        self._steering()
        self._graph()

    def _failures(self) -> None:
        """Failed attempts: per task and per agent, the circuit breaker's trips, recovery."""
        self.task_failures = self.base + "task_failures"
        self.agent_streaks = self.base + "agent_streaks"
        self.streak_first = self.base + "streak_first"
        self.instant_failures = self.base + "instant_failures"
        self.trips = self.base + "trips"
        self.failure_charges = self.base + "failure_charges"
        self.revived = self.base + "revived"
        self.recovering = self.base + "recovering"

    def _steering(self) -> None:
        """What maintainers decide: pauses, waits on a person, reservations, budgets, audit."""
        self.paused_agents = self.base + "paused_agents"
        self.control = self.base + "control"
        self.waiting = self.base + "waiting"
        self.reservations = self.base + "reservations"
        self.usage = self.base + "usage"
        self.kept_away = self.base + "kept_away"
        self.reserved_issues = self.base + "reserved_issues"
        self.audit = self.base + "audit"

    def _graph(self) -> None:
        """GitHub's dependency graph as the leader reads it (leader/graph.py, graph_save.lua)."""
        self.graph_deps = self.base + "graph:deps"
        self.graph_dependents = self.base + "graph:dependents"
        self.graph_state = self.base + "graph:state"
        self.graph_blocked = self.base + "graph:blocked"
        self.graph_order = self.base + "graph:order"
        self.graph_cycles = self.base + "graph:cycles"

    def _from_github(self) -> None:
        """What arrives from GitHub beside the sync: webhook deliveries, issue comments and
        their commenters' permissions."""
        self.webhooks = self.base + "webhooks"
        self.webhooks_inflight = self.base + "webhooks:inflight"
        self.webhooks_seen = self.base + "webhooks:seen_ms"
        self.webhook_delivery_prefix = self.base + "webhook_delivery:"
        self.webhook_body_prefix = self.base + "webhook_body:"
        self.issue_version_prefix = self.base + "issue_version:"
        self.comments = self.base + "comments"
        self.comment_prefix = self.base + "comment:"
        self.permission_prefix = self.base + "permission:"
        #: CI and mergeability of the tracked PRs (leader/checks.py).
        self.checks = self.base + "checks"
        self.credential_prefix = self.base + "credential:"

    def issue(self, number: int) -> str:
        return f"{self.issue_prefix}{number}"

    def issue_lock(self, number: int) -> str:
        return f"{self.lock_prefix}{number}"

    def review_detected(self, number: int) -> str:
        return f"{self.review_detected_prefix}{number}"

    def agent_current_task(self, agent_id: str) -> str:
        return f"{self.agent_task_prefix}{agent_id}"

    def task_candidate(self, number: int, agent_id: str) -> str:
        return f"{self.candidate_prefix}{number}:{agent_id}"

    def fix_task(self, pr_number: int) -> str:
        return f"{self.fix_prefix}{pr_number}"

    def lease(self, number: int) -> str:
        return f"{self.lease_prefix}{number}"

    def review_state(self, number: int) -> str:
        return f"{self.review_state_prefix}{number}"

    def ready_role(self, role: str) -> str:
        return f"{self.ready_role_prefix}{role}"

    def handout(self, agent_id: str, request_id: str) -> str:
        return f"{self.handout_prefix}{agent_id}:{request_id}"

    def cooldowns(self, agent_id: str) -> str:
        return f"{self.cooldowns_prefix}{agent_id}"

    def reserved(self, agent_id: str) -> str:
        return f"{self.reserved_prefix}{agent_id}"

    def history_minute(self, minute: int) -> str:
        """History of one minute (epoch ms // 60000)."""
        return f"{self.history_minute_prefix}{minute}"

    def history_hour(self, hour: int) -> str:
        """History of one hour (epoch ms // 3600000)."""
        return f"{self.history_hour_prefix}{hour}"

    def webhook_delivery(self, delivery_id: str) -> str:
        return f"{self.webhook_delivery_prefix}{delivery_id}"

    def webhook_body(self, digest: str) -> str:
        return f"{self.webhook_body_prefix}{digest}"

    def issue_version(self, number: int) -> str:
        return f"{self.issue_version_prefix}{number}"

    def comment(self, comment_id: int) -> str:
        return f"{self.comment_prefix}{comment_id}"

    def permission(self, login: str) -> str:
        return f"{self.permission_prefix}{login.lower()}"

    def credential(self, number: int) -> str:
        """The GitHub token minted for the lease on issue n (to hand it again, to revoke it)."""
        return f"{self.credential_prefix}{number}"


class GlobalKeys:
    """Keys shared by all repositories of one deployment."""

    def __init__(self, key_prefix: str) -> None:
        self.leader = f"{key_prefix}:leader"
        # The hash tag puts the epoch in the leader key's slot (leader.lua touches both).
        self.leader_epoch = f"{{{key_prefix}:leader}}:epoch"
        self.quota = f"{key_prefix}:quota"
        self.events = f"{key_prefix}:events"
        self.timeline = f"{key_prefix}:timeline"
        self.agent_busy_prefix = f"{key_prefix}:agent_busy:"
        self.agent_repos_prefix = f"{key_prefix}:agent_repos:"
        self.agents = f"{key_prefix}:agents"
        self.agents_seen = f"{key_prefix}:agents:seen"
        self.kept_away = f"{key_prefix}:kept_away"
        self.control = f"{key_prefix}:control"
        self.audit = f"{key_prefix}:audit"
        self.webhooks_refused = f"{key_prefix}:webhooks:refused"
        self.audit_exported = f"{key_prefix}:audit:exported"
        self.history_sampled = f"{key_prefix}:history:sampled"
        self.graph_repos = f"{key_prefix}:graph:repos"
        # One hash tag for the dashboard's keys.
        ui = f"{{{key_prefix}:ui}}"
        self.ui_logins_prefix = f"{ui}:logins:"
        self.ui_session_prefix = f"{ui}:session:"
        self.ui_secret = f"{ui}:secret"
        self.ui_device_prefix = f"{ui}:device:"
        self.rights_prefix = f"{key_prefix}:rights:"

    def agent_repos(self, agent_id: str) -> str:
        """Where `agent_id` may hold a task: repository -> when it last claimed there (ms)."""
        return f"{self.agent_repos_prefix}{agent_id}"

    def agent_busy(self, agent_id: str) -> str:
        """Held while one request of `agent_id` settles and claims across repositories."""
        return f"{self.agent_busy_prefix}{agent_id}"

    def ui_client_logins(self, client: str) -> str:
        """Dashboard login attempts of one client (`client`: a digest of its address)."""
        return f"{self.ui_logins_prefix}{client}"

    def ui_session(self, session_id: str) -> str:
        return f"{self.ui_session_prefix}{session_id}"

    def ui_device(self, attempt: str) -> str:
        """A GitHub device-flow sign-in waiting for the person to enter its code."""
        return f"{self.ui_device_prefix}{attempt}"

    def rights(self, login: str) -> str:
        """Where GitHub makes `login` a maintainer: repository -> role, as last read."""
        return f"{self.rights_prefix}{login.lower()}"
