"""The Grafana dashboard shipped in config/grafana/: valid dashboard JSON, and every metric its
PromQL expressions query is exported by the `/metrics` of a running broker."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from github_broker.agent.client import BrokerClient
from tests.processes import BrokerProcess, broker_env, wait_for
from tests.world import simulated

DASHBOARD = Path(__file__).parent.parent / "config" / "grafana" / "github-broker.json"
SECRET = "hook-secret"
ISSUES = [
    {
        "number": n,
        "title": f"Task {n}",
        "body": f"## Deliverables\n- it\n\nBranch: feature/x-{n}\n",
        "labels": ["P1", "BACKENDCODER"],
    }
    for n in (1, 2, 3)
]

#: PromQL words that are not metric names: functions, aggregations, keywords.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "topk", "bottomk", "quantile", "by",
    "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "rate", "irate", "increase", "delta", "histogram_quantile", "label_values", "offset",
    "abs", "clamp_min", "clamp_max", "time", "vector", "scalar", "e", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names one PromQL expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"\$\w+", "", text)  # Grafana variables
    text = re.sub(r"(?<![\w:])\d[\d.]*(?:[eE][+-]?\d+)?(?:ms|[smhdwy])?", "", text)  # numbers
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word, after = m.group(0), text[m.end() :].lstrip()[:1]
        if after == "(" or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def load_dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def test_the_grafana_dashboard_is_valid_dashboard_json_with_a_query_in_every_panel() -> None:
    d = load_dashboard()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 30
    assert d["title"] and d["uid"] and "id" not in d  # importable anywhere: no instance id
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len(panels) >= 12
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["title"] and p["type"] in {"timeseries", "bargauge", "stat"}
        assert (
            set(p["gridPos"]) == {"h", "w", "x", "y"}
            and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        )
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"] and t["refId"] and t["datasource"]["uid"] == "${datasource}"
            assert metric_names(t["expr"]), (p["title"], t["expr"])


def test_the_promql_parser_finds_metric_names_and_skips_functions_labels_and_ranges() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, route) (rate(gb_x_bucket{a="b",c=~"$v"}[5m])))'
        " / on (pid) process_open_fds offset 5m"
    )
    assert metric_names(expr) == {"gb_x_bucket", "process_open_fds"}


def exported_names(text: str) -> set[str]:
    """Every sample name in an exposition, and every family it declares (a histogram's
    `_bucket`, `_sum`, `_count`, a counter's `_total`), with or without samples yet."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            elif kind == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def deliver_ping(broker: BrokerProcess) -> None:
    body = json.dumps({"zen": "Keep it simple.", "repository": {"full_name": "acme/widgets"}})
    signature = hmac.new(SECRET.encode(), body.encode(), hashlib.sha256).hexdigest()
    r = requests.post(
        f"{broker.url}/github/webhook",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-GitHub-Event": "ping",
            "X-GitHub-Delivery": f"d-{time.monotonic_ns()}",
            "X-Hub-Signature-256": f"sha256={signature}",
        },
        timeout=10,
    )
    assert r.status_code == 200


@pytest.mark.slow
def test_every_metric_the_grafana_dashboard_queries_is_exported_by_a_running_broker(
    redis_url: str, tmp_path: Path
) -> None:
    used = {
        name
        for p in load_dashboard()["panels"]
        for t in p.get("targets", [])
        for name in metric_names(t["expr"])
    }
    assert len(used) >= 25  # the parser found the dashboard's metrics, not nothing
    with simulated(ISSUES) as sim:
        env = broker_env(
            redis_url,
            sim.base_url,
            "acme/widgets",
            GITHUB_BROKER_WEBHOOKS__SECRET=SECRET,
            GITHUB_BROKER_LEASES__SETTLE_GRACE_S="0",
        )
        broker = BrokerProcess(env, tmp_path, "broker").start()
        agent = BrokerClient(broker.url, "ann")
        try:
            wait_for(lambda: agent.request_task() is not None, 20, "the first sync")
            # Two hand-outs, a completion, a failure, a 409 and a webhook delivery: every
            # family has samples.
            done = agent.request_task()  # completes the first task
            assert done is not None
            agent.release(done, "failed")
            r = requests.post(
                f"{broker.url}/tasks/acme/widgets/{done.issue_id}/heartbeat",
                json={"agent_id": "ann", "token": done.lease.token},
                timeout=10,
            )
            assert r.status_code == 409
            deliver_ping(broker)
            wait_for(
                lambda: "gb_github_quota_remaining " in requests.get(f"{broker.url}/metrics").text,
                20,
                "the leader's first GitHub answers",
            )
            exported = exported_names(requests.get(f"{broker.url}/metrics", timeout=10).text)
        finally:
            agent.close()
            broker.stop()
    assert not used - exported, f"queried but not exported: {sorted(used - exported)}"
    for name in ("gb_handouts_total", "gb_lease_ends_total", "gb_agent_tasks_total"):
        assert name in exported
