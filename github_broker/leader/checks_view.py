"""A tracked PR's CI and mergeability as the broker keeps it (the `checks` record), built from
GitHub's GraphQL answer or webhook payloads, and what it means: the verdict, a fix task's
payload, overlapping PRs. Pure functions: no Redis, no GitHub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from github_broker.clock import ms_from_iso, span
from github_broker.settings import ChecksSettings

#: Conclusions of a check that count as passed (GitHub's own rule for required checks).
PASSING = frozenset({"SUCCESS", "NEUTRAL", "SKIPPED"})
#: Status context states still running.
PENDING_STATES = frozenset({"PENDING", "EXPECTED"})
#: Kinds of fix a tracked PR gets, and the prompt template each uses.
TEMPLATES = {"checks": "fix_checks", "conflict": "rebase"}


def clip(text: str | None, limit: int) -> str:
    text = text or ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ----- the record ----------------------------------------------------------------------------


def check_state(status: str | None, conclusion: str | None) -> str:
    """pending | passing | failing | approval (a run that waits for a person's action)."""
    if (status or "COMPLETED").upper() != "COMPLETED":
        return "pending"
    conclusion = (conclusion or "").upper()
    if conclusion in PASSING:
        return "passing"
    if conclusion == "ACTION_REQUIRED":
        return "approval"
    if conclusion == "STALE":
        return "pending"
    return "failing"


def context_state(state: str) -> str:
    state = state.upper()
    if state == "SUCCESS":
        return "passing"
    return "pending" if state in PENDING_STATES else "failing"


def _annotations(nodes: list[dict[str, Any]], limit: int, chars: int) -> list[dict[str, Any]]:
    out = []
    for a in nodes[:limit]:
        line = ((a.get("location") or {}).get("start") or {}).get("line")
        out.append(
            {
                "path": str(a.get("path") or ""),
                "line": int(line) if isinstance(line, int) else None,
                "level": str(a.get("annotationLevel") or a.get("annotation_level") or "").lower(),
                "title": clip(a.get("title"), 200),
                "message": clip(a.get("message"), chars),
            }
        )
    return out


def checks_from_rollup(
    rollup: dict[str, Any] | None, cfg: ChecksSettings
) -> dict[str, dict[str, Any]]:
    """Each check run and status context of a commit's rollup, by name."""
    out: dict[str, dict[str, Any]] = {}
    for node in ((rollup or {}).get("contexts") or {}).get("nodes") or []:
        if node.get("__typename") == "StatusContext":
            out[str(node["context"])] = {
                "state": context_state(str(node.get("state") or "")),
                "conclusion": str(node.get("state") or "").lower(),
                "summary": clip(node.get("description"), cfg.max_text_chars),
                "url": node.get("targetUrl") or "",
            }
            continue
        notes = node.get("annotations") or {}
        out[str(node["name"])] = {
            "state": check_state(node.get("status"), node.get("conclusion")),
            "conclusion": str(node.get("conclusion") or node.get("status") or "").lower(),
            "summary": clip(node.get("summary") or node.get("title"), cfg.max_text_chars),
            "url": node.get("detailsUrl") or "",
            "id": node.get("databaseId"),
            "annotations": _annotations(
                notes.get("nodes") or [], cfg.max_annotations, cfg.max_text_chars
            ),
            "annotations_count": int(notes.get("totalCount") or 0),
        }
    return out


def from_graphql(
    node: dict[str, Any], cfg: ChecksSettings, before: dict[str, Any] | None, now: int
) -> dict[str, Any]:
    """A PR node of the polling read as a record (`before`: the last one, for what a read
    does not say: when its head was first seen)."""
    commit = (((node.get("commits") or {}).get("nodes") or [{}])[0] or {}).get("commit") or {}
    head = str(node.get("headRefOid") or commit.get("oid") or "")
    approval = []
    for suite in (commit.get("checkSuites") or {}).get("nodes") or []:
        if str(suite.get("conclusion") or "").upper() == "ACTION_REQUIRED":
            run = suite.get("workflowRun") or {}
            name = (run.get("workflow") or {}).get("name") or (suite.get("app") or {}).get("slug")
            approval.append({"workflow": str(name or "workflow"), "url": run.get("url") or ""})
    mergeable = {"MERGEABLE": True, "CONFLICTING": False}.get(str(node.get("mergeable")))
    files = node.get("files") or {}
    same_head = before is not None and before.get("head") == head
    return {
        "pr": int(node["number"]),
        "url": node.get("url") or "",
        "state": str(node.get("state") or "OPEN"),
        "draft": bool(node.get("isDraft")),
        "author": str((node.get("author") or {}).get("login") or ""),
        "created_ms": ms_from_iso(str(node["createdAt"])) if node.get("createdAt") else now,
        "branch": str(node.get("headRefName") or ""),
        "head": head,
        "base": str(node.get("baseRefName") or ""),
        "mergeable": mergeable,
        "merge_state": str(node.get("mergeStateStatus") or "UNKNOWN"),
        "files": sorted(str(f["path"]) for f in files.get("nodes") or []),
        "files_total": int(files.get("totalCount") or 0),
        "size": int(node.get("additions") or 0) + int(node.get("deletions") or 0),
        "checks": checks_from_rollup(commit.get("statusCheckRollup"), cfg),
        "approval": approval,
        "pushed_ms": before["pushed_ms"] if same_head and before else now,
        "read_ms": now,
        "need_read": mergeable is None and str(node.get("state") or "OPEN") == "OPEN",
    }


def failing_on(target: dict[str, Any] | None) -> list[str]:
    """Names of the checks failing on a base branch's tip (the polling read's `ref`)."""
    commit = (target or {}).get("target") or {}
    rollup = commit.get("statusCheckRollup") or {}
    out = []
    for node in (rollup.get("contexts") or {}).get("nodes") or []:
        if node.get("__typename") == "StatusContext":
            if context_state(str(node.get("state") or "")) == "failing":
                out.append(str(node["context"]))
        elif check_state(node.get("status"), node.get("conclusion")) == "failing":
            out.append(str(node["name"]))
    return sorted(out)


# ----- webhooks --------------------------------------------------------------------------------


def on_check_run(record: dict[str, Any], run: dict[str, Any], cfg: ChecksSettings) -> bool:
    """A `check_run` delivery; True when it changed the record."""
    if run.get("head_sha") != record.get("head"):
        return False
    out = run.get("output") or {}
    record["checks"][str(run["name"])] = {
        "state": check_state(run.get("status"), run.get("conclusion")),
        "conclusion": str(run.get("conclusion") or run.get("status") or "").lower(),
        "summary": clip(out.get("summary") or out.get("title"), cfg.max_text_chars),
        "url": run.get("details_url") or run.get("html_url") or "",
        "id": run.get("id"),
        "annotations": [],
        "annotations_count": int(out.get("annotations_count") or 0),
    }
    return True


def on_status(record: dict[str, Any], payload: dict[str, Any], cfg: ChecksSettings) -> bool:
    if payload.get("sha") != record.get("head"):
        return False
    record["checks"][str(payload["context"])] = {
        "state": context_state(str(payload.get("state") or "")),
        "conclusion": str(payload.get("state") or ""),
        "summary": clip(payload.get("description"), cfg.max_text_chars),
        "url": payload.get("target_url") or "",
    }
    return True


def on_workflow_run(record: dict[str, Any], run: dict[str, Any]) -> bool:
    """A workflow run waiting for approval, or running once approved."""
    if run.get("head_sha") != record.get("head"):
        return False
    url = str(run.get("html_url") or "")
    others = [a for a in record["approval"] if a.get("url") != url]
    if run.get("conclusion") == "action_required":
        others.append({"workflow": str(run.get("name") or "workflow"), "url": url})
    changed = bool(others != record["approval"])
    record["approval"] = others
    return changed


def on_pull(record: dict[str, Any], pull: dict[str, Any], now: int) -> bool:
    """A `pull_request` delivery: a new head starts its checks over."""
    head = str((pull.get("head") or {}).get("sha") or "")
    if pull.get("merged"):
        record["state"] = "MERGED"
        return True
    if pull.get("state") == "closed":
        record["state"] = "CLOSED"
        return True
    if not head or head == record.get("head"):
        return False
    record.update(
        head=head,
        checks={},
        approval=[],
        mergeable=None,
        merge_state="UNKNOWN",
        pushed_ms=now,
        need_read=True,
    )
    return True


# ----- the verdict -----------------------------------------------------------------------------


@dataclass
class Verdict:
    """What a tracked PR's checks say now."""

    #: merged | closed | approval | conflict | failed | stale | running | green
    status: str
    detail: str
    #: The checks the status is about (failing, pending, ...).
    names: list[str] = field(default_factory=list)
    #: Whether the review may be offered (the green gate, the overlap hold).
    review_ok: bool = True
    #: Required checks that fail on the base branch too: no round is spent on them.
    base_failing: list[str] = field(default_factory=list)


def counted(record: dict[str, Any], cfg: ChecksSettings) -> list[str]:
    """The checks that decide: the required ones (missing ones are expected, so pending),
    else every check when `when_none_required` is `all`."""
    required = record.get("required") or []
    if required:
        return sorted(required)
    return sorted(record["checks"]) if cfg.when_none_required == "all" else []


def gated(record: dict[str, Any], cfg: ChecksSettings) -> bool:
    mode = cfg.review_when_green
    return mode == "on" or (mode == "auto" and bool(record.get("required")))


def judge(record: dict[str, Any], cfg: ChecksSettings, now: int) -> Verdict:
    names = counted(record, cfg)
    checks = record["checks"]
    state = record.get("state", "OPEN")
    if state in ("MERGED", "CLOSED"):
        return Verdict(state.lower(), f"PR #{record['pr']} {state.lower()}")
    waiting = _waits_for_a_person(record, names)
    if waiting is not None:
        return waiting
    gate = gated(record, cfg)
    if record.get("mergeable") is False:
        return Verdict("conflict", f"conflicts with {record['base']}", [], not gate)
    failing = [n for n in names if checks.get(n, {}).get("state") == "failing"]
    on_base = [n for n in failing if n in (record.get("base_failing") or [])]
    own = [n for n in failing if n not in on_base]
    base_note = (
        f"; {', '.join(on_base)} fails on {record['base']} too (not this PR's doing: no round)"
        if on_base
        else ""
    )
    if own:
        which = ", ".join(f"{n} ({checks[n]['conclusion'] or 'failure'})" for n in own)
        return Verdict("failed", f"checks failed: {which}{base_note}", own, not gate, on_base)
    pending = [n for n in names if checks.get(n, {}).get("state", "pending") == "pending"]
    if pending:
        return _pending(record, cfg, now, pending, not gate, on_base, base_note)
    detail = f"checks passed: {', '.join(names)}" if names else "no checks reported"
    return Verdict("green", detail + base_note, names, True, on_base)


def _waits_for_a_person(record: dict[str, Any], names: list[str]) -> Verdict | None:
    """Workflows waiting for a maintainer's approval, or a check asking a person to act."""
    checks = record["checks"]
    if record.get("approval"):
        flows = ", ".join(a["workflow"] for a in record["approval"])
        where = record["approval"][0].get("url") or record.get("url", "")
        detail = (
            f"workflow {flows} waits for a maintainer's approval: open {where} and click "
            "'Approve and run' (a first-time contributor's or a bot's run)"
        )
        return Verdict("approval", detail, [a["workflow"] for a in record["approval"]], False)
    acting = [n for n in names if checks.get(n, {}).get("state") == "approval"]
    if acting:
        where = checks[acting[0]].get("url") or record.get("url", "")
        detail = f"{', '.join(acting)} asks a person to act: open {where}"
        return Verdict("approval", detail, acting, False)
    return None


def _pending(
    record: dict[str, Any],
    cfg: ChecksSettings,
    now: int,
    pending: list[str],
    reviewable: bool,
    on_base: list[str],
    base_note: str,
) -> Verdict:
    """Checks still running, or pending so long they are flagged stale."""
    age_ms = max(0, now - int(record.get("pushed_ms") or now))
    age_s = age_ms // 1000
    listed = ", ".join(pending)
    if age_ms >= cfg.pending_stale_s * 1000:
        detail = (
            f"checks pending for {span(age_s)}: {listed}; flagged, not waited on (re-run "
            "them or fix CI)"
        )
        return Verdict("stale", detail, pending, reviewable, on_base)
    detail = f"waiting for checks: {listed} (pending {span(age_s)}){base_note}"
    return Verdict("running", detail, pending, reviewable, on_base)


# ----- a fix task ------------------------------------------------------------------------------


def fix_payload(
    issue: int,
    record: dict[str, Any],
    source: str,
    names: list[str],
    round_: int,
    cfg: ChecksSettings,
) -> dict[str, Any]:
    """The `task:fix:{pr}` record of a fix from failing checks (`checks`) or a rebase
    (`conflict`): what failed, the head commit it applies to, the round."""
    head = record["head"]
    shown = [(i, name, record["checks"].get(name, {})) for i, name in enumerate(names)]
    shown = shown[: cfg.max_failing_checks]
    failures = [_failure(name, check) for _, name, check in shown]
    comments = [_check_comment(i, name, check) for i, name, check in shown]
    if source == "conflict":
        comments = [_conflict_comment(record)]
    return {
        "pr": record["pr"],
        "pr_url": record.get("url", ""),
        "issue": issue,
        "round": round_,
        "rounds": cfg.max_rounds,
        "status": "pending",
        "source": source,
        "template": TEMPLATES[source],
        "head_sha": head,
        "base": record["base"],
        "branch": record["branch"],
        "checks": failures,
        "comment_ids": [f"{source}:{head}"],
        "comments": comments,
    }


def _failure(name: str, check: dict[str, Any]) -> dict[str, Any]:
    """One failing check as the fix task lists it."""
    return {
        "name": name,
        "conclusion": check.get("conclusion") or "failure",
        "summary": check.get("summary") or "",
        "url": check.get("url") or "",
        "annotations": check.get("annotations") or [],
    }


def _check_comment(i: int, name: str, check: dict[str, Any]) -> dict[str, Any]:
    """One failing check as a comment for the agent: its summary and annotations, anchored at
    the first annotation."""
    notes = check.get("annotations") or []
    body = f"{name}: {check.get('conclusion') or 'failure'}\n{check.get('summary') or ''}"
    for a in notes:
        where = f"{a['path']}:{a['line']}" if a.get("line") else a["path"]
        body += f"\n{where}: {a['message']}"
    first = notes[0] if notes else {}
    return {
        "id": int(check.get("id") or i + 1),
        "kind": "check",
        "author": name,
        "body": body.strip(),
        "url": check.get("url") or "",
        "path": first.get("path"),
        "line": first.get("line"),
    }


def _conflict_comment(record: dict[str, Any]) -> dict[str, Any]:
    """What a rebase task asks for."""
    body = (
        f"The PR's branch `{record['branch']}` ({record['head'][:7]}) conflicts with "
        f"`{record['base']}`: merge or rebase it onto `{record['base']}` and resolve the "
        "conflicts."
    )
    return {"id": 1, "kind": "conflict", "author": "github", "body": body}


# ----- overlapping PRs -------------------------------------------------------------------------


def overlaps(records: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Open PRs that change the same files: per issue, the others it overlaps, the files,
    and the suggested merge order of the group (smaller first, then older, then number)."""
    open_ = {
        n: r for n, r in records.items() if r.get("state", "OPEN") == "OPEN" and r.get("files")
    }
    out: dict[int, dict[str, Any]] = {}
    for n, rec in open_.items():
        mine = set(rec["files"])
        others = [
            {"issue": m, "pr": other["pr"], "files": sorted(mine & set(other["files"]))[:20]}
            for m, other in sorted(open_.items())
            if m != n and mine & set(other["files"])
        ]
        if not others:
            continue
        group = [n, *(o["issue"] for o in others)]
        order = sorted(
            group,
            key=lambda k: (open_[k].get("size", 0), open_[k].get("created_ms", 0), open_[k]["pr"]),
        )
        out[n] = {
            "with": others,
            "order": [open_[k]["pr"] for k in order],
            "first": order[0] == n,
            "ahead": [open_[k]["pr"] for k in order[: order.index(n)]],
        }
    return out


def overlap_text(n: int, rec: dict[str, Any], overlap: dict[str, Any]) -> str:
    parts = [
        f"PR #{o['pr']} (#{o['issue']}) also changes {', '.join(o['files'])}"
        for o in overlap["with"]
    ]
    order = " then ".join(f"#{pr}" for pr in overlap["order"])
    return (
        f"Your PR #{rec['pr']} overlaps other open PRs: {'; '.join(parts)}. Suggested merge "
        f"order: {order} (smaller first, then older)."
    )
