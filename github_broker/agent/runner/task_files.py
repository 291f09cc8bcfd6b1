"""What the agent command gets for a task (the prompt and task files, the GB_* variables) and
the usage file it may write back."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import ValidationError

from github_broker.agent.client import Usage
from github_broker.models import Task

logger = logging.getLogger(__name__)

#: GB_TASK_JSON is left out above this size (bytes): Linux refuses an environment string over
#: 128 KiB, and GB_TASK_FILE always has the same JSON.
MAX_ENV_JSON_BYTES = 64 * 1024


def public_json(task: Task) -> str:
    """The task as the command sees it: everything but the lease token, which stays with us."""
    return task.model_dump_json(exclude={"lease": {"token"}})


def write_task_files(task: Task, directory: Path) -> tuple[Path, Path]:
    """Write the prompt and the task JSON into `directory`; returns both paths."""
    prompt = directory / "prompt.md"
    prompt.write_text(task.prompt, encoding="utf-8")
    task_file = directory / "task.json"
    task_file.write_text(public_json(task), encoding="utf-8")
    return prompt, task_file


def task_env(
    task: Task,
    agent_id: str,
    prompt_file: Path,
    task_file: Path,
    notes_file: Path | None = None,
    usage_file: Path | None = None,
) -> dict[str, str]:
    """The GB_* variables a command gets for `task`."""
    env = {
        "GB_AGENT_ID": agent_id,
        "GB_REPOSITORY": task.repository,
        "GB_ISSUE_ID": str(task.issue_id),
        "GB_ISSUE_URL": task.issue_url,
        "GB_TITLE": task.title,
        "GB_BRANCH": task.branch_name,
        "GB_BASE_BRANCH": task.base_branch,
        "GB_TASK_TYPE": task.task_type.value,
        "GB_ROLE": task.required_role,
        "GB_PR_URL": task.pr_url or "",
        "GB_PROMPT_FILE": str(prompt_file),
        "GB_TASK_FILE": str(task_file),
    }
    if notes_file is not None:
        env["GB_NOTES_FILE"] = str(notes_file)
    if usage_file is not None:
        env["GB_USAGE_FILE"] = str(usage_file)
    text = public_json(task)
    if len(text.encode()) <= MAX_ENV_JSON_BYTES:
        env["GB_TASK_JSON"] = text
    return env


class UsageFile:
    """`GB_USAGE_FILE`: where the command may keep what it has spent on the task so far, as
    JSON running totals (`{"tokens": 12000, "cost": 0.42}`); each heartbeat reports it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._warned = False

    def read(self) -> Usage | None:
        """The usage written so far; None when there is none (or it does not read: said once)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn(str(e))
            return None
        try:
            return Usage.model_validate_json(raw)
        except ValidationError as e:
            self._warn(f'expected {{"tokens": N, "cost": X}}: {e.errors()[0]["msg"]}')
            return None

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("usage file %s not reported: %s", self.path, why)
