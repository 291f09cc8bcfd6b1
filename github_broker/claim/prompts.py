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
        "head_sha",
    }
)
#: Templates beside the task types': a fix from failing checks, a rebase from a conflict
#: (leader/checks.py names one in the fix task's payload).
VARIANTS = ("fix_checks", "rebase")


class Prompts:
    """One template per task type (and per variant); unknown placeholders are refused when
    loading."""

    def __init__(self, templates: dict[str, Template]) -> None:
        self.templates = templates
        #: Each template split once into literal text and placeholder names: a render (once
        #: per claim, on the hot path) is one join instead of a regex pass with a callback.
        self._parts = {task_type: _split(t) for task_type, t in templates.items()}

    @classmethod
    def load(cls, config_dir: Path | None) -> Prompts:
        templates: dict[str, Template] = {}
        for task_type in [*TaskType, *VARIANTS]:
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

    def render(self, task_type: str, values: dict[str, str]) -> str:
        """The prompt: `Template.substitute` with every unset placeholder empty; `task_type`
        a task type or a variant (VARIANTS)."""
        return "".join(
            part if literal else values.get(part, "") for literal, part in self._parts[task_type]
        )


def _split(template: Template) -> list[tuple[bool, str]]:
    """(True, text) for literal text (`$$` already a `$`), (False, name) for a placeholder."""
    parts: list[tuple[bool, str]] = []
    at = 0
    for m in template.pattern.finditer(template.template):
        parts.append((True, template.template[at : m.start()]))
        name = m.group("named") or m.group("braced")
        parts.append((False, name) if name else (True, "$"))  # `$$`: invalid ones are refused
        at = m.end()
    parts.append((True, template.template[at:]))
    return [p for p in parts if p[1] or not p[0]]


def _find(config_dir: Path | None, task_type: str) -> Path:
    if config_dir is not None:
        candidate = config_dir / "prompts" / f"{task_type}.md"
        if candidate.exists():
            return candidate
    return DEFAULTS_DIR / "prompts" / f"{task_type}.md"


def _names(names: set[str] | frozenset[str]) -> str:
    return ", ".join("$" + n for n in sorted(names))
