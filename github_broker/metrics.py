"""Prometheus text exposition: this process's counters plus gauges read from Redis."""

from __future__ import annotations

from collections import Counter

from github_broker.rules import priority_of_score
from github_broker.store import Store


class Metrics:
    """Counters of one process (one uvicorn worker); the gauges are deployment-wide."""

    def __init__(self) -> None:
        self.task_requests: Counter[str] = Counter()
        self.lease_refusals: Counter[str] = Counter()

    async def render(self, store: Store) -> str:
        lines = [
            "# HELP gb_task_requests_total request-task answers by this process, by result.",
            "# TYPE gb_task_requests_total counter",
            *(
                f'gb_task_requests_total{{result="{k}"}} {v}'
                for k, v in sorted(self.task_requests.items())
            ),
            "# HELP gb_lease_refusals_total 409 answers by this process, by reason.",
            "# TYPE gb_lease_refusals_total counter",
            *(
                f'gb_lease_refusals_total{{reason="{k}"}} {v}'
                for k, v in sorted(self.lease_refusals.items())
            ),
            "# HELP gb_ready_tasks claimable tasks per repository and priority.",
            "# TYPE gb_ready_tasks gauge",
        ]
        gauges: dict[str, list[str]] = {"leases": [], "writes": [], "skipped": [], "bucket": []}
        for name, rstore in store.repos.items():
            per_priority: Counter[int] = Counter(
                priority_of_score(score) for _, score in await rstore.ready_tasks()
            )
            lines += [
                f'gb_ready_tasks{{repository="{name}",priority="P{p}"}} {n}'
                for p, n in sorted(per_priority.items())
            ]
            gauges["leases"].append(
                f'gb_leases{{repository="{name}"}} {len(await rstore.leases())}'
            )
            gauges["writes"].append(
                f'gb_pending_github_writes{{repository="{name}"}} {await rstore.outbox_size()}'
            )
            gauges.setdefault("lag", []).append(
                f'gb_github_write_lag_seconds{{repository="{name}"}} '
                f"{await rstore.outbox_lag_s():.3f}"
            )
            gauges["skipped"].append(
                f'gb_skipped_issues{{repository="{name}"}} {len(await rstore.skipped())}'
            )
            bucket = await rstore.bucket()
            if bucket is not None:
                gauges["bucket"].append(f'gb_priority_bucket{{repository="{name}"}} {bucket}')
        lines += ["# HELP gb_leases live leases.", "# TYPE gb_leases gauge", *gauges["leases"]]
        lines += [
            "# HELP gb_pending_github_writes queued GitHub writes.",
            "# TYPE gb_pending_github_writes gauge",
            *gauges["writes"],
        ]
        lines += [
            "# HELP gb_github_write_lag_seconds age of the oldest due GitHub write.",
            "# TYPE gb_github_write_lag_seconds gauge",
            *gauges.get("lag", []),
        ]
        lines += [
            "# HELP gb_skipped_issues work issues that cannot be handed out.",
            "# TYPE gb_skipped_issues gauge",
            *gauges["skipped"],
        ]
        lines += [
            "# HELP gb_priority_bucket most urgent open priority (0 = P0).",
            "# TYPE gb_priority_bucket gauge",
            *gauges["bucket"],
        ]
        quota = await store.quota()
        if quota and quota.remaining is not None:
            lines += [
                "# HELP gb_github_quota_remaining GitHub REST calls left this hour.",
                "# TYPE gb_github_quota_remaining gauge",
                f"gb_github_quota_remaining {quota.remaining}",
            ]
        return "\n".join(lines) + "\n"
