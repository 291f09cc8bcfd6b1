"""Prompt templates (`config/prompts/<task_type>.md`, `$name` placeholders), checked at start-up."""

from __future__ import annotations

from pathlib import Path
from string import Template

from github_broker.errors import ConfigError
from github_broker.models import TaskType
from github_broker.settings import DEFAULTS_DIR

#: Placeholders every template may use.
PLACEHOLDERS = frozenset(
    {
        "repository",
        "issue_number",
        "issue_url",
        "title",
        "body",
        "labels",
        "branch",
        "base_branch",
        "role",
        "role_description",
        "task_type",
        "pr_url",
        "feedback",
    }
)


class Prompts:
    """One template per task type; unknown placeholders are refused when loading."""

    def __init__(self, templates: dict[TaskType, Template]) -> None:
        self.templates = templates

    @classmethod
    def load(cls, config_dir: Path | None) -> Prompts:
        templates = {}
        for task_type in TaskType:
            path = _find(config_dir, task_type)
            text = path.read_text(encoding="utf-8")
            template = Template(text)
            if not template.is_valid():
                raise ConfigError(
                    f"{path}: a `$` is not followed by a placeholder name. Write `$$` for a "
                    "literal dollar sign."
                )
            unknown = set(template.get_identifiers()) - PLACEHOLDERS
            if unknown:
                raise ConfigError(
                    f"{path}: unknown placeholder(s) {_names(unknown)}. "
                    f"Fix: use only {_names(PLACEHOLDERS)}."
                )
            templates[task_type] = template
        return cls(templates)

    def render(self, task_type: TaskType, values: dict[str, str]) -> str:
        return self.templates[task_type].substitute({p: "" for p in PLACEHOLDERS} | values)


def _find(config_dir: Path | None, task_type: TaskType) -> Path:
    if config_dir is not None:
        candidate = config_dir / "prompts" / f"{task_type}.md"
        if candidate.exists():
            return candidate
    return DEFAULTS_DIR / "prompts" / f"{task_type}.md"


def _names(names: set[str] | frozenset[str]) -> str:
    return ", ".join("$" + n for n in sorted(names))
