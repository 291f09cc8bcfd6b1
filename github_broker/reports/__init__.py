"""What maintainers see, read from Redis and never written: `status.py` (queues, leases,
reviews, skipped issues), `explain.py` (the claim's own judgement for one agent), `health.py`
(the integrations' health), `overview.py` (one snapshot of all of it for the dashboard and
the CLI), `blockers.py` (what keeps an issue waiting in the dependency graph, in words),
`render.py` (the snapshot as aligned text tables) and `trends.py` (the history over the last
hour or day, for the dashboard's charts)."""
