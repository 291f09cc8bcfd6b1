"""What the broker writes on GitHub (all idempotent but `comment`): labels, in one request
when it can (REST or one GraphQL mutation), branches, reactions, comments, repository labels."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any
from urllib.parse import quote

from github_broker.errors import GitHubError, GitHubNotFound, GitHubRefused
from github_broker.gateway.transport import Transport
from github_broker.settings import GitHubSettings

#: Issue node ids remembered per gateway ((repository, number) -> GraphQL id; they never change).
NODE_ID_CACHE_SIZE = 65536
#: One request adds and removes labels: GitHub runs a mutation document's fields in order.
ADD_LABELS = (
    "add: addLabelsToLabelable(input: {labelableId: $id, labelIds: $add}) {clientMutationId}"
)
REMOVE_LABELS = (
    "remove: removeLabelsFromLabelable(input: {labelableId: $id, labelIds: $remove}) "
    "{clientMutationId}"
)


class Writes(Transport):
    """The writes, with the node ids a GraphQL label mutation needs."""

    def __init__(self, settings: GitHubSettings) -> None:
        super().__init__(settings)
        self._label_ids: dict[str, dict[str, str]] = {}  # repository -> lower name -> node id
        self._node_ids: OrderedDict[tuple[str, int], str] = OrderedDict()

    def add_labels(self, full_name: str, number: int, labels: list[str]) -> None:
        if labels:
            _, _, data = self._request(
                "POST", f"{self._repo(full_name)}/issues/{number}/labels", body={"labels": labels}
            )
            self._remember_labels(full_name, data if isinstance(data, list) else [])

    def change_labels(
        self,
        full_name: str,
        number: int,
        add: list[str],
        remove: list[str],
        *,
        node_id: str | None = None,
    ) -> None:
        """Add and remove labels in one request (one counted call): REST when only adding,
        else one GraphQL mutation document.

        GraphQL needs node ids: the issue's comes from `node_id` (the mirror's) or is read
        once; label ids from the repository's label list, read conditionally (a 304 is free)
        once and again only when a label to remove is unknown. A label the repository lacks
        cannot be on the issue, so removing it needs no call; adding one we hold no id for
        goes through REST (one call too), which creates it and answers with its id.
        """
        if not remove:
            # Adding alone is one REST call as well, and needs no ids.
            self.add_labels(full_name, number, add)
            return
        # Unknown names to add go through REST anyway: only removals need the list read.
        ids = self._known_label_ids(full_name, remove)
        if any(label.lower() not in ids for label in add):
            self.add_labels(full_name, number, add)
            add = []
        remove = [label for label in remove if label.lower() in ids]
        if not add and not remove:
            return
        issue_id = node_id or self._issue_node_id(full_name, number)
        fields = ([ADD_LABELS] if add else []) + ([REMOVE_LABELS] if remove else [])
        params = (
            ["$id: ID!"]
            + (["$add: [ID!]!"] if add else [])
            + (["$remove: [ID!]!"] if remove else [])
        )
        variables = {
            "id": issue_id,
            "add": [ids[label.lower()] for label in add],
            "remove": [ids[label.lower()] for label in remove],
        }
        document = f"mutation({', '.join(params)}) {{ {' '.join(fields)} }}"
        try:
            self._graphql(document, variables)
        except GitHubNotFound as e:
            if issue_id in str(e):
                raise
            # A label was deleted or renamed since we listed them: list again next time.
            with self._lock:
                self._label_ids.pop(full_name, None)
            raise GitHubError(str(e), status=404) from e
        with self._lock:
            self._node_ids[(full_name, number)] = issue_id

    def _known_label_ids(self, full_name: str, names: list[str]) -> dict[str, str]:
        with self._lock:
            ids = self._label_ids.get(full_name)
        if ids is None or any(name.lower() not in ids for name in names):
            labels = self._list(f"{self._repo(full_name)}/labels")
            with self._lock:
                self._label_ids[full_name] = {}
            self._remember_labels(full_name, labels)
        with self._lock:
            return dict(self._label_ids[full_name])

    def _remember_labels(self, full_name: str, labels: list[dict[str, Any]]) -> None:
        with self._lock:
            known = self._label_ids.setdefault(full_name, {})
            for label in labels:
                if isinstance(label, dict) and label.get("node_id"):
                    known[str(label["name"]).lower()] = str(label["node_id"])

    def _issue_node_id(self, full_name: str, number: int) -> str:
        with self._lock:
            cached = self._node_ids.get((full_name, number))
        if cached:
            return cached
        _, _, data = self._request("GET", f"{self._repo(full_name)}/issues/{number}")
        node_id = str((data or {}).get("node_id") or "")
        with self._lock:
            self._node_ids[(full_name, number)] = node_id
            while len(self._node_ids) > NODE_ID_CACHE_SIZE:
                self._node_ids.popitem(last=False)
        return node_id

    def remove_label(self, full_name: str, number: int, label: str) -> None:
        """REST removal of one label (the write queue uses `change_labels` instead)."""
        # Already absent (404) means the wish is fulfilled.
        with contextlib.suppress(GitHubNotFound):
            self._request(
                "DELETE", f"{self._repo(full_name)}/issues/{number}/labels/{quote(label, safe='')}"
            )

    def react(self, full_name: str, comment_id: int, content: str) -> None:
        """A reaction (`+1`, `confused`, ...) on an issue comment; reacting twice is one."""
        self._request(
            "POST",
            f"{self._repo(full_name)}/issues/comments/{comment_id}/reactions",
            body={"content": content},
        )

    def comment(self, full_name: str, number: int, body: str) -> None:
        """A new comment on an issue or pull request (not idempotent: never retried)."""
        self._request(
            "POST", f"{self._repo(full_name)}/issues/{number}/comments", body={"body": body}
        )

    def create_branch(self, full_name: str, branch: str, base: str) -> bool:
        """Create `branch` at the tip of `base`; False when it already exists."""
        # Conditional: while the base branch does not move this is a free 304.
        ref = self._get_cached(f"{self._repo(full_name)}/git/ref/heads/{quote(base, safe='/')}")
        sha = ref["object"]["sha"]
        try:
            self._request(
                "POST",
                f"{self._repo(full_name)}/git/refs",
                body={"ref": f"refs/heads/{branch}", "sha": sha},
            )
        except GitHubRefused as e:
            if e.code == "already_exists":
                return False  # an earlier attempt or a person made it
            raise
        return True

    def ensure_label(self, full_name: str, name: str, color: str, description: str) -> bool:
        """Create a repository label; False when it exists already."""
        try:
            self._request(
                "POST",
                f"{self._repo(full_name)}/labels",
                body={"name": name, "color": color, "description": description},
            )
        except GitHubRefused as e:
            if e.code == "already_exists":
                return False
            raise
        return True
