"""A refused configuration in words: the field, where its value came from, the fix."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from pydantic import (
    BaseModel,
    ValidationError,
)

from github_broker.settings.base import ENV_PREFIX
from github_broker.settings.root import Settings


class Origin:
    """Where a setting came from: a command-line option, the environment, a file, a default."""

    def __init__(
        self, broker_file: Path, agents_file: Path, file_keys: set[str], flags: dict[str, str]
    ) -> None:
        self.broker_file = broker_file
        self.agents_file = agents_file
        self.file_keys = file_keys
        self.flags = flags

    def __call__(self, loc: list[str]) -> str:
        env_name = ENV_PREFIX + "__".join(p.upper() for p in loc if not p.isdigit())
        if env_name in os.environ:
            names = [env_name]
        else:
            # A whole section refused (a cross-field rule): every variable inside it counts.
            names = sorted(n for n in os.environ if loc and n.startswith(env_name + "__"))
        sources = [self.flags[n] for n in names if n in self.flags]
        env = [n for n in names if n not in self.flags]
        if env:
            sources.append(f"environment variable{'s' if len(env) > 1 else ''} {', '.join(env)}")
        in_file = loc[0] in self.file_keys if loc else bool(self.file_keys)
        if loc and loc[0] == "agents":
            sources.append(str(self.agents_file))
        elif in_file:
            sources.append(str(self.broker_file))
        elif not names:
            sources.append("the built-in defaults")
        return " and ".join(dict.fromkeys(sources))


def explain(error: ValidationError, origin: Origin) -> str:
    lines = []
    for item in error.errors():
        loc = [str(part) for part in item["loc"]]
        field = ".".join(loc) or "(top level)"
        source = origin(loc)
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            fix = _suggest(loc)
        else:
            shown = item.get("input")
            got = f" (got {shown!r})" if shown is not None and not isinstance(shown, dict) else ""
            message += got
            fix = f"correct `{field}` in {source}"
        lines.append(f"{source}: field `{field}`: {message}. Fix: {fix}.")
    return "Invalid configuration. " + " ".join(lines)


def _suggest(loc: list[str]) -> str:
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if part.isdigit():
            continue
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        inner = getattr(annotation, "__args__", (annotation,))
        candidates = [a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            break
        model = candidates[0]
    known = list(model.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return f"remove the unknown field `{loc[-1]}`; {hint}known fields here: {', '.join(known)}"
