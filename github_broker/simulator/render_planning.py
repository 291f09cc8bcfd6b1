"""The planning fields of an issue object: its relationships' summaries (`parent_issue_url`,
`sub_issues_summary`, `issue_dependencies_summary`), its `type` and `issue_field_values`.

Read from the links `graph.Node` keeps on the record (`rec["links"]`) and the type and field
values `planning.py` stores there; render.issue adds them to every issue (not to pull
requests, which GitHub does not link).
"""

from __future__ import annotations

from typing import Any

from .model import Record


def planning(ctx: Any, rec: Record) -> dict[str, Any]:
    node = rec.get("links")
    blockers = _alive(node.blockers) if node else []
    blocking = _alive(node.blocking) if node else []
    subs = _alive(node.subs) if node else []
    done = sum(1 for n in subs if n.rec["state"] == "closed")
    parent = node.parent if node is not None and node.parent and node.parent.alive else None
    kind = rec.get("type")
    return {
        "type": dict(kind) if kind is not None else None,
        "issue_field_values": field_value_list(rec),
        "parent_issue_url": (
            f"{ctx.api(parent.repo)}/issues/{parent.rec['number']}" if parent else None
        ),
        "sub_issues_summary": {
            "total": len(subs),
            "completed": done,
            "percent_completed": done * 100 // len(subs) if subs else 0,
        },
        "issue_dependencies_summary": {
            "blocked_by": _open(blockers),
            "total_blocked_by": len(blockers),
            "blocking": _open(blocking),
            "total_blocking": len(blocking),
        },
    }


def _alive(nodes: list[Any]) -> list[Any]:
    return [n for n in nodes if n.alive]


def _open(nodes: list[Any]) -> int:
    return sum(1 for n in nodes if n.rec["state"] == "open")


def field_value_list(rec: Record) -> list[dict[str, Any]]:
    """An issue's `issue_field_values` (also the values endpoints' answer)."""
    out = []
    for field_id, held in (rec.get("field_values") or {}).items():
        value = held["value"]
        option = value if held["type"] == "single_select" else None
        out.append({
            "issue_field_id": field_id,
            "issue_field_name": held["field"],
            "node_id": f"IFV_{field_id}_{rec['id']}",
            "data_type": held["type"],
            "value": option["name"] if option is not None else value,
            "single_select_option": (
                {"id": option["id"], "name": option["name"], "color": option["color"]}
                if option is not None else None
            ),
        })
    return out
