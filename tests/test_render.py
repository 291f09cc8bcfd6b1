"""`status` and `explain` as text, on a repository of 3,000 issues seeded into a real Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import unicodedata
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from github_broker.claim.rules import Rules
from github_broker.leader.sync import index_item
from github_broker.models import Claimed, Issue
from github_broker.reports import overview, render
from github_broker.reports.explain import Verdict
from github_broker.settings import Settings
from github_broker.store import Store
from tests.factories import issue

pytestmark = pytest.mark.anyio
REPO = "acme/widgets"
N_ISSUES = 3000


def backlog() -> list[Issue]:
    """Issues 1-3 are P0 (3 has no deliverables), 4-2000 P1, 2001-2900 P2 for the frontend,
    2901-2950 skipped for lack of deliverables, 2951-3000 waiting for review."""
    out = []
    for n in range(1, N_ISSUES + 1):
        if n <= 3:
            out.append(issue(n, "P0", "BACKENDCODER", text="no deliverables" if n == 3 else None))
        elif n <= 2000:
            out.append(issue(n, "P1", "BACKENDCODER"))
        elif n <= 2900:
            out.append(issue(n, "P2", "FRONTENDCODER"))
        elif n <= 2950:
            out.append(issue(n, "P1", "BACKENDCODER", text="nothing to deliver"))
        else:
            out.append(issue(n, "P1", "BACKENDCODER", "needs-review"))
    return out


@pytest.fixture
async def seeded(
    redis_url: str, make_settings: Callable[..., Settings]
) -> AsyncIterator[tuple[Store, Settings]]:
    settings = make_settings(redis={"url": redis_url})
    store = Store.from_settings(settings)
    rstore = store.repo(REPO)
    rules = Rules(settings)
    items = [index_item(rules, i, "main") for i in backlog()]
    for start in range(0, len(items), 500):
        await rstore.upsert_issues(items[start : start + 500])
    await rstore.save_sync_state({}, rebuilt=True)  # as a complete sync pass would
    got = await rstore.claim(
        "agent-7", previous="completed", mode="strict", base_branch="main", roles=None
    )
    assert isinstance(got, Claimed) and got.issue.number == 1
    yield store, settings
    await store.close()


async def test_status_is_aligned_tables_with_titles_ages_leader_and_sync(
    seeded: tuple[Store, Settings],
) -> None:
    store, settings = seeded
    await store.repo(REPO).save_sync_state({"synced_at": str(time.time() - 90)})
    await store.leader("host-a:1", 10_000)
    text = render.status_text(await overview.overview(store, settings))
    lines = text.splitlines()
    assert lines[0].startswith("Poller leader: host-a:1")
    assert "last sync 1m 30s ago" in text and "last full sync never" in text
    assert "Bucket P0 pinned by 2 issue(s):" in text
    lease = lines[lines.index("Leases: 1") + 2]
    assert "#1" in lease and "Task 1" in lease and "none yet" in lease and "ago" in lease
    header = lines[lines.index("Leases: 1") + 1]
    # Columns line up: each header starts where its cells start.
    assert header.index("AGENT") == lease.index("agent-7")
    # Tasks the strict bucket holds back are not counted as claimable.
    assert "Queue: 1 claimable now, 2897 held back by the bucket" in text
    assert "P1 0 (+1997 held back)" in text
    assert "Skipped: 51" in text and "… and 36 more skipped issues" in text
    assert len(lines) < 150
    assert "{" not in text  # no Python reprs


async def test_explain_starts_with_a_summary_and_names_the_blockers(
    seeded: tuple[Store, Settings],
) -> None:
    store, settings = seeded
    text = render.explain_text(await overview.explained(store, settings, None))
    lines = text.splitlines()
    assert lines[0] == f"{REPO}: {N_ISSUES} issue(s)"
    assert lines[1] == "  1 next, 1 held, 2897 outside bucket, 51 skipped, 50 waiting"
    assert lines[2].startswith("  Next: #2 Task 2")
    assert lines[3] == "  Bucket P0 pinned by #1, #2"
    blocked = next(line for line in lines if line.strip().startswith("#4 "))
    assert "blocked by #1, #2" in blocked
    assert "… and 2882 more (--all lists them)" in text
    waiting = next(line for line in lines if line.strip().startswith("#2951 "))
    assert "not_checked: the review upkeep has not looked at it yet" in waiting
    assert len(lines) < 120


async def test_explain_filters_by_issue_and_lists_everything_on_request(
    seeded: tuple[Store, Settings],
) -> None:
    store, settings = seeded
    data = await overview.explained(store, settings, ["FRONTENDCODER"], REPO)
    one = render.explain_text(data, issue=2500).splitlines()
    assert one[2] == "  Next: nothing claimable for these roles now"
    rows = [line for line in one if re.match(r"\s+#\d+ ", line)]
    assert len(rows) == 1 and "#2500" in rows[0] and "blocked by #1, #2" in rows[0]
    everything = render.explain_text(data, rows=None)
    numbers = re.findall(r"^\s+#(\d+) ", everything, re.M)
    assert len(numbers) == len(set(numbers)) == N_ISSUES
    missing = render.explain_text(data, issue=99999)
    assert "#99999 is not an open work issue" in missing


def test_an_issue_with_two_tasks_is_listed_once() -> None:
    verdicts = [
        Verdict(issue=5, priority=0, verdict="next", detail="fix task you would get now"),
        Verdict(issue=5, priority=0, verdict="queued", detail="claimable"),
        Verdict(issue=6, priority=0, verdict="queued", detail="claimable"),
    ]
    merged = render.merge_verdicts(verdicts)
    assert [v.issue for v in merged] == [5, 6]
    assert "also queued" in merged[0].detail


async def test_cli_explain_and_status_commands(
    seeded: tuple[Store, Settings], redis_url: str
) -> None:
    env = {
        **os.environ,
        "GITHUB_BROKER_CONFIG_DIR": str(Path(__file__).parent / "no-config"),
        "GITHUB_BROKER_REDIS__URL": redis_url,
        "GITHUB_BROKER_REPOSITORIES": REPO,
        "GITHUB_BROKER_GITHUB__TOKEN": "test-token",
    }

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "github_broker", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    one = cli("explain", "--issue", "1")
    assert one.returncode == 0, one.stderr
    assert "held by agent-7" in one.stdout and one.stdout.count("#1 ") == 1
    wrong = cli("explain", "--repo", "acme/nope")
    assert wrong.returncode == 2 and "not a configured repository" in wrong.stderr
    status = cli("status")
    assert status.returncode == 0 and "Bucket P0 pinned by 2 issue(s)" in status.stdout


def columns(text: str) -> int:
    """Terminal columns, measured here independently of render.width."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def test_tables_line_up_by_display_width_with_wide_titles() -> None:
    """A CJK character takes two terminal columns: every cell after a Japanese title starts
    in the column of its header."""
    titles = ["ログイン API にレート制限を追加する", "Add pagination", "タスク一覧画面の E2E"]
    rows = [[f"#{n}", t, "development"] for n, t in enumerate(titles, 1)]
    lines = render.table(["ISSUE", "TITLE", "TASK"], rows)
    column = columns(lines[0][: lines[0].index("TASK")])
    for line in lines[1:]:
        assert columns(line[: line.index("development")]) == column, lines


def test_long_wide_titles_are_cut_to_the_title_width_in_columns() -> None:
    title = "タスク一覧画面の E2E テストを追加する" * 3
    cut = render.clip(title)
    assert cut.endswith("…") and columns(cut) <= render.TITLE_WIDTH
    assert columns(cut) >= render.TITLE_WIDTH - 1  # cut no shorter than it must be
