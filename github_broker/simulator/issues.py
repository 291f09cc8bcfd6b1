"""Repositories, issues, labels and issue comments of the simulated GitHub, behind one lock."""

from __future__ import annotations

import bisect
import itertools
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

from . import render
from .messages import ApiError, NotFound, validation_failed
from .model import Record, Repo, fake_sha, format_time, normalize_time

logger = logging.getLogger(__name__)

TimeLike = str | datetime | date
LabelSpec = str | Mapping[str, Any]

DEFAULT_LABEL_COLOR = "ededed"
#: Who label changes made through Python calls (tests acting as people) are attributed to.
DEFAULT_ACTOR = "maintainer"
_LISTING_CACHE_LIMIT = 64


def _noted_update(repo: Repo, rec: Record) -> None:
    """Log an issue's change for `since` listings; a change older than the last one logged
    (a record created with a past updated_at) drops the log, rebuilt at the next listing.
    Once the log holds many stale entries per issue it is rebuilt as well."""
    log = repo.updates
    if log is None:
        return
    # Ordered by time alone: bisecting with the 1-tuple (since,) needs no more.
    if (log and rec["updated_at"] < log[-1][0]) or len(log) > 4 * len(repo.issues) + 1024:
        repo.updates = None
    else:
        log.append((rec["updated_at"], rec["number"]))


_SORT_KEYS: dict[str, Callable[[Record], tuple[Any, ...]]] = {
    "created": lambda rec: (rec["created_at"], rec["number"]),
    "updated": lambda rec: (rec["updated_at"], rec["number"]),
    "comments": lambda rec: (rec["comments"], rec["number"]),
}


class IssueStore:
    """Thread-safe store; every public method takes the lock and returns GitHub-shaped JSON.

    ``base_url`` arguments let the HTTP layer render URLs for the host the client used;
    Python callers get URLs relative to ``self.base_url`` (set by ``Simulator.start``).
    """

    def __init__(
        self, *, base_url: str = "http://127.0.0.1", clock: Callable[[], datetime] | None = None
    ) -> None:
        self.lock = threading.RLock()
        self.base_url = base_url
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))
        self._repos: dict[tuple[str, str], Repo] = {}
        # Former names of renamed or transferred repositories; GitHub answers them with 301.
        self._moved: dict[tuple[str, str], Repo] = {}
        self._user_ids: dict[str, int] = {}
        # One id space for every object kind keeps ids unique, as GitHub's are.
        self._ids = itertools.count(1001)
        self._user_id_seq = itertools.count(501)
        #: (owner/name, number) -> the issue's timeline events (labeled / unlabeled so far).
        self._events: dict[tuple[str, int], list[dict[str, Any]]] = {}
        #: Called under the lock with (state, repo, record, hint) after every issue or PR
        #: change; the webhook dispatcher (simulator/webhooks.py) sets it.
        self.observer: Callable[..., None] | None = None

    # ----- plumbing shared with SimState -----------------------------------------------------

    def now(self) -> str:
        return format_time(self.clock())

    def next_id(self) -> int:
        return next(self._ids)

    def ctx(self, base_url: str | None) -> render.Ctx:
        return render.Ctx(base_url or self.base_url, self._user_ids)

    def user(self, login: str) -> str:
        if not login:
            raise validation_failed("User", "login", "missing_field")
        if login not in self._user_ids:
            self._user_ids[login] = next(self._user_id_seq)
        return login

    def user_json(self, login: str, *, base_url: str | None = None) -> dict[str, Any]:
        with self.lock:
            data = self.ctx(base_url).user(self.user(login))
            assert data is not None
            return data

    def private_user_json(self, login: str, *, base_url: str | None = None) -> dict[str, Any]:
        """The authenticated user as `GET /user` shows it to that user."""
        with self.lock:
            return self.ctx(base_url).private_user(self.user(login), _START)

    def repo(self, owner: str, name: str) -> Repo:
        found = self._repos.get((owner.lower(), name.lower()))
        if found is None:
            raise NotFound()
        return found

    def issue_record(self, repo: Repo, number: int) -> Record:
        rec = repo.issues.get(number)
        if rec is None:
            if number in repo.deleted:
                raise ApiError(410, "This issue was deleted")
            raise NotFound()
        return rec

    def touch(self, repo: Repo, rec: Record) -> None:
        rec["updated_at"] = self.now()
        repo.version += 1
        _noted_update(repo, rec)
        if self.observer is not None:
            self.observer(self, repo, rec)

    def repo_records(self) -> list[Repo]:
        return list(self._repos.values())

    def listing(
        self,
        repo: Repo,
        key: tuple[Any, ...],
        sort: str,
        descending: bool,
        keep: Callable[[Record], bool],
        candidates: Callable[[], Iterable[Record]] | None = None,
    ) -> list[Record]:
        """Filtered, ordered records, cached per repo version so paging 10k issues stays linear.
        Only the records the filter keeps are sorted: a `since` poll after a write keeps a few
        of 100,000 issues, and sorting them all again cost the simulator tens of ms per poll.
        `candidates`: when the caller knows fewer records than all that `keep` could keep, a
        function returning them (see since_candidates). Sort keys end with the number, so the
        order is total."""
        cached = repo.listing_cache.get(key)
        if cached is not None and cached[0] == repo.version:
            return cached[1]
        pool: Iterable[Record] = repo.issues.values() if candidates is None else candidates()
        result = sorted((rec for rec in pool if keep(rec)), key=_SORT_KEYS[sort])
        if descending:
            result.reverse()
        if len(repo.listing_cache) > _LISTING_CACHE_LIMIT:
            repo.listing_cache.clear()
        repo.listing_cache[key] = (repo.version, result)
        return result

    @staticmethod
    def since_candidates(repo: Repo, since_text: str) -> list[Record]:
        """The records changed at or after `since_text`, read from the repository's update log
        instead of a scan of every record: a `since` poll at 100,000 issues otherwise costs
        the simulator a full scan after every write, which GitHub's index does not."""
        if repo.updates is None:
            repo.updates = sorted((rec["updated_at"], n) for n, rec in repo.issues.items())
        start = bisect.bisect_left(repo.updates, (since_text,))
        numbers = {n for _, n in itertools.islice(repo.updates, start, None)}
        return [repo.issues[n] for n in numbers if n in repo.issues]

    # ----- repositories ----------------------------------------------------------------------

    def add_repo(
        self,
        owner: str,
        name: str,
        *,
        default_branch: str = "main",
        private: bool = False,
        description: str = "",
        labels: Iterable[LabelSpec] = (),
        branches: Iterable[str] = (),
    ) -> dict[str, Any]:
        with self.lock:
            key = (owner.lower(), name.lower())
            if key in self._repos:
                raise validation_failed("Repository", "name", "already_exists")
            repo = Repo(
                id=self.next_id(),
                owner=self.user(owner),
                name=name,
                default_branch=default_branch,
                private=private,
                description=description,
                created_at=self.now(),
            )
            repo.refs[f"refs/heads/{default_branch}"] = fake_sha(repo.full_name, default_branch)
            for branch in branches:
                repo.refs[f"refs/heads/{branch}"] = fake_sha(repo.full_name, branch)
            self._repos[key] = repo
            for spec in labels:
                self._define_label(repo, spec)
            return render.repository(self.ctx(None), repo)

    def get_repo(self, owner: str, repo: str, *, base_url: str | None = None) -> dict[str, Any]:
        with self.lock:
            return render.repository(self.ctx(base_url), self.repo(owner, repo))

    def rename_repo(self, owner: str, name: str, new_owner: str, new_name: str) -> None:
        """Rename or transfer a repository; its old name keeps answering with a redirect."""
        with self.lock:
            repo = self.repo(owner, name)
            new_key = (new_owner.lower(), new_name.lower())
            if new_key in self._repos:
                raise validation_failed("Repository", "name", "already_exists")
            del self._repos[(repo.owner.lower(), repo.name.lower())]
            self._moved[(repo.owner.lower(), repo.name.lower())] = repo
            repo.owner, repo.name = self.user(new_owner), new_name
            self._repos[new_key] = repo
            self._moved.pop(new_key, None)
            repo.version += 1

    def moved_path(self, path: str) -> str | None:
        """Where GitHub redirects `path` when it names a repository by a former name."""
        parts = path.split("/", 4)
        if len(parts) < 4 or parts[1] != "repos":
            return None
        with self.lock:
            repo = self._moved.get((unquote(parts[2]).lower(), unquote(parts[3]).lower()))
            if repo is None:
                return None
            rest = "/" + parts[4] if len(parts) > 4 else ""
            return f"/repositories/{repo.id}{rest}"

    def path_by_name(self, path: str) -> str:
        """`/repositories/{id}/...` (a repository by id) as `/repos/{owner}/{name}/...`."""
        parts = path.split("/", 3)
        if len(parts) < 3 or parts[1] != "repositories" or not parts[2].isdigit():
            return path
        with self.lock:
            repo = next((r for r in self._repos.values() if r.id == int(parts[2])), None)
            if repo is None:
                return path
            rest = "/" + parts[3] if len(parts) > 3 else ""
            return f"/repos/{repo.owner}/{repo.name}{rest}"

    def repo_names(self) -> list[str]:
        with self.lock:
            return [repo.full_name for repo in self._repos.values()]

    # ----- issues ----------------------------------------------------------------------------

    def create_issue(
        self,
        owner: str,
        repo: str,
        *,
        title: str,
        body: str = "",
        labels: Iterable[str] = (),
        state: str = "open",
        created_at: TimeLike | None = None,
        updated_at: TimeLike | None = None,
        user: str = "octocat",
        number: int | None = None,
        assignees: Iterable[str] = (),
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.new_issue_record(
                r,
                title=title,
                body=body,
                labels=labels,
                state=state,
                created_at=created_at,
                updated_at=updated_at,
                user=user,
                number=number,
                assignees=assignees,
            )
            return render.issue(self.ctx(base_url), r, rec)

    def new_issue_record(
        self,
        repo: Repo,
        *,
        title: str,
        body: str = "",
        labels: Iterable[str] = (),
        state: str = "open",
        created_at: TimeLike | None = None,
        updated_at: TimeLike | None = None,
        user: str = "octocat",
        number: int | None = None,
        assignees: Iterable[str] = (),
        pull: Record | None = None,
    ) -> Record:
        if not isinstance(title, str) or not title.strip():
            raise validation_failed("Issue", "title", "missing_field")
        _check_state(state)
        if number is None:
            number = repo.next_number
        elif number in repo.issues or number in repo.deleted or number < 1:
            raise validation_failed("Issue", "number", "already_exists")
        repo.next_number = max(repo.next_number, number + 1)
        created = normalize_time(created_at) if created_at is not None else self.now()
        updated = normalize_time(updated_at) if updated_at is not None else created
        closed = state == "closed"
        rec: Record = {
            "id": self.next_id(),
            "node_id": f"I_{repo.id}_{number}",
            "number": number,
            "title": title,
            "body": body or "",
            "state": state,
            "state_reason": "completed" if closed and pull is None else None,
            "labels": self._label_names(repo, labels),
            "user": self.user(user),
            "assignees": [self.user(a) for a in assignees],
            "created_at": created,
            "updated_at": updated,
            "closed_at": updated if closed else None,
            "comments": 0,
            "pull": pull,
        }
        repo.issues[number] = rec
        repo.version += 1
        if pull is not None:
            repo.pulls.add(number)
        _noted_update(repo, rec)
        if self.observer is not None:
            self.observer(self, repo, rec, "opened")
        return rec

    def get_issue(
        self, owner: str, repo: str, number: int, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            return render.issue(self.ctx(base_url), r, self.issue_record(r, number))

    def update_issue(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        labels: Iterable[str] | None = None,
        state_reason: str | None = None,
        assignees: Iterable[str] | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            self.apply_update(
                r, rec, title=title, body=body, state=state, state_reason=state_reason
            )
            if labels is not None:
                names = self._label_names(r, labels)
                self._label_events(r, rec, names, DEFAULT_ACTOR)
                rec["labels"] = names
            if assignees is not None:
                rec["assignees"] = [self.user(a) for a in assignees]
            self.touch(r, rec)
            return render.issue(self.ctx(base_url), r, rec)

    def apply_update(
        self,
        repo: Repo,
        rec: Record,
        *,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        state_reason: str | None = None,
    ) -> None:
        if title is not None:
            if not title.strip():
                raise validation_failed("Issue", "title", "missing_field")
            rec["title"] = title
        if body is not None:
            rec["body"] = body
        if state is not None:
            _check_state(state)
            if state == "closed" and rec["state"] != "closed":
                rec["closed_at"] = self.now()
                if rec["pull"] is None:
                    rec["state_reason"] = state_reason or "completed"
            elif state == "open" and rec["state"] != "open":
                rec["closed_at"] = None
                if rec["pull"] is None:
                    rec["state_reason"] = "reopened"
            rec["state"] = state

    def delete_issue(self, owner: str, repo: str, number: int) -> None:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            if self.observer is not None:
                self.observer(self, r, rec, "deleted")
            del r.issues[number]
            r.deleted.add(number)
            r.issue_comments.pop(number, None)
            r.version += 1

    def list_issues(
        self,
        owner: str,
        repo: str,
        *,
        state: str = "open",
        labels: Iterable[str] = (),
        since: TimeLike | None = None,
        sort: str = "created",
        direction: str = "desc",
        creator: str | None = None,
        assignee: str | None = None,
        page: int = 1,
        per_page: int = 30,
        base_url: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of GET /issues (pull requests included, as on GitHub) and the match count."""
        if state not in ("open", "closed", "all"):
            raise validation_failed("Issue", "state", "invalid")
        if sort not in _SORT_KEYS:
            raise validation_failed("Issue", "sort", "invalid")
        wanted = frozenset(name.strip().lower() for name in labels if name.strip())
        since_text = normalize_time(since) if since is not None else None

        def keep(rec: Record) -> bool:
            if state != "all" and rec["state"] != state:
                return False
            if since_text is not None and rec["updated_at"] < since_text:
                return False
            if creator is not None and rec["user"].lower() != creator.lower():
                return False
            if assignee is not None and not _assignee_matches(rec, assignee):
                return False
            return not wanted or wanted <= {name.lower() for name in rec["labels"]}

        key = ("issues", state, wanted, since_text, sort, direction, creator, assignee)
        with self.lock:
            r = self.repo(owner, repo)
            matches = self.listing(
                r,
                key,
                sort,
                direction != "asc",
                keep,
                None if since_text is None else lambda: self.since_candidates(r, since_text),
            )
            start = (max(page, 1) - 1) * per_page
            ctx = self.ctx(base_url)
            items = [render.issue(ctx, r, rec) for rec in matches[start : start + per_page]]
            return items, len(matches)

    # ----- labels ----------------------------------------------------------------------------

    def _define_label(self, repo: Repo, spec: LabelSpec) -> Record:
        if isinstance(spec, str):
            spec = {"name": spec}
        name = str(spec.get("name", "")).strip()
        if not name:
            raise validation_failed("Label", "name", "missing_field")
        rec: Record = {
            "id": self.next_id(),
            "name": name,
            "color": str(spec.get("color") or DEFAULT_LABEL_COLOR).lstrip("#"),
            "description": str(spec.get("description") or ""),
            "default": bool(spec.get("default", False)),
        }
        repo.labels[name.lower()] = rec
        return rec

    def _label_names(self, repo: Repo, names: Iterable[str]) -> list[str]:
        """Canonical label names; labels unknown to the repo are created, as GitHub does."""
        result: list[str] = []
        for raw in names:
            name = str(raw).strip()
            if not name:
                continue
            rec = repo.labels.get(name.lower()) or self._define_label(repo, name)
            if rec["name"] not in result:
                result.append(rec["name"])
        return result

    def issue_labels(self, owner: str, repo: str, number: int) -> list[str]:
        with self.lock:
            return list(self.issue_record(self.repo(owner, repo), number)["labels"])

    def add_labels(
        self,
        owner: str,
        repo: str,
        number: int,
        labels: Iterable[str],
        *,
        base_url: str | None = None,
        actor: str = DEFAULT_ACTOR,
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            merged = self._label_names(r, [*rec["labels"], *labels])
            if merged != rec["labels"]:
                self._label_events(r, rec, merged, actor)
                rec["labels"] = merged
                self.touch(r, rec)
            return render.issue_labels(self.ctx(base_url), r, rec)

    def set_labels(
        self,
        owner: str,
        repo: str,
        number: int,
        labels: Iterable[str],
        *,
        base_url: str | None = None,
        actor: str = DEFAULT_ACTOR,
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            names = self._label_names(r, labels)
            if names != rec["labels"]:
                self._label_events(r, rec, names, actor)
                rec["labels"] = names
                self.touch(r, rec)
            return render.issue_labels(self.ctx(base_url), r, rec)

    def remove_label(
        self,
        owner: str,
        repo: str,
        number: int,
        label: str,
        *,
        base_url: str | None = None,
        actor: str = DEFAULT_ACTOR,
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            remaining = [name for name in rec["labels"] if name.lower() != label.lower()]
            if len(remaining) == len(rec["labels"]):
                raise ApiError(404, "Label does not exist")
            self._label_events(r, rec, remaining, actor)
            rec["labels"] = remaining
            self.touch(r, rec)
            return render.issue_labels(self.ctx(base_url), r, rec)

    def _label_events(self, repo: Repo, rec: Record, after: list[str], actor: str) -> None:
        """Record GitHub's `labeled` / `unlabeled` timeline events for a label change."""
        before = list(rec["labels"])
        events = self._events.setdefault((repo.full_name, rec["number"]), [])
        for kind, names in (
            ("unlabeled", [n for n in before if n not in after]),
            ("labeled", [n for n in after if n not in before]),
        ):
            for name in names:
                events.append(
                    {
                        "id": self.next_id(),
                        "event": kind,
                        "label": name,
                        "actor": self.user(actor),
                        "created_at": self.now(),
                    }
                )

    def issue_events(
        self, owner: str, repo: str, number: int, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        """`GET /repos/{o}/{r}/issues/{n}/events`: oldest first, GitHub's payload shape."""
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            ctx = self.ctx(base_url)
            out = []
            for e in self._events.get((r.full_name, rec["number"]), []):
                label = r.labels.get(e["label"].lower())
                out.append(
                    {
                        "id": e["id"],
                        "node_id": f"LE_{e['id']}",
                        "url": f"{ctx.base}/repos/{r.full_name}/issues/events/{e['id']}",
                        "actor": ctx.user(e["actor"]),
                        "event": e["event"],
                        "commit_id": None,
                        "commit_url": None,
                        "created_at": e["created_at"],
                        "label": {
                            "name": e["label"],
                            "color": label["color"] if label else DEFAULT_LABEL_COLOR,
                        },
                    }
                )
            return out

    def list_labels(
        self, owner: str, repo: str, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            ctx = self.ctx(base_url)
            return [render.label(ctx, r, rec) for rec in r.labels.values()]

    def get_label(
        self, owner: str, repo: str, name: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = r.labels.get(name.lower())
            if rec is None:
                raise NotFound()
            return render.label(self.ctx(base_url), r, rec)

    def create_label(
        self,
        owner: str,
        repo: str,
        name: str,
        *,
        color: str = DEFAULT_LABEL_COLOR,
        description: str = "",
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            _check_color(color)
            if name.strip().lower() in r.labels:
                raise validation_failed("Label", "name", "already_exists")
            spec = {"name": name, "color": color, "description": description}
            return render.label(self.ctx(base_url), r, self._define_label(r, spec))

    def update_label(
        self,
        owner: str,
        repo: str,
        name: str,
        *,
        new_name: str | None = None,
        color: str | None = None,
        description: str | None = None,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = r.labels.get(name.lower())
            if rec is None:
                raise NotFound()
            if color is not None:
                _check_color(color)
            if new_name and new_name != rec["name"]:
                if new_name.lower() in r.labels and new_name.lower() != name.lower():
                    raise validation_failed("Label", "name", "already_exists")
                old = rec["name"]
                del r.labels[old.lower()]
                rec["name"] = new_name
                r.labels[new_name.lower()] = rec
                for issue in r.issues.values():
                    issue["labels"] = [new_name if n == old else n for n in issue["labels"]]
                r.version += 1
            if color is not None:
                rec["color"] = color.lstrip("#")
            if description is not None:
                rec["description"] = description
            return render.label(self.ctx(base_url), r, rec)

    def delete_label(self, owner: str, repo: str, name: str) -> None:
        with self.lock:
            r = self.repo(owner, repo)
            rec = r.labels.pop(name.lower(), None)
            if rec is None:
                raise NotFound()
            for issue in r.issues.values():
                if rec["name"] in issue["labels"]:
                    issue["labels"].remove(rec["name"])
            r.version += 1

    # ----- issue comments --------------------------------------------------------------------

    def add_issue_comment(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        user: str,
        body: str,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rec = self.issue_record(r, number)
            if not body:
                raise validation_failed("IssueComment", "body", "missing_field")
            now = self.now()
            comment = {
                "id": self.next_id(),
                "user": self.user(user),
                "body": body,
                "created_at": now,
                "updated_at": now,
            }
            r.issue_comments.setdefault(number, []).append(comment)
            rec["comments"] += 1
            self.touch(r, rec)
            return render.issue_comment(self.ctx(base_url), r, number, comment)

    def list_issue_comments(
        self,
        owner: str,
        repo: str,
        number: int,
        *,
        since: TimeLike | None = None,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        since_text = normalize_time(since) if since is not None else ""
        with self.lock:
            r = self.repo(owner, repo)
            self.issue_record(r, number)
            ctx = self.ctx(base_url)
            return [
                render.issue_comment(ctx, r, number, c)
                for c in r.issue_comments.get(number, [])
                if c["updated_at"] >= since_text
            ]

    def list_repo_issue_comments(
        self,
        owner: str,
        repo: str,
        *,
        since: TimeLike | None = None,
        sort: str = "created",
        direction: str = "asc",
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        """`GET /repos/{o}/{r}/issues/comments`: every issue's and pull request's comments,
        by creation (or update) time, ascending unless asked; `since` filters on updated_at."""
        if sort not in ("created", "updated"):
            raise validation_failed("IssueComment", "sort", "invalid")
        if direction not in ("asc", "desc"):
            raise validation_failed("IssueComment", "direction", "invalid")
        since_text = normalize_time(since) if since is not None else ""
        field = "updated_at" if sort == "updated" else "created_at"
        with self.lock:
            r = self.repo(owner, repo)
            ctx = self.ctx(base_url)
            found = [
                (c[field], c["id"], number, c)
                for number, comments in r.issue_comments.items()
                for c in comments
                if c["updated_at"] >= since_text
            ]
            found.sort(key=lambda item: (item[0], item[1]), reverse=direction == "desc")
            return [render.issue_comment(ctx, r, number, c) for _, _, number, c in found]


def _check_state(state: str) -> None:
    if state not in ("open", "closed"):
        raise validation_failed("Issue", "state", "invalid")


def _assignee_matches(rec: Record, assignee: str) -> bool:
    if assignee == "none":
        return not rec["assignees"]
    if assignee == "*":
        return bool(rec["assignees"])
    return assignee.lower() in (a.lower() for a in rec["assignees"])


#: When every simulated account was created.
_START = "2020-01-01T00:00:00Z"
#: GitHub takes a label colour as six hex digits, with or without a leading '#'.
_COLOR = re.compile(r"#?[0-9a-fA-F]{6}")


def _check_color(color: str) -> None:
    if not _COLOR.fullmatch(color):
        raise validation_failed("Label", "color", "invalid")
