"""Webhook deliveries of the simulated GitHub: signed, GitHub-shaped, with delivery faults.

Every change the simulator makes to an issue or PR (``IssueStore.touch`` and friends) is
compared with the last state this module saw, and turned into the events GitHub would send
(``issues.labeled``, ``pull_request_review.submitted``, ...). A sender thread POSTs them to
the configured URLs with GitHub's headers, outside the state lock.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import queue
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import pushes, render
from .messages import ApiError, Response
from .model import Record, Repo

logger = logging.getLogger(__name__)

USER_AGENT = "GitHub-Hookshot/simulator"
#: Seconds a delivery POST may take before it counts as failed (GitHub waits 10 s).
DELIVERY_TIMEOUT_S = 10.0
#: Deliveries kept for GET /_sim/webhooks.
LOG_SIZE = 500
FAULT_KINDS = ("lose", "duplicate", "reorder", "delay")
_USER_URLS = (
    "followers_url",
    "following_url",
    "gists_url",
    "starred_url",
    "subscriptions_url",
    "organizations_url",
    "repos_url",
    "events_url",
    "received_events_url",
)
_SIMPLE_PULL_DROPS = (
    "merged",
    "mergeable",
    "rebaseable",
    "mergeable_state",
    "merged_by",
    "comments",
    "review_comments",
    "maintainer_can_modify",
    "commits",
    "additions",
    "deletions",
    "changed_files",
)


@dataclass
class Hook:
    id: int
    url: str
    secret: str
    repository: str | None = None  # owner/name, or None for every repository (an App)
    events: list[str] = field(default_factory=lambda: ["*"])

    def wants(self, repo: str, event: str) -> bool:
        if self.repository is not None and self.repository.lower() != repo.lower():
            return False
        return "*" in self.events or event in self.events or event == "ping"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "repository": self.repository,
            "events": self.events,
        }


@dataclass
class DeliveryFault:
    """``lose``/``duplicate`` hit ``count`` deliveries (None: all) with ``probability``;
    ``reorder`` holds ``window`` deliveries and sends them newest first; ``delay`` waits."""

    kind: str
    id: int
    count: int | None = None
    probability: float = 1.0
    window: int = 2
    delay_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "count": self.count,
            "probability": self.probability,
            "window": self.window,
            "delay_ms": self.delay_ms,
        }


@dataclass
class Delivery:
    hook: Hook
    guid: str
    event: str
    action: str
    body: bytes


class WebhookDispatcher:
    """Hooks, their faults and the sender thread; attached to a SimState as its observer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[Hook] = []
        self._faults: list[DeliveryFault] = []
        self._ids = itertools.count(1)
        self._shadow: dict[tuple[str, int], dict[str, Any]] = {}
        self._outbox: queue.Queue[Delivery | None] = queue.Queue()
        self._held: list[Delivery] = []
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self.log: deque[dict[str, Any]] = deque(maxlen=LOG_SIZE)
        self._thread: threading.Thread | None = None

    # ----- configuration (control API) -------------------------------------------------------

    def add_hook(self, state: Any, spec: dict[str, Any]) -> Hook:
        url, secret = str(spec["url"]), str(spec.get("secret") or "")
        if not url.startswith(("http://", "https://")):
            raise ApiError(422, "url must be an http(s) URL")
        events = spec.get("events") or ["*"]
        hook = Hook(next(self._ids), url, secret, spec.get("repository"), list(events))
        with state.lock:
            if state.observer is None:
                self._snapshot_all(state)
                state.observer = self.observe
                state.push_observer = self.pushed
                state.event_observer = self.emitted
                state.graph_observer = self.graph_event
            with self._lock:
                self._hooks.append(hook)
            for repo in state.repo_records():
                if hook.wants(repo.full_name, "ping"):
                    self._emit(state, repo, "ping", "", _ping_fields(hook), [hook])
        self._ensure_thread()
        return hook

    def clear_hooks(self) -> None:
        with self._lock:
            self._hooks.clear()

    def add_fault(self, spec: dict[str, Any]) -> DeliveryFault:
        kind = str(spec.get("kind") or spec.get("type") or "")
        if kind not in FAULT_KINDS:
            raise ApiError(422, f"unknown delivery fault {kind!r}; expected one of {FAULT_KINDS}")
        fault = DeliveryFault(
            kind,
            next(self._ids),
            count=spec.get("count"),
            probability=float(spec.get("probability", 1.0)),
            window=max(2, int(spec.get("window", 2))),
            delay_ms=float(spec.get("delay_ms", 0.0)),
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            held, self._held = self._held, []
        for delivery in held:
            self._outbox.put(delivery)

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "hooks": [h.to_dict() for h in self._hooks],
                "faults": [f.to_dict() for f in self._faults],
                "deliveries": list(self.log),
            }

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Block until every delivery made so far was sent (held ones excepted)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending > len(self._held):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self) -> None:
        if self._thread is not None:
            self._outbox.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    # ----- observing the state (called under the state lock) ---------------------------------

    def _snapshot_all(self, state: Any) -> None:
        for repo in state.repo_records():
            for rec in repo.issues.values():
                self._shadow[(repo.full_name, rec["number"])] = _shape(repo, rec)

    def observe(self, state: Any, repo: Repo, rec: Record, hint: str | None = None) -> None:
        key = (repo.full_name, rec["number"])
        before = self._shadow.get(key)
        after = _shape(repo, rec)
        self._shadow[key] = after
        if not self._hooks:
            return
        kind = "pull_request" if rec["pull"] is not None else "issues"
        ctx = state.ctx(None)
        item = render.pull(ctx, repo, rec) if rec["pull"] else render.issue(ctx, repo, rec)
        base: dict[str, Any] = {"issue" if kind == "issues" else "pull_request": item}
        if kind == "pull_request":
            base["number"] = rec["number"]
        if hint == "deleted":
            self._emit(state, repo, kind, "deleted", base)
            self._shadow.pop(key, None)
            return
        if before is None:
            self._emit(state, repo, kind, "opened", base)
            return
        changes = {f: {"from": before[f] or ""} for f in ("title", "body") if before[f] != after[f]}
        if changes:
            self._emit(state, repo, kind, "edited", {**base, "changes": changes})
        if before["state"] != after["state"]:
            self._emit(
                state, repo, kind, "closed" if after["state"] == "closed" else "reopened", base
            )
        for name in after["labels"]:
            if name not in before["labels"]:
                label = render.label(ctx, repo, repo.labels[name.lower()])
                self._emit(state, repo, kind, "labeled", {**base, "label": label})
        for name in before["labels"]:
            if name not in after["labels"] and name.lower() in repo.labels:
                label = render.label(ctx, repo, repo.labels[name.lower()])
                self._emit(state, repo, kind, "unlabeled", {**base, "label": label})
        n = rec["number"]
        issue_side = render.issue(ctx, repo, rec)
        for comment in repo.issue_comments.get(n, [])[before["comments"] :]:
            payload = {"issue": issue_side, "comment": render.issue_comment(ctx, repo, n, comment)}
            self._emit(state, repo, "issue_comment", "created", payload)
        simple = {k: v for k, v in item.items() if k not in _SIMPLE_PULL_DROPS}
        for rv in repo.reviews.get(n, [])[before["reviews"] :]:
            if rv["state"] != "PENDING":
                review = render.review(ctx, repo, n, rv)
                review["state"] = review["state"].lower()  # webhooks say changes_requested
                payload = {"review": review, "pull_request": simple}
                self._emit(state, repo, "pull_request_review", "submitted", payload)
        for c in repo.review_comments.get(n, [])[before["review_comments"] :]:
            payload = {"comment": render.review_comment(ctx, repo, n, c), "pull_request": simple}
            self._emit(state, repo, "pull_request_review_comment", "created", payload)

    def graph_event(
        self, state: Any, repo: Repo, event: str, action: str, fields: dict[str, Any], sender: str
    ) -> None:
        """A relationship, issue type or issue field changed (simulator/graph.py, planning.py):
        `issue_dependencies`, `sub_issues`, `issues.typed` ... sent as GitHub sends them."""
        if self._hooks:
            org = {"organization": _organization(state.ctx(None), repo.owner)}
            self._emit(state, repo, event, action, {**fields, **org}, sender=sender)

    def pushed(self, state: Any, repo: Repo, push: Record) -> None:
        """A ref moved (simulator/refs.py): GitHub's `push`, then `synchronize` for each open
        pull request whose head it moved, both sent by the pusher."""
        if not self._hooks:
            return
        ctx = state.ctx(None)
        pusher = push["pusher"]
        self._emit(state, repo, "push", "", pushes.payload(ctx, repo, push), sender=pusher)
        for number in push["pulls"]:
            fields = {
                "number": number,
                "before": push["before"],
                "after": push["after"],
                "pull_request": render.pull(ctx, repo, repo.issues[number]),
            }
            self._emit(state, repo, "pull_request", "synchronize", fields, sender=pusher)

    def emitted(
        self,
        state: Any,
        repo: Repo,
        event: str,
        action: str,
        fields: dict[str, Any],
        sender: str | None = None,
    ) -> None:
        """An event another store made (checks.py: check runs and suites, statuses,
        workflow runs), sent by `sender`."""
        if self._hooks:
            self._emit(state, repo, event, action, fields, sender=sender)

    def _emit(
        self,
        state: Any,
        repo: Repo,
        event: str,
        action: str,
        fields: dict[str, Any],
        hooks: list[Hook] | None = None,
        *,
        sender: str | None = None,
    ) -> None:
        ctx = state.ctx(None)
        payload = {**({"action": action} if action else {}), **fields}
        payload["repository"] = render.repository(ctx, repo)
        payload["sender"] = ctx.user(sender or repo.owner)
        shaped = _hook_shape(payload)
        if event == "push":
            shaped["repository"] = pushes.repository(shaped["repository"], repo)
        body = json.dumps(shaped).encode()
        with self._lock:
            targets = [h for h in (hooks or self._hooks) if h.wants(repo.full_name, event)]
            self._pending += len(targets)
        for hook in targets:
            self._outbox.put(Delivery(hook, str(uuid.uuid4()), event, action, body))

    # ----- sending ---------------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sim-webhooks", daemon=True)
            self._thread.start()

    def _fault(self, kind: str, *, consume: bool = True) -> DeliveryFault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind != kind or random.random() >= fault.probability:
                    continue
                if consume and fault.count is not None:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    def _run(self) -> None:
        while (delivery := self._outbox.get()) is not None:
            if self._fault("lose"):
                self._done(delivery, "lost")
                continue
            batch = [delivery]
            # A reorder fault holds `window` deliveries and lets them go newest first; its
            # count is in windows.
            reorder = self._fault("reorder", consume=False)
            if reorder is not None:
                with self._lock:
                    self._held.append(delivery)
                    self._idle.notify_all()  # held counts as settled for wait_idle
                    if len(self._held) < reorder.window:
                        continue
                    batch, self._held = self._held[::-1], []
                self._fault("reorder")
            for item in batch:
                delay = self._fault("delay")
                if delay is not None:
                    threading.Timer(delay.delay_ms / 1000, self._send_counted, [item]).start()
                else:
                    self._send_counted(item)

    def _send_counted(self, delivery: Delivery) -> None:
        status = self._send(delivery)
        if self._fault("duplicate"):
            self._send(delivery)  # a redelivery keeps its X-GitHub-Delivery id
        self._done(delivery, status)

    def _done(self, delivery: Delivery, status: int | str) -> None:
        with self._idle:
            self.log.append(
                {
                    "guid": delivery.guid,
                    "hook_id": delivery.hook.id,
                    "event": delivery.event,
                    "action": delivery.action,
                    "status": status,
                }
            )
            self._pending -= 1
            self._idle.notify_all()

    def _send(self, delivery: Delivery) -> int | str:
        hook = delivery.hook
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-GitHub-Event": delivery.event,
            "X-GitHub-Delivery": delivery.guid,
            "X-GitHub-Hook-ID": str(hook.id),
            "X-GitHub-Hook-Installation-Target-Type": "repository",
        }
        if hook.secret:
            key = hook.secret.encode()
            sha1 = hmac.new(key, delivery.body, hashlib.sha1).hexdigest()
            sha256 = hmac.new(key, delivery.body, hashlib.sha256).hexdigest()
            headers["X-Hub-Signature"] = f"sha1={sha1}"
            headers["X-Hub-Signature-256"] = f"sha256={sha256}"
        request = urllib.request.Request(hook.url, delivery.body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=DELIVERY_TIMEOUT_S) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except (urllib.error.URLError, OSError) as e:
            logger.debug("webhook delivery to %s failed: %s", hook.url, e)
            return "failed"


def _ping_fields(hook: Hook) -> dict[str, Any]:
    """GitHub pings a hook once it is created."""
    return {
        "zen": "Design for failure.",
        "hook_id": hook.id,
        "hook": {"type": "Repository", "id": hook.id, "events": hook.events, "active": True},
    }


def _organization(ctx: Any, login: str) -> dict[str, Any]:
    """The owner as the `organization` of a delivery (organization-simple-webhooks)."""
    user = ctx.user(login, "Organization")
    api = f"{ctx.base}/orgs/{login}"
    return {
        "login": login,
        "id": user["id"],
        "node_id": f"O_{user['id']}",
        "url": api,
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events",
        "hooks_url": f"{api}/hooks",
        "issues_url": f"{api}/issues",
        "members_url": f"{api}/members{{/member}}",
        "public_members_url": f"{api}/public_members{{/member}}",
        "avatar_url": user["avatar_url"],
        "description": None,
    }


def _shape(repo: Repo, rec: Record) -> dict[str, Any]:
    """What a later change is compared against."""
    n = rec["number"]
    return {
        "title": rec["title"],
        "body": rec["body"],
        "state": rec["state"],
        "labels": list(rec["labels"]),
        "comments": len(repo.issue_comments.get(n, [])),
        "reviews": len(repo.reviews.get(n, [])),
        "review_comments": len(repo.review_comments.get(n, [])),
    }


def _hook_shape(value: Any) -> Any:
    """REST JSON -> webhook JSON: webhooks carry a few more fields than the REST answers."""
    if isinstance(value, list):
        return [_hook_shape(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _hook_shape(v) for k, v in value.items()}
    if "login" in out and "site_admin" in out:
        # Newer than the published webhook schemas (@octokit/webhooks-schemas 7.6.1).
        out.pop("user_view_type", None)
        for name in _USER_URLS:
            out.setdefault(name, f"{out['url']}/{name.removesuffix('_url')}")
    if "full_name" in out and "default_branch" in out:
        out = _hook_repository(out)
    if "comments_url" in out and "events_url" in out and "repository_url" in out:
        # An issue in a delivery names no parent (GitHub's webhook issue schema has no field).
        out.pop("parent_issue_url", None)
        out.setdefault("timeline_url", f"{out['url']}/timeline")
        out.setdefault("reactions", _reactions(out["url"]))
    if "issue_url" in out and "performed_via_github_app" in out:
        out.setdefault("reactions", _reactions(out["url"]))
    if "diff_hunk" in out:
        out.setdefault("original_start_line", None)
        out.setdefault("reactions", _reactions(out["url"]))
        out.setdefault(
            "_links",
            {
                "self": {"href": out["url"]},
                "html": {"href": out["html_url"]},
                "pull_request": {"href": out["pull_request_url"]},
            },
        )
    if "head" in out and "base" in out and "diff_url" in out:
        out.setdefault(
            "_links",
            {
                "self": {"href": out["url"]},
                "html": {"href": out["html_url"]},
                "issue": {"href": out["issue_url"]},
                "comments": {"href": out["comments_url"]},
                "review_comments": {"href": out["review_comments_url"]},
                "review_comment": {"href": out["review_comment_url"]},
                "commits": {"href": out["commits_url"]},
                "statuses": {"href": out["statuses_url"]},
            },
        )
    return out


def _reactions(url: str) -> dict[str, Any]:
    """The summary of an object the simulator keeps no reactions for (issues, PR comments)."""
    return render.reaction_rollup(url, [])


def _hook_repository(rest: dict[str, Any]) -> dict[str, Any]:
    api, html = rest["url"], rest["html_url"]
    # GET /repos/{owner}/{repo}'s own fields; webhook payloads carry the shorter shape.
    only_rest = {"permissions", "network_count", "subscribers_count"}
    data = {k: v for k, v in rest.items() if k not in only_rest}
    templated = {
        "forks_url": "/forks",
        "keys_url": "/keys{/key_id}",
        "collaborators_url": "/collaborators{/collaborator}",
        "teams_url": "/teams",
        "hooks_url": "/hooks",
        "issue_events_url": "/issues/events{/number}",
        "events_url": "/events",
        "assignees_url": "/assignees{/user}",
        "tags_url": "/tags",
        "blobs_url": "/git/blobs{/sha}",
        "git_tags_url": "/git/tags{/sha}",
        "trees_url": "/git/trees{/sha}",
        "statuses_url": "/statuses/{sha}",
        "languages_url": "/languages",
        "stargazers_url": "/stargazers",
        "contributors_url": "/contributors",
        "subscribers_url": "/subscribers",
        "subscription_url": "/subscription",
        "commits_url": "/commits{/sha}",
        "git_commits_url": "/git/commits{/sha}",
        "comments_url": "/comments{/number}",
        "issue_comment_url": "/issues/comments{/number}",
        "contents_url": "/contents/{+path}",
        "compare_url": "/compare/{base}...{head}",
        "merges_url": "/merges",
        "archive_url": "/{archive_format}{/ref}",
        "downloads_url": "/downloads",
        "milestones_url": "/milestones{/number}",
        "notifications_url": "/notifications{?since,all,participating}",
        "releases_url": "/releases{/id}",
        "deployments_url": "/deployments",
    }
    for name, suffix in templated.items():
        data.setdefault(name, api + suffix)
    host = html.split("://", 1)[-1].split("/", 1)[0]
    data.update(
        git_url=f"git://{host}/{rest['full_name']}.git",
        ssh_url=f"git@{host}:{rest['full_name']}.git",
        svn_url=html,
        homepage=None,
        size=0,
        stargazers_count=0,
        watchers_count=0,
        language=None,
        has_projects=True,
        has_downloads=True,
        has_wiki=True,
        has_pages=False,
        forks_count=0,
        mirror_url=None,
        license=None,
        forks=0,
        watchers=0,
        is_template=False,
        web_commit_signoff_required=False,
        topics=[],
        custom_properties={},
    )
    return data


def control(
    dispatcher: WebhookDispatcher, state: Any, method: str, path: str, body: Any
) -> Response:
    """/_sim/webhooks (GET, POST a hook, DELETE all) and /_sim/webhooks/faults (POST, DELETE)."""
    if path == "/_sim/webhooks":
        if method == "GET":
            return Response(200, dispatcher.describe())
        if method == "POST" and isinstance(body, dict):
            return Response(201, dispatcher.add_hook(state, body).to_dict())
        if method == "DELETE":
            dispatcher.clear_hooks()
            return Response(200, dispatcher.describe())
    if path == "/_sim/webhooks/faults":
        if method == "POST" and isinstance(body, dict):
            return Response(201, dispatcher.add_fault(body).to_dict())
        if method == "DELETE":
            dispatcher.clear_faults()
            return Response(200, dispatcher.describe())
    raise ApiError(404, "Not Found")
