"""What the agent command gets for a task: the prompt and task files, the GB_* variables."""

from __future__ import annotations

from pathlib import Path

from github_broker.models import Task

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


def task_env(task: Task, agent_id: str, prompt_file: Path, task_file: Path) -> dict[str, str]:
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
    text = public_json(task)
    if len(text.encode()) <= MAX_ENV_JSON_BYTES:
        env["GB_TASK_JSON"] = text
    return env
