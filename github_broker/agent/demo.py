"""The sandbox's stand-in coding agent: pretends to work, then acts on the simulated GitHub.

Run by the runner with the GB_* variables of one task, it acts as a real agent would, so the
broker's progress tracking sees it: development pushes a commit to the task's branch (the
simulator's push control route stands in for `git push`) and opens a PR that closes the
issue; a review approves the PR (merging it is a person's job: the sandbox's simulated
maintainer does it); a fix pushes a commit and answers on the PR. Imports only `requests`,
so each task starts fast.
"""

from __future__ import annotations

import argparse
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

    def push(self, branch: str, message: str, author: str) -> str:
        """One commit on `branch` (created from the default branch if missing)."""
        body = {"branch": branch, "message": message, "author": author}
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


def act(github: SimulatedGitHub, env: Mapping[str, str]) -> str:
    """Do what the task type asks; returns a one-line summary."""
    task_type, number, branch = env["GB_TASK_TYPE"], env["GB_ISSUE_ID"], env["GB_BRANCH"]
    agent = env["GB_AGENT_ID"]
    if task_type == "development":
        pushed = github.push(branch, env["GB_TITLE"], agent)
        body = f"Closes #{number}\n\nDone by {agent} in the github-broker sandbox."
        opened = github.open_pull(env["GB_TITLE"], branch, env["GB_BASE_BRANCH"], body)
        return f"{pushed}; {opened}"
    owner = env["GB_REPOSITORY"].split("/")[0]
    pr = github.pull_for(owner, branch)
    if pr is None:
        return f"no open PR from {branch}; nothing to do"
    if task_type == "review":
        return github.approve(pr)
    pushed = github.push(branch, "Address the review feedback", agent)
    return f"{pushed}; " + github.comment(pr, "Addressed the review feedback in a new commit.")


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
    args = parser.parse_args(argv)
    env = os.environ
    where = f"{env['GB_AGENT_ID']} {env['GB_REPOSITORY']}#{env['GB_ISSUE_ID']}"
    print(f"{where}: working on the {env['GB_TASK_TYPE']} task for {args.seconds:.1f}s", flush=True)
    time.sleep(args.seconds)
    try:
        summary = act(SimulatedGitHub(args.github_url, env["GB_REPOSITORY"]), env)
    except requests.RequestException as e:
        print(f"{where}: the simulated GitHub refused: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"{where}: {summary}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
