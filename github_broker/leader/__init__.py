"""The leader's work: what exactly one poller process does at a time.

`poller.py` (the daemon: leader lease, schedules), `sync.py` (GitHub's open issues into the
mirror and its indexes), `reviews.py` + `review_timers.py` (review tasks, fix tasks,
`review-done`), `outbox.py` (applies the queued GitHub writes), `progress.py` (progress,
stalls and budgets of held tasks), `deliveries.py` + `budget.py` (queued webhook deliveries
applied, within their share of the quota), `graph.py` (GitHub's dependencies and sub-issues
read and kept in every served repository), `audit_file.py` (the audit log's long-term copy).
"""
