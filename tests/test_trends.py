"""The trends' arithmetic and the charts' markup: quantiles from the history's buckets, text
alternatives, escaping, empty ranges."""

from __future__ import annotations

import re
from collections import Counter

from github_broker.reports.trends import (
    AgentTrend,
    Bucket,
    DepthPoint,
    Duration,
    Trends,
    agent_trends,
    duration,
    quantile,
)
from github_broker.store.history import DURATION_BOUNDS_S
from github_broker.ui.trends import charts


def test_quantiles_interpolate_inside_the_bucket_that_holds_the_rank_as_prometheus_does() -> None:
    per_bucket = [0] * (len(DURATION_BOUNDS_S) + 1)
    per_bucket[DURATION_BOUNDS_S.index(60)] = 10  # ten waits in (30 s, 60 s]
    assert quantile(0.5, per_bucket) == 45.0
    assert quantile(0.9, per_bucket) == 57.0
    per_bucket[-1] = 90  # most above the last bound: that bound, not infinity
    assert quantile(0.9, per_bucket) == DURATION_BOUNDS_S[-1]


def test_a_duration_and_the_agents_come_from_the_history_fields() -> None:
    counts = Counter(
        {"wait:1": 3, "wait:ms": 900, "a:ann:ok": 3, "a:ann:ms": 30_000, "a:bo:fail": 2}
    )
    d = duration(counts, "wait")
    assert d.count == 3 and d.p50_s == 0.5 and d.mean_s == 0.3
    assert duration(counts, "pr") == Duration(0, None, None, None)
    assert agent_trends(counts) == [
        AgentTrend("ann", 3, 0, 1.0, 10.0),
        AgentTrend("bo", 0, 2, 0.0, None),
    ]


def trends_of(agent: str = "ann") -> Trends:
    return Trends(
        range="1h",
        now_ms=1_700_000_000_000,
        buckets=[
            Bucket(1_700_000_000_000 - 300_000 * i, {"development": i}, i, 1) for i in range(12)
        ],
        depth=[DepthPoint(1_700_000_000_000, i % 2 == 0, {0: 2.0}, 1.0) for i in range(61)],
        to_claim=Duration(4, 3.0, 9.0, 4.0),
        to_pr=Duration(0, None, None, None),
        agents=[AgentTrend(agent, 3, 1, 0.75, 12.0)],
    )


def test_every_chart_has_a_title_a_description_and_its_numbers_as_a_table() -> None:
    html = "".join(charts(trends_of()))
    assert html.count("<figure") == 4 and html.count("<table>") == 4
    assert html.count("<title id=") == 4 and html.count("<desc id=") == 4
    assert 'data-handouts="66"' in html and "66 hand-outs (66 development)" in html
    # Gaps where no sample was taken; a line through the samples that were.
    assert "<td>-</td>" in html and "<polyline" not in html.split('id="chart-queue"')[0]
    assert "ann 75% of 4 · mean 12s" in html
    assert "<script" not in html and "http" not in html.replace("http://www.w3.org", "")


def test_agent_ids_are_escaped_in_the_charts() -> None:
    html = "".join(charts(trends_of("<b>x")))
    assert "<b>x" not in html and "&lt;b&gt;x" in html


def test_an_empty_range_still_draws_every_chart_and_says_so() -> None:
    empty = Trends("24h", 1_700_000_000_000, [Bucket(0) for _ in range(24)],
                   [DepthPoint(0, False) for _ in range(24)] + [DepthPoint(0, True)],
                   Duration(0, None, None, None), Duration(0, None, None, None), [])  # fmt: skip
    html = "".join(charts(empty))
    assert html.count("<figure") == 4
    assert "No agent finished a task over the last 24 hours." in html
    assert re.search(r'data-handouts="0"', html)
