"""What maintainers see: queues, leases, skipped issues, and why an agent gets what it gets."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from github_broker.clock import iso_from_ms
from github_broker.rules import priority_of_score
from github_broker.settings import Settings
from github_broker.store import RepoStore, Store


class Verdict(BaseModel):
    issue: int
    priority: int | None
    verdict: str  # next | queued | held | skipped | outside_bucket | role | waiting
    detail: str


class RepoStatus(BaseModel):
    repository: str
    bucket: int | None
    ready_by_priority: dict[str, int]
    leases: list[dict[str, Any]]
    skipped: dict[int, dict[str, str]]
    pending_github_writes: int
    #: Age in seconds of the oldest due GitHub write (0: GitHub is up to date).
    github_write_lag_s: float = 0.0
    last_full_sync: str | None
    sync_cursor: str | None


async def repo_status(rstore: RepoStore) -> RepoStatus:
    ready = await rstore.ready_tasks()
    by_priority: dict[str, int] = {}
    for _, score in ready:
        key = f"P{priority_of_score(score)}"
        by_priority[key] = by_priority.get(key, 0) + 1
    state = await rstore.sync_state()
    full_at = state.get("full_at")
    return RepoStatus(
        repository=rstore.repository,
        bucket=await rstore.bucket(),
        ready_by_priority=dict(sorted(by_priority.items(), key=lambda kv: int(kv[0][1:]))),
        leases=[
            {
                "issue": lease.issue,
                "agent_id": lease.agent_id,
                "task_type": lease.task_type,
                "claimed_at": iso_from_ms(lease.claimed_ms),
                "expires_at": iso_from_ms(lease.expires_ms),
            }
            for lease in await rstore.leases()
        ],
        skipped={n: r.model_dump() for n, r in sorted((await rstore.skipped()).items())},
        pending_github_writes=await rstore.outbox_size(),
        github_write_lag_s=round(await rstore.outbox_lag_s(), 3),
        last_full_sync=iso_from_ms(int(float(full_at) * 1000)) if full_at else None,
        sync_cursor=state.get("since"),
    )


async def status(store: Store) -> dict[str, Any]:
    quota = await store.quota()
    return {
        "repositories": [(await repo_status(r)).model_dump() for r in store.repos.values()],
        "github_quota": quota.model_dump() if quota else None,
        "poller_leader": await store.leader_id(),
    }


async def explain(rstore: RepoStore, settings: Settings, roles: list[str] | None) -> list[Verdict]:
    """For an agent with `roles`, what each open work issue would do for it, in order."""
    work = await rstore.work_priorities()
    tasks = await rstore.task_index()
    ready = dict(await rstore.ready_tasks())
    held = {lease.issue: lease for lease in await rstore.leases()}
    skipped = await rstore.skipped()
    bucket = await rstore.bucket()
    strict = settings.priority_mode == "strict"
    verdicts: list[Verdict] = []
    numbered = {int(t.split(":")[1]): (t, v) for t, v in tasks.items()}
    first = True
    for task_id, score in sorted(ready.items(), key=lambda kv: (kv[1], kv[0])):
        n = int(task_id.split(":")[1])
        prio = priority_of_score(score)
        role = tasks.get(task_id, (0.0, "", ""))[1]
        if roles and role not in roles:
            verdicts.append(
                Verdict(
                    issue=n,
                    priority=prio,
                    verdict="role",
                    detail=f"needs role {role}, not one of yours",
                )
            )
        elif strict and bucket is not None and prio > bucket:
            verdicts.append(
                Verdict(
                    issue=n,
                    priority=prio,
                    verdict="outside_bucket",
                    detail=f"P{prio} waits while P{bucket} work is open",
                )
            )
        elif first:
            first = False
            verdicts.append(
                Verdict(
                    issue=n,
                    priority=prio,
                    verdict="next",
                    detail=f"{task_id.split(':')[0]} task you would get now",
                )
            )
        else:
            verdicts.append(
                Verdict(
                    issue=n,
                    priority=prio,
                    verdict="queued",
                    detail="claimable, behind the tasks above",
                )
            )
    listed = {v.issue for v in verdicts}
    for n, lease in sorted(held.items()):
        verdicts.append(
            Verdict(
                issue=n,
                priority=work.get(n),
                verdict="held",
                detail=f"{lease.task_type} held by {lease.agent_id} until "
                f"{iso_from_ms(lease.expires_ms)}",
            )
        )
        listed.add(n)
    for n, reason in sorted(skipped.items()):
        if n not in listed:
            verdicts.append(
                Verdict(
                    issue=n,
                    priority=work.get(n),
                    verdict="skipped",
                    detail=f"{reason.code}: {reason.reason}",
                )
            )
            listed.add(n)
    rest = [n for n in sorted(work) if n not in listed and n not in numbered]
    for issue in await rstore.get_issues(rest):
        labels = ", ".join(issue.labels)
        verdicts.append(
            Verdict(
                issue=issue.number,
                priority=work.get(issue.number),
                verdict="waiting",
                detail=f"not development work now ({labels})",
            )
        )
    return verdicts
