"""Organization planning data of the simulated GitHub: issue types and issue fields.

An owner starts with GitHub's default issue types (Task, Bug, Feature); an issue carries
at most one (`type` on the issue object, set by create or update with the type's name, or
cleared with null) and each change is delivered as `issues.typed` / `issues.untyped`.
Issue fields (Priority and the like) are defined per owner; an issue's values are set
through `/issues/{n}/issue-field-values` and show as `issue_field_values` on the issue
object, each change delivered as `issues.field_added` / `issues.field_removed` (GitHub's
published webhook description does not list these actions yet: the simulator sends the
issue as the other `issues` deliveries do). Setting a type or a field value is an edit of
the issue: its `updated_at` moves.
"""

from __future__ import annotations

import logging
from typing import Any

from . import render
from .messages import ApiError, NotFound, validation_failed
from .model import Record, Repo
from .render_planning import field_value_list
from .sub_issues import SubIssueStore

logger = logging.getLogger(__name__)

DEFAULT_TYPES = (
    ("Task", "A specific piece of work", "yellow"),
    ("Bug", "An unexpected problem or behavior", "red"),
    ("Feature", "A request, idea, or new functionality", "blue"),
)
#: The options of the Priority field `priority_field` defines, most urgent first.
PRIORITY_OPTIONS = (("Urgent", "red"), ("High", "orange"), ("Medium", "yellow"), ("Low", "gray"))
FIELD_TYPES = ("text", "single_select", "number", "date")


class PlanningStore(SubIssueStore):
    """Issue types and issue fields per owner; the conventions are IssueStore's."""

    def _owner_records(self, kind: str, owner: str) -> list[Record]:
        table: dict[str, list[Record]] = self.__dict__.setdefault(f"_{kind}", {})
        key = owner.lower()
        if key not in table:
            table[key] = []
            if kind == "issue_types":
                for name, description, color in DEFAULT_TYPES:
                    table[key].append(self._new_type(name, description, color))
        return table[key]

    def _new_type(self, name: str, description: str | None, color: str | None) -> Record:
        type_id = self.next_id()
        now = self.now()
        return {"id": type_id, "node_id": f"IT_{type_id}", "name": name,
                "description": description, "color": color, "created_at": now,
                "updated_at": now, "is_enabled": True}

    # ----- issue types -----------------------------------------------------------------------

    def issue_types(self, owner: str) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(t) for t in self._owner_records("issue_types", owner) if t["is_enabled"]]

    def create_issue_type(
        self, owner: str, name: str, *, description: str | None = None, color: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            types = self._owner_records("issue_types", owner)
            if not name.strip():
                raise validation_failed("IssueType", "name", "missing_field")
            if any(t["name"].lower() == name.lower() for t in types):
                raise validation_failed("IssueType", "name", "already_exists")
            types.append(self._new_type(name, description, color))
            return dict(types[-1])

    def set_issue_type(
        self, owner: str, repo: str, number: int, name: str | None, *, actor: str = "maintainer"
    ) -> None:
        """Give the issue a type of its owner by name (None clears it)."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            if name is None:
                old = rec.get("type")
                rec["type"] = None
                if old is not None:
                    self.touch(r, rec)
                    self._typed(r, rec, "untyped", old, actor)
                return
            found = next(
                (t for t in self._owner_records("issue_types", r.owner)
                 if t["name"].lower() == str(name).lower() and t["is_enabled"]),
                None,
            )
            if found is None:
                raise validation_failed("Issue", "type", "invalid", f"no issue type {name!r}")
            if rec.get("type") is not found:
                rec["type"] = found
                self.touch(r, rec)
                self._typed(r, rec, "typed", found, actor)

    def _typed(self, repo: Repo, rec: Record, action: str, kind: Record, actor: str) -> None:
        self._graph_event(repo, "issues", action, {
            "issue": render.issue(self.ctx(None), repo, rec), "type": dict(kind)}, actor)

    # ----- issue fields ----------------------------------------------------------------------

    def issue_fields(self, owner: str) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(f) for f in self._owner_records("issue_fields", owner)]

    def create_issue_field(
        self, owner: str, name: str, data_type: str, *, options: list[Any] | None = None,
        description: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            fields = self._owner_records("issue_fields", owner)
            if not name.strip():
                raise validation_failed("IssueField", "name", "missing_field")
            if data_type not in FIELD_TYPES:
                raise validation_failed("IssueField", "data_type", "invalid")
            if any(f["name"].lower() == name.lower() for f in fields):
                raise validation_failed("IssueField", "name", "already_exists")
            if data_type == "single_select" and not options:
                raise validation_failed("IssueField", "options", "missing_field")
            field_id, now = self.next_id(), self.now()
            made = [
                {"id": self.next_id(), "name": str(o["name"]), "description": None,
                 "color": str(o.get("color") or "gray"), "priority": i + 1,
                 "created_at": now, "updated_at": now}
                for i, o in enumerate(options or [])
            ]
            fields.append({"id": field_id, "node_id": f"IFT_{field_id}", "name": name,
                           "description": description, "data_type": data_type,
                           "visibility": "organization_members_only", "options": made,
                           "created_at": now, "updated_at": now})
            return dict(fields[-1])

    def priority_field(self, owner: str, name: str = "Priority") -> dict[str, Any]:
        """Tests and seeds: the owner's single-select Priority field (Urgent ... Low)."""
        with self.lock:
            for f in self._owner_records("issue_fields", owner):
                if f["name"].lower() == name.lower():
                    return dict(f)
            options = [{"name": n, "color": c} for n, c in PRIORITY_OPTIONS]
            return self.create_issue_field(owner, name, "single_select", options=options)

    def field_values(self, owner: str, repo: str, number: int) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            return field_value_list(self.issue_record(r, number))

    def set_field_values(
        self, owner: str, repo: str, number: int, values: list[Any], *, replace: bool = False,
        actor: str = "maintainer",
    ) -> list[dict[str, Any]]:
        """`values`: [{field_id, value}]; `replace` drops the values not given (PUT)."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            fields = {f["id"]: f for f in self._owner_records("issue_fields", r.owner)}
            current: dict[int, Any] = {} if replace else dict(rec.get("field_values") or {})
            for item in values:
                if not isinstance(item, dict):
                    raise validation_failed("IssueFieldValue", "issue_field_values", "invalid")
                field = fields.get(item.get("field_id"))
                if field is None:
                    raise NotFound()
                current[field["id"]] = {
                    "field": field["name"],
                    "type": field["data_type"],
                    "value": _checked_value(field, item.get("value")),
                }
            self._store_values(r, rec, current, actor)
            return field_value_list(rec)

    def remove_field_value(
        self, owner: str, repo: str, number: int, field_id: int, *, actor: str = "maintainer"
    ) -> None:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            current = dict(rec.get("field_values") or {})
            if current.pop(field_id, None) is None:
                raise NotFound()
            self._store_values(r, rec, current, actor)

    def set_field(
        self, owner: str, repo: str, number: int, name: str, value: Any
    ) -> list[dict[str, Any]]:
        """Tests and seeds: set the owner's field `name` (a Priority field is made on use)."""
        if name.lower() == "priority":
            field = self.priority_field(owner, name)
        else:
            field = next(f for f in self.issue_fields(owner) if f["name"] == name)
        return self.set_field_values(owner, repo, number, [{"field_id": field["id"],
                                                            "value": value}])

    def _store_values(self, repo: Repo, rec: Record, values: dict[int, Any], actor: str) -> None:
        before = dict(rec.get("field_values") or {})
        if before == values:
            return
        rec["field_values"] = values
        self.touch(repo, rec)
        issue = render.issue(self.ctx(None), repo, rec)
        for field_id in values:
            if before.get(field_id) != values[field_id]:
                self._graph_event(repo, "issues", "field_added", {"issue": issue}, actor)
        for field_id in before:
            if field_id not in values:
                self._graph_event(repo, "issues", "field_removed", {"issue": issue}, actor)


def _checked_value(field: Record, value: Any) -> Any:
    kind = field["data_type"]
    if kind == "single_select":
        option = next((o for o in field["options"] if o["name"] == value), None)
        if option is None:
            raise ApiError(422, f"{value!r} is not an option of the field {field['name']!r}")
        return option
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ApiError(422, f"the field {field['name']!r} takes a number")
        return value
    if not isinstance(value, str):
        raise ApiError(422, f"the field {field['name']!r} takes a string")
    return value
