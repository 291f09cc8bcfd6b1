"""The sandbox's stand-in coding agent: pretends to work, then acts on the simulated GitHub.

Run by the runner with the GB_* variables of one task, it acts as a real agent would, so the
broker's progress tracking sees it: development pushes a commit to the task's branch (the
simulator's push control route stands in for `git push`) and opens a PR that closes the
issue; a review approves the PR (merging it is a person's job: the sandbox's simulated
maintainer does it); a fix pushes a commit and answers on the PR. Imports only `requests`,
so each task starts fast.

Done means green: on every `--red-every`th issue (by number) the development push also
leaves `.ci-fail` in the branch, on which the sandbox's fake CI fails; the fix task the
broker makes of that failure removes it (red -> fix -> green). A rebase task merges the
base branch into the PR's branch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import requests

#: Seconds the demo agent "works" on a task unless told otherwise.
DEFAULT_WORK_S = 2.0
#: The simulator accepts any token; real GitHub would want a real one.
SIMULATOR_TOKEN = "sandbox-demo-agent"
#: Seconds before a call to the simulator is abandoned.
TIMEOUT_S = 10.0
#: The sandbox's fake CI fails while a file under this folder is in a branch
#: (simulator/fake_ci.py); one file per issue, so two PRs never share it.
CI_MARKER = ".ci-fail"
#: Issues whose number leaves this remainder (divided by --red-every) get a failing push.
RED_REMAINDER = 1


class SimulatedGitHub:
    """The few REST calls the demo agent makes, against the simulator's base URL."""

    def __init__(self, base_url: str, repository: str) -> None:
        self.repo_url = f"{base_url.rstrip('/')}/repos/{repository}"
        self.control_url = f"{base_url.rstrip('/')}/_sim/repos/{repository}"
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {SIMULATOR_TOKEN}"

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
    ) -> requests.Response:
        return self.session.request(
            method, self.repo_url + path, json=body, params=params, timeout=TIMEOUT_S
        )

    def open_pull(self, title: str, head: str, base: str, body: str) -> str:
        r = self.call("POST", "/pulls", {"title": title, "head": head, "base": base, "body": body})
        if r.status_code == 422 and "already exists" in r.text:
            return f"a PR from {head} is open already"
        r.raise_for_status()
        return f"opened PR #{r.json()['number']} ({head} -> {base})"

    def pull_for(self, owner: str, branch: str) -> int | None:
        r = self.call("GET", "/pulls", params={"head": f"{owner}:{branch}", "state": "open"})
        r.raise_for_status()
        pulls = r.json()
        return int(pulls[0]["number"]) if pulls else None

    def push(
        self,
        branch: str,
        message: str,
        author: str,
        files: dict[str, str | None] | None = None,
        merge: str | None = None,
    ) -> str:
        """One commit on `branch` (created from the default branch if missing) changing
        `files` (None deletes one); `merge`: a branch it merges in."""
        body: dict[str, Any] = {"branch": branch, "message": message, "author": author}
        if files:
            body["files"] = files
        if merge:
            body["merge"] = merge
        r = self.session.post(f"{self.control_url}/push", json=body, timeout=TIMEOUT_S)
        r.raise_for_status()
        return f"pushed {r.json()['after'][:7]} to {branch}"

    def approve(self, pr: int) -> str:
        r = self.call(
            "POST",
            f"/pulls/{pr}/reviews",
            {"event": "APPROVE", "body": "Checked against the issue: looks good."},
        )
        r.raise_for_status()
        return f"approved PR #{pr} (a maintainer merges it)"

    def comment(self, number: int, body: str) -> str:
        r = self.call("POST", f"/issues/{number}/comments", {"body": body})
        r.raise_for_status()
        return f"answered on PR #{number}"


def act(github: SimulatedGitHub, env: Mapping[str, str], red_every: int = 0) -> str:
    """Do what the task type asks; returns a one-line summary."""
    task_type, branch = env["GB_TASK_TYPE"], env["GB_BRANCH"]
    agent = env["GB_AGENT_ID"]
    if task_type == "development":
        return develop(github, env, red_every)
    owner = env["GB_REPOSITORY"].split("/")[0]
    pr = github.pull_for(owner, branch)
    if pr is None:
        return f"no open PR from {branch}; nothing to do"
    if task_type == "review":
        return github.approve(pr)
    kinds = {
        c.get("kind")
        for c in json.loads(env.get("GB_TASK_JSON") or "{}").get("review_comments") or []
    }
    if "conflict" in kinds:
        base = env["GB_BASE_BRANCH"]
        pushed = github.push(branch, f"Merge {base} into {branch}", agent, merge=base)
        return f"{pushed}; " + github.comment(pr, f"Merged {base} and resolved the conflicts.")
    if "check" in kinds:
        marker = f"{CI_MARKER}/issue-{env['GB_ISSUE_ID']}"
        pushed = github.push(branch, "Fix the failing test", agent, {marker: None})
        return f"{pushed} (the failing check's cause removed); " + github.comment(
            pr, "Fixed the failing check."
        )
    pushed = github.push(branch, "Address the review feedback", agent)
    return f"{pushed}; " + github.comment(pr, "Addressed the review feedback in a new commit.")


def develop(github: SimulatedGitHub, env: Mapping[str, str], red_every: int) -> str:
    """Push the work (on every `red_every`th issue with a test that fails) and open the PR."""
    number, branch, agent = env["GB_ISSUE_ID"], env["GB_BRANCH"], env["GB_AGENT_ID"]
    files: dict[str, str | None] = {f"src/issue_{number}.py": f"# {env['GB_TITLE']}\n"}
    red = red_every > 0 and int(number) % red_every == RED_REMAINDER
    if red:
        files[f"{CI_MARKER}/issue-{number}"] = (
            f"test_issue_{number} fails: an edge case the demo agent forgot"
        )
    pushed = github.push(branch, env["GB_TITLE"], agent, files)
    if red:
        pushed += f" (with a failing test, on purpose: the fake CI fails on {CI_MARKER})"
    body = f"Closes #{number}\n\nDone by {agent} in the github-broker sandbox."
    opened = github.open_pull(env["GB_TITLE"], branch, env["GB_BASE_BRANCH"], body)
    return f"{pushed}; {opened}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m github_broker.agent.demo",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--github-url", required=True, help="the simulator's base URL")
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_WORK_S,
        help="how long to pretend to work (default %(default)s)",
    )
    parser.add_argument(
        "--red-every",
        type=int,
        default=0,
        help="on every Nth issue the development push makes CI fail (0: never)",
    )
    args = parser.parse_args(argv)
    env = os.environ
    where = f"{env['GB_AGENT_ID']} {env['GB_REPOSITORY']}#{env['GB_ISSUE_ID']}"
    print(f"{where}: working on the {env['GB_TASK_TYPE']} task for {args.seconds:.1f}s", flush=True)
    time.sleep(args.seconds)
    try:
        summary = act(SimulatedGitHub(args.github_url, env["GB_REPOSITORY"]), env, args.red_every)
    except requests.RequestException as e:
        print(f"{where}: the simulated GitHub refused: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{where}: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
