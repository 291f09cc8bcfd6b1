"""The one package that talks to Redis: connections, Lua scripts, typed reads and writes.

`Store` (shared.py) holds every repository's `RepoStore` (repo.py) and the keys they share;
what it keeps per agent (the agent mutex, where an agent may hold a task, paused agents) is
in agents.py.
A `RepoStore` is made of one class per concern, as rq splits its registries: the issue
mirror (mirror.py), claims and leases (leases.py), review and fix tasks (reviews.py), the
GitHub write queue (write_queue.py), webhook deliveries (webhooks.py), the timeline
(timeline.py) and its history (history.py), the dependency graph (graph.py), over what they
share (base.py); `Store.logins` (logins.py) is the dashboard's login throttle and sessions.
Connections are in connection.py, the Lua scripts' loading in scripts.py; key names live in
`github_broker.keys`, the scripts in `github_broker/lua/`.
"""

from github_broker.store.connection import MEMORY_URL, connect, flush_memory
from github_broker.store.mirror import UpsertResult
from github_broker.store.repo import RepoStore
from github_broker.store.scripts import context_prelude
from github_broker.store.shared import RESUBSCRIBED, Store
from github_broker.store.timeline import TIMELINE_MAX

__all__ = [
    "MEMORY_URL",
    "RESUBSCRIBED",
    "TIMELINE_MAX",
    "RepoStore",
    "Store",
    "UpsertResult",
    "connect",
    "context_prelude",
    "flush_memory",
]
