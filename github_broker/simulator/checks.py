"""Check runs and suites, commit statuses, branch protection, pull requests' mergeability and
Actions runs waiting for approval, in the simulated GitHub (CheckStore).

- A check run belongs to the check suite of its head commit and its App (the login that
  created it stands for the App); the suite's status and conclusion follow its runs
  (`SUITE_ORDER`: the first conclusion found among them wins).
- A commit's combined status is the newest status of each context: `failure` if any is
  failure or error, `pending` if any is pending or there is none, else `success`.
- Branch protection keeps the required status checks of a branch; a pull request into it is
  `blocked` until each has passed on its head (the newest check run of that name, or the
  newest status of that context), and its merge is refused until then.
- Mergeability is worked out as GitHub does, in the background: after a push to either end
  of a pull request it reads `null` (`unknown`) for `merge_compute_s`; a conflict is a file
  both sides changed differently since their merge base.
- A workflow run of a first-time contributor waits for a maintainer's approval: its suite
  concludes `action_required` until `POST .../actions/runs/{id}/approve`, which runs it.

Deliveries: `check_run` (created, completed), `check_suite` (completed), `status`,
`workflow_run` (requested, completed), through `event_observer` (the webhook dispatcher).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import checks_render as shapes
from . import commits
from .messages import ApiError, NotFound
from .model import Record, Repo
from .refs import RefStore

logger = logging.getLogger(__name__)

CONCLUSIONS = (
    "action_required",
    "cancelled",
    "failure",
    "neutral",
    "success",
    "skipped",
    "stale",
    "timed_out",
)
RUN_STATUSES = ("queued", "in_progress", "completed", "waiting", "requested", "pending")
STATUS_STATES = ("error", "failure", "pending", "success")
#: Conclusions of a required check that let a pull request merge.
PASSING = frozenset({"success", "neutral", "skipped"})
#: A suite's conclusion: the first of these any of its runs has.
SUITE_ORDER = (
    "action_required",
    "cancelled",
    "timed_out",
    "failure",
    "stale",
    "neutral",
    "skipped",
    "success",
)
#: Annotations one create or update may carry (GitHub's limit).
MAX_ANNOTATIONS = 50
#: Seconds GitHub's background job takes to work out mergeability after a push.
MERGE_COMPUTE_S = 0.2
#: The App the fake CI and Actions runs belong to.
ACTIONS_APP = "github-actions"


@dataclass
class RepoChecks:
    """One repository's checks; only touched under SimState.lock."""

    runs: dict[int, Record] = field(default_factory=dict)
    suites: dict[int, Record] = field(default_factory=dict)
    #: sha -> commit statuses, oldest first.
    statuses: dict[str, list[Record]] = field(default_factory=dict)
    #: branch -> {strict, checks: [{context, app_id}], enforce_admins}
    protection: dict[str, Record] = field(default_factory=dict)
    workflow_runs: dict[int, Record] = field(default_factory=dict)


class CheckStore(RefStore):
    """Checks, statuses, protection and mergeability; the conventions are IssueStore's."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._checks: dict[int, RepoChecks] = {}
        self._app_ids: dict[str, int] = {}
        #: Called under the lock with (state, repo, event, action, fields, sender) for every
        #: delivery this store makes; the webhook dispatcher sets it.
        self.event_observer: Callable[..., None] | None = None
        #: The fake CI (fake_ci.py), when one runs on pushes.
        self.ci: Any = None
        #: Seconds a pull request's mergeability reads `null` after a push to either end.
        self.merge_compute_s = MERGE_COMPUTE_S

    def checks_of(self, repo: Repo) -> RepoChecks:
        return self._checks.setdefault(repo.id, RepoChecks())

    def app_id(self, slug: str) -> int:
        if slug not in self._app_ids:
            self._app_ids[slug] = self.next_id()
        return self._app_ids[slug]

    def _event(
        self, repo: Repo, event: str, action: str, fields: dict[str, Any], sender: str
    ) -> None:
        if self.event_observer is not None:
            self.event_observer(self, repo, event, action, fields, sender)

    def open_pulls_at(self, repo: Repo, sha: str) -> list[Record]:
        """Open pull requests whose head is `sha` (what a check run or suite lists)."""
        return [
            rec
            for n in sorted(repo.pulls)
            if (rec := repo.issues.get(n)) is not None
            and rec["state"] == "open"
            and rec["pull"]["head_sha"] == sha
        ]

    # ----- check runs ------------------------------------------------------------------------

    def create_check_run(
        self, owner: str, repo: str, body: dict[str, Any], *, app: str, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            name, head_sha = body.get("name"), body.get("head_sha")
            if not isinstance(name, str) or not name.strip():
                raise ApiError(422, 'Invalid request.\n\n"name" wasn\'t supplied.')
            if not isinstance(head_sha, str) or not commits.known(r, head_sha):
                raise ApiError(422, f"No commit found for SHA: {head_sha}")
            suite = self._suite(r, head_sha, app)
            run: Record = {
                "id": self.next_id(),
                "name": name,
                "head_sha": head_sha,
                "app": app,
                "suite_id": suite["id"],
                "status": "queued",
                "conclusion": None,
                "started_at": self.now(),
                "completed_at": None,
                "details_url": None,
                "external_id": "",
                "output": {"title": None, "summary": None, "text": None, "annotations": []},
            }
            self._apply_run_fields(run, body)
            self.checks_of(r).runs[run["id"]] = run
            self._run_event(r, run, "created")
            if run["status"] == "completed":
                self._run_event(r, run, "completed")
            self._suite_changed(r, suite)
            return self._shaped_run(r, run, base_url)

    def update_check_run(
        self,
        owner: str,
        repo: str,
        run_id: int,
        body: dict[str, Any],
        *,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            run = self._run(r, run_id)
            was = run["status"]
            self._apply_run_fields(run, body)
            if run["status"] == "completed" and was != "completed":
                self._run_event(r, run, "completed")
            self._suite_changed(r, self.checks_of(r).suites[run["suite_id"]])
            return self._shaped_run(r, run, base_url)

    def get_check_run(
        self, owner: str, repo: str, run_id: int, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            return self._shaped_run(r, self._run(r, run_id), base_url)

    def check_run_annotations(
        self, owner: str, repo: str, run_id: int, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            run = self._run(r, run_id)
            ctx = self.ctx(base_url)
            return [shapes.annotation(ctx, r, run, a) for a in run["output"]["annotations"]]

    def check_runs_for_ref(
        self,
        owner: str,
        repo: str,
        ref: str,
        *,
        check_name: str | None = None,
        status: str | None = None,
        latest: bool = True,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        """`filter=latest` (the default): the newest run of each name per suite."""
        with self.lock:
            r = self.repo(owner, repo)
            runs = self.runs_at(r, self._sha(r, ref), latest=latest)
            runs = [
                run
                for run in runs
                if (check_name is None or run["name"] == check_name)
                and (status is None or run["status"] == status)
            ]
            return [self._shaped_run(r, run, base_url) for run in reversed(runs)]

    def runs_at(self, repo: Repo, sha: str, *, latest: bool = True) -> list[Record]:
        """Check runs on `sha`, oldest first; `latest`: the newest per (suite, name)."""
        runs = [run for run in self.checks_of(repo).runs.values() if run["head_sha"] == sha]
        if not latest:
            return runs
        newest: dict[tuple[int, str], Record] = {}
        for run in runs:
            newest[(run["suite_id"], run["name"])] = run
        return sorted(newest.values(), key=lambda run: run["id"])

    def _run(self, repo: Repo, run_id: int) -> Record:
        run = self.checks_of(repo).runs.get(run_id)
        if run is None:
            raise NotFound()
        return run

    def _sha(self, repo: Repo, ref: str) -> str:
        sha = commits.resolve(repo, ref)
        if sha is None:
            raise ApiError(422, f"No commit found for SHA: {ref}")
        return sha

    def _apply_run_fields(self, run: Record, body: dict[str, Any]) -> None:
        status, conclusion = body.get("status"), body.get("conclusion")
        if status is not None and status not in RUN_STATUSES:
            raise ApiError(422, f"Invalid request.\n\n{status!r} is not a valid status.")
        if conclusion is not None and conclusion not in CONCLUSIONS:
            raise ApiError(422, f"Invalid request.\n\n{conclusion!r} is not a valid conclusion.")
        if status == "completed" and conclusion is None and run["conclusion"] is None:
            raise ApiError(422, 'Invalid request.\n\n"conclusion" wasn\'t supplied.')
        for key in ("name", "details_url", "external_id", "started_at"):
            if isinstance(body.get(key), str):
                run[key] = body[key]
        if status is not None:
            run["status"] = status
        if conclusion is not None:
            # A conclusion completes the run, as on GitHub.
            run.update(status="completed", conclusion=conclusion)
        if run["status"] == "completed" and run["completed_at"] is None:
            run["completed_at"] = body.get("completed_at") or self.now()
        self._apply_output(run, body.get("output"))

    @staticmethod
    def _apply_output(run: Record, out: Any) -> None:
        if out is None:
            return
        if not isinstance(out, dict) or not out.get("title") or not out.get("summary"):
            raise ApiError(422, 'Invalid request.\n\n"title" and "summary" wasn\'t supplied.')
        notes = out.get("annotations") or []
        if len(notes) > MAX_ANNOTATIONS:
            raise ApiError(422, f"Only {MAX_ANNOTATIONS} annotations are allowed per request")
        for note in notes:
            if not isinstance(note, dict) or not all(
                note.get(k) is not None for k in ("path", "start_line", "message")
            ):
                raise ApiError(422, "Invalid request.\n\nAn annotation needs path, lines, message.")
        current = run["output"]
        current.update({k: out[k] for k in ("title", "summary", "text") if k in out})
        # GitHub appends the annotations of each update to the run's.
        current["annotations"] = [*current["annotations"], *notes]

    def _shaped_run(self, repo: Repo, run: Record, base_url: str | None) -> dict[str, Any]:
        suite = self.checks_of(repo).suites[run["suite_id"]]
        pulls = self.open_pulls_at(repo, run["head_sha"])
        return shapes.check_run(self.ctx(base_url), repo, run, suite, pulls)

    def _run_event(self, repo: Repo, run: Record, action: str) -> None:
        shaped = self._shaped_run(repo, run, None)
        suite = self.checks_of(repo).suites[run["suite_id"]]
        shaped["check_suite"] = self._hook_suite(repo, suite)
        shaped.pop("deployment", None)
        self._event(repo, "check_run", action, {"check_run": shaped}, run["app"])

    # ----- check suites ----------------------------------------------------------------------

    def _suite(self, repo: Repo, head_sha: str, app: str) -> Record:
        for found in self.checks_of(repo).suites.values():
            if found["head_sha"] == head_sha and found["app"] == app:
                return found
        branch = next(
            (
                ref.removeprefix("refs/heads/")
                for ref, sha in sorted(repo.refs.items())
                if sha == head_sha and ref.startswith("refs/heads/")
            ),
            None,
        )
        parents = commits.get(repo, head_sha)["parents"]
        suite: Record = {
            "id": self.next_id(),
            "head_sha": head_sha,
            "head_branch": branch,
            "app": app,
            "app_id": self.app_id(app),
            "status": "queued",
            "conclusion": None,
            "before": parents[0] if parents else commits.ZERO_SHA,
            "created_at": self.now(),
            "updated_at": self.now(),
        }
        self.checks_of(repo).suites[suite["id"]] = suite
        return suite

    def _suite_changed(self, repo: Repo, suite: Record) -> None:
        runs = [r for r in self.runs_at(repo, suite["head_sha"]) if r["suite_id"] == suite["id"]]
        if not runs:
            return
        was = (suite["status"], suite["conclusion"])
        if any(r["status"] != "completed" for r in runs):
            suite.update(status="in_progress", conclusion=None)
        else:
            found = {r["conclusion"] for r in runs}
            conclusion = next((c for c in SUITE_ORDER if c in found), "success")
            suite.update(status="completed", conclusion=conclusion)
        if (suite["status"], suite["conclusion"]) == was:
            return
        suite["updated_at"] = self.now()
        if suite["status"] == "completed":
            payload = {"check_suite": self._hook_suite(repo, suite, full=True)}
            self._event(repo, "check_suite", "completed", payload, suite["app"])
        self._workflow_follows(repo, suite)

    def _hook_suite(self, repo: Repo, suite: Record, *, full: bool = False) -> dict[str, Any]:
        """A suite as check_run (short) and check_suite (full) deliveries carry it."""
        count = len(
            [r for r in self.runs_at(repo, suite["head_sha"]) if r["suite_id"] == suite["id"]]
        )
        shaped = shapes.check_suite(
            self.ctx(None), repo, suite, count, self.open_pulls_at(repo, suite["head_sha"])
        )
        shaped.pop("repository")
        if not full:
            for key in (
                "head_commit",
                "latest_check_runs_count",
                "check_runs_url",
                "rerequestable",
                "runs_rerequestable",
            ):
                shaped.pop(key)
        return shaped

    def check_suites_for_ref(
        self, owner: str, repo: str, ref: str, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            sha = self._sha(r, ref)
            ctx = self.ctx(base_url)
            out = []
            for suite in self.checks_of(r).suites.values():
                if suite["head_sha"] != sha:
                    continue
                count = len([x for x in self.runs_at(r, sha) if x["suite_id"] == suite["id"]])
                out.append(shapes.check_suite(ctx, r, suite, count, self.open_pulls_at(r, sha)))
            return out

    def suites_at(self, repo: Repo, sha: str) -> list[Record]:
        return [s for s in self.checks_of(repo).suites.values() if s["head_sha"] == sha]

    # ----- commit statuses -------------------------------------------------------------------

    def create_status(
        self,
        owner: str,
        repo: str,
        sha: str,
        body: dict[str, Any],
        *,
        creator: str,
        base_url: str | None = None,
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            state = body.get("state")
            if state not in STATUS_STATES:
                raise ApiError(
                    422, f"Validation Failed: state is not included in the list ({state!r})"
                )
            if not commits.known(r, sha):
                raise ApiError(422, f"No commit found for SHA: {sha}")
            rec: Record = {
                "id": self.next_id(),
                "sha": sha,
                "state": state,
                "context": str(body.get("context") or "default"),
                "description": body.get("description"),
                "target_url": body.get("target_url"),
                "creator": self.user(creator),
                "created_at": self.now(),
                "updated_at": self.now(),
            }
            self.checks_of(r).statuses.setdefault(sha, []).append(rec)
            self._status_event(r, rec)
            return shapes.status(self.ctx(base_url), r, rec)

    def latest_statuses(self, repo: Repo, sha: str) -> list[Record]:
        newest: dict[str, Record] = {}
        for rec in self.checks_of(repo).statuses.get(sha, []):
            newest[rec["context"]] = rec
        return sorted(newest.values(), key=lambda rec: rec["context"])

    @staticmethod
    def combined_state(latest: list[Record]) -> str:
        states = {rec["state"] for rec in latest}
        if states & {"failure", "error"}:
            return "failure"
        if not states or "pending" in states:
            return "pending"
        return "success"

    def combined_status(
        self, owner: str, repo: str, ref: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            sha = commits.resolve(r, ref)
            if sha is None:
                raise NotFound(f"No commit found for SHA: {ref}")
            latest = self.latest_statuses(r, sha)
            required = set(self.required_contexts(r, r.default_branch))
            return shapes.combined_status(
                self.ctx(base_url), r, sha, self.combined_state(latest), latest, required
            )

    def statuses_for_ref(
        self, owner: str, repo: str, ref: str, *, base_url: str | None = None
    ) -> list[dict[str, Any]]:
        with self.lock:
            r = self.repo(owner, repo)
            sha = commits.resolve(r, ref)
            if sha is None:
                return []
            ctx = self.ctx(base_url)
            return [
                shapes.status(ctx, r, rec)
                for rec in reversed(self.checks_of(r).statuses.get(sha, []))
            ]

    def _status_event(self, repo: Repo, rec: Record) -> None:
        ctx = self.ctx(None)
        sha = rec["sha"]
        branches = [
            {
                "name": ref.removeprefix("refs/heads/"),
                "commit": {"sha": tip, "url": f"{ctx.api(repo)}/commits/{tip}"},
                "protected": ref.removeprefix("refs/heads/") in self.checks_of(repo).protection,
            }
            for ref, tip in sorted(repo.refs.items())
            if ref.startswith("refs/heads/") and sha in commits.ancestry(repo, tip)
        ][:10]
        creator = ctx.user(rec["creator"])
        fields = {
            "id": rec["id"],
            "sha": sha,
            "name": repo.full_name,
            "avatar_url": creator["avatar_url"] if creator else None,
            "target_url": rec["target_url"],
            "context": rec["context"],
            "description": rec["description"],
            "state": rec["state"],
            "commit": _hook_commit(commits.rest_commit(ctx, repo, commits.get(repo, sha))),
            "branches": branches,
            "created_at": rec["created_at"],
            "updated_at": rec["updated_at"],
        }
        self._event(repo, "status", "", fields, rec["creator"])

    # ----- branch protection -----------------------------------------------------------------

    def set_protection(
        self, owner: str, repo: str, branch: str, body: dict[str, Any], *, base_url: str | None
    ) -> dict[str, Any]:
        """`PUT .../branches/{branch}/protection`: the four top-level keys are required (each
        may be null); only the required status checks and enforce_admins are kept."""
        for key in (
            "required_status_checks",
            "enforce_admins",
            "required_pull_request_reviews",
            "restrictions",
        ):
            if key not in body:
                raise ApiError(422, f'Invalid request.\n\n"{key}" wasn\'t supplied.')
        with self.lock:
            r = self.repo(owner, repo)
            if f"refs/heads/{branch}" not in r.refs:
                raise NotFound("Branch not found")
            checks = body.get("required_status_checks") or {}
            if not isinstance(checks, dict):
                raise ApiError(422, "Invalid request.\n\nrequired_status_checks is not an object.")
            listed = [{"context": str(c), "app_id": None} for c in checks.get("contexts") or []]
            for item in checks.get("checks") or []:
                if isinstance(item, dict) and item.get("context"):
                    listed.append({"context": str(item["context"]), "app_id": item.get("app_id")})
            rule = {
                "strict": bool(checks.get("strict", False)),
                "checks": listed,
                "enforce_admins": bool(body.get("enforce_admins")),
            }
            self.checks_of(r).protection[branch] = rule
            return shapes.protection(self.ctx(base_url), r, branch, rule)

    def protect(self, owner: str, repo: str, branch: str, contexts: list[str]) -> None:
        """Require these status checks on `branch` (tests, seeds)."""
        self.set_protection(
            owner,
            repo,
            branch,
            {
                "required_status_checks": {"strict": False, "contexts": contexts},
                "enforce_admins": False,
                "required_pull_request_reviews": None,
                "restrictions": None,
            },
            base_url=None,
        )

    def get_protection(
        self, owner: str, repo: str, branch: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        with self.lock:
            r = self.repo(owner, repo)
            rule = self.checks_of(r).protection.get(branch)
            if rule is None:
                raise NotFound("Branch not protected")
            return shapes.protection(self.ctx(base_url), r, branch, rule)

    def delete_protection(self, owner: str, repo: str, branch: str) -> None:
        with self.lock:
            r = self.repo(owner, repo)
            if self.checks_of(r).protection.pop(branch, None) is None:
                raise NotFound("Branch not protected")

    def required_contexts(self, repo: Repo, branch: str) -> list[str]:
        rule = self.checks_of(repo).protection.get(branch)
        return [c["context"] for c in rule["checks"]] if rule else []

    def get_branch(
        self, owner: str, repo: str, branch: str, *, base_url: str | None = None
    ) -> dict[str, Any]:
        """A branch with its head commit and protection summary (what read access shows)."""
        with self.lock:
            answer = super().get_branch(owner, repo, branch, base_url=base_url)
            r = self.repo(owner, repo)
            rule = self.checks_of(r).protection.get(branch)
            sha = answer["commit"]["sha"]
            answer["commit"] = commits.rest_commit(self.ctx(base_url), r, commits.get(r, sha))
            answer["protected"] = rule is not None
            answer["protection"] = shapes.branch_protection_summary(
                self.ctx(base_url), r, branch, rule
            )
            return answer

    # ----- what a required check says on a commit --------------------------------------------

    def check_states(self, repo: Repo, sha: str) -> dict[str, str]:
        """Each check name and status context on `sha` -> pending | passing | failing."""
        out: dict[str, str] = {}
        for run in self.runs_at(repo, sha):
            if run["status"] != "completed":
                out[run["name"]] = "pending"
            else:
                out[run["name"]] = "passing" if run["conclusion"] in PASSING else "failing"
        for rec in self.latest_statuses(repo, sha):
            state = rec["state"]
            out[rec["context"]] = {"success": "passing", "pending": "pending"}.get(state, "failing")
        return out

    def unmet_required(self, repo: Repo, rec: Record) -> list[tuple[str, str]]:
        """The required checks of a pull request's base not passing on its head:
        (name, expected | pending | failing)."""
        pr = rec["pull"]
        states = self.check_states(repo, pr["head_sha"])
        return [
            (name, states.get(name, "expected"))
            for name in self.required_contexts(repo, pr["base"])
            if states.get(name) != "passing"
        ]

    # ----- mergeability ----------------------------------------------------------------------

    def conflict(self, repo: Repo, rec: Record) -> bool:
        """Whether both sides changed a file differently since their merge base."""
        pr = rec["pull"]
        base_tip = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
        shared = commits.merge_base(repo, base_tip, pr["head_sha"])
        theirs = commits.diff(repo, shared, base_tip)
        ours = commits.diff(repo, shared, pr["head_sha"])
        return any(path in theirs and theirs[path] != content for path, content in ours.items())

    def merge_view(self, repo: Repo, rec: Record) -> tuple[bool | None, str]:
        """(mergeable, mergeable_state) as worked out now."""
        pr = rec["pull"]
        if pr["merged"] or rec["state"] != "open":
            return None, "unknown"
        if self.conflict(repo, rec):
            return False, "dirty"
        if pr["draft"]:
            return True, "draft"
        if self.unmet_required(repo, rec):
            return True, "blocked"
        rule = self.checks_of(repo).protection.get(pr["base"])
        base_tip = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
        if rule and rule["strict"] and not commits.is_ancestor(repo, base_tip, pr["head_sha"]):
            return True, "behind"
        if "failing" in self.check_states(repo, pr["head_sha"]).values():
            return True, "unstable"
        return True, "clean"

    def pull_read(self, repo: Repo, rec: Record, answer: dict[str, Any]) -> None:
        """A read of one pull request: mergeability is `null` while GitHub's background job
        works it out (`merge_compute_s` after a push to either end), then known."""
        pr = rec["pull"]
        moved = pr.get("merge_moved_s")
        if moved is not None and time.monotonic() - moved < self.merge_compute_s:
            answer.update(mergeable=None, mergeable_state="unknown")
            return
        pr.pop("merge_moved_s", None)
        view = self.merge_view(repo, rec)
        answer.update(mergeable=view[0], mergeable_state=view[1])
        pr["merge_cache"] = (view[0], view[1], view[0])

    def ref_moved(self, repo: Repo, ref: str, push: Record) -> None:
        branch = ref.removeprefix("refs/heads/")
        for n in repo.pulls:
            rec = repo.issues.get(n)
            if rec is not None and branch in (rec["pull"]["head"], rec["pull"]["base"]):
                rec["pull"]["merge_moved_s"] = time.monotonic()
                rec["pull"].pop("merge_cache", None)
        if self.ci is not None and ref.startswith("refs/heads/") and not push["deleted"]:
            self.ci.pushed(self, repo, branch, push)

    def check_merge(self, repo: Repo, rec: Record) -> None:
        """What GitHub refuses at merge time: a conflict, required checks not passed."""
        if self.conflict(repo, rec):
            raise ApiError(405, "Pull Request is not mergeable")
        for name, state in self.unmet_required(repo, rec):
            word = "is failing" if state == "failing" else "is expected"
            raise ApiError(405, f'Required status check "{name}" {word}.')

    def pull_files(self, repo: Repo, rec: Record) -> list[tuple[str, int, int, str]]:
        """(path, additions, deletions, ADDED | MODIFIED | DELETED) the pull request changes."""
        pr = rec["pull"]
        base_tip = repo.refs.get(f"refs/heads/{pr['base']}", pr["base_sha"])
        shared = commits.merge_base(repo, base_tip, pr["head_sha"])
        before = commits.tree(repo, shared) if shared else {}
        out = []
        for path, content in sorted(commits.diff(repo, shared, pr["head_sha"]).items()):
            old = before.get(path)
            if content is None:
                out.append((path, 0, len((old or "").splitlines()) or 1, "DELETED"))
            else:
                kind = "MODIFIED" if old is not None else "ADDED"
                out.append((path, len(content.splitlines()) or 1, 0, kind))
        return out

    # ----- Actions runs waiting for a maintainer ---------------------------------------------

    def request_approval(
        self, owner: str, repo: str, sha: str, *, workflow: str, actor: str
    ) -> Record:
        """A first-time contributor's workflow run on `sha`: it waits for a maintainer's
        approval (`conclusion: action_required`) and runs once approved."""
        with self.lock:
            r = self.repo(owner, repo)
            suite = self._suite(r, sha, ACTIONS_APP)
            suite.update(status="completed", conclusion="action_required", updated_at=self.now())
            runs = self.checks_of(r).workflow_runs
            run: Record = {
                "id": self.next_id(),
                "name": workflow,
                "path": f".github/workflows/{workflow.lower().replace(' ', '-')}.yml",
                "workflow_id": self.app_id(f"workflow:{workflow}"),
                "run_number": len(runs) + 1,
                "display_title": commits.get(r, sha)["message"].splitlines()[0],
                "head_sha": sha,
                "head_branch": suite["head_branch"],
                "suite_id": suite["id"],
                "status": "completed",
                "conclusion": "action_required",
                "actor": self.user(actor),
                "created_at": self.now(),
                "updated_at": self.now(),
            }
            runs[run["id"]] = run
            self._workflow_event(r, run, "requested")
            self._workflow_event(r, run, "completed")
            payload = {"check_suite": self._hook_suite(r, suite, full=True)}
            self._event(r, "check_suite", "completed", payload, ACTIONS_APP)
            return run

    def approve_workflow_run(self, owner: str, repo: str, run_id: int, *, login: str) -> None:
        """`POST .../actions/runs/{id}/approve`: a run waiting for approval runs (the fake CI,
        when there is one); any other run is refused."""
        with self.lock:
            r = self.repo(owner, repo)
            run = self.checks_of(r).workflow_runs.get(run_id)
            if run is None:
                raise NotFound()
            if run["conclusion"] != "action_required":
                raise ApiError(403, "This run is not waiting for approval")
            run.update(status="queued", conclusion=None, updated_at=self.now())
            suite = self.checks_of(r).suites[run["suite_id"]]
            suite.update(status="queued", conclusion=None, updated_at=self.now())
            self._workflow_event(r, run, "requested")
            if self.ci is not None:
                self.ci.run(self, r, run["head_sha"])

    def workflow_runs(
        self,
        owner: str,
        repo: str,
        *,
        head_sha: str | None = None,
        status: str | None = None,
        base_url: str | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `status` matches a status or a conclusion, as GitHub's filter does."""
        with self.lock:
            r = self.repo(owner, repo)
            out = []
            for run in sorted(self.checks_of(r).workflow_runs.values(), key=lambda x: -x["id"]):
                if head_sha is not None and run["head_sha"] != head_sha:
                    continue
                if status is not None and status not in (run["status"], run["conclusion"]):
                    continue
                out.append(self._shaped_workflow_run(r, run, base_url))
            return out

    def _shaped_workflow_run(self, repo: Repo, run: Record, base_url: str | None) -> dict[str, Any]:
        suite = self.checks_of(repo).suites[run["suite_id"]]
        pulls = self.open_pulls_at(repo, run["head_sha"])
        return shapes.workflow_run(self.ctx(base_url), repo, run, pulls, suite)

    def _workflow_follows(self, repo: Repo, suite: Record) -> None:
        """An approved workflow run ends with its suite."""
        for run in self.checks_of(repo).workflow_runs.values():
            if run["suite_id"] != suite["id"] or run["conclusion"] == "action_required":
                continue
            if suite["status"] == "completed" and run["status"] != "completed":
                run.update(status="completed", conclusion=suite["conclusion"])
                run["updated_at"] = self.now()
                self._workflow_event(repo, run, "completed")
            elif suite["status"] != "completed":
                run["status"] = "in_progress"

    def _workflow_event(self, repo: Repo, run: Record, action: str) -> None:
        ctx = self.ctx(None)
        shaped = self._shaped_workflow_run(repo, run, None)
        lite = shapes.repository_lite(ctx, repo)
        shaped.update(repository=lite, head_repository=lite)
        fields = {"workflow_run": shaped, "workflow": shapes.workflow(ctx, repo, run)}
        self._event(repo, "workflow_run", action, fields, run["actor"])


def _hook_commit(rest: dict[str, Any]) -> dict[str, Any]:
    """A commit as a `status` delivery carries it: the REST shape without what the
    published webhook schema does not have (`verified_at`, newer than it)."""
    verification = {k: v for k, v in rest["commit"]["verification"].items() if k != "verified_at"}
    return {**rest, "commit": {**rest["commit"], "verification": verification}}
