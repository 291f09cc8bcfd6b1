"""Runner presets: how each coding CLI runs one task non-interactively and takes its prompt."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Longest prompt (bytes) passed as one argument: Linux refuses a single argument over
#: 128 KiB (MAX_ARG_STRLEN). Longer prompts go on stdin or in a file, as each CLI allows.
MAX_PROMPT_ARG_BYTES = 100 * 1024

PROMPT, PROMPT_FILE = "{prompt}", "{prompt_file}"


@dataclass(frozen=True)
class Preset:
    """A CLI's argv with the prompt in it (`{prompt}`), and the argv for a prompt too long
    for one argument (`{prompt_file}`, or none: the runner pipes the prompt on stdin)."""

    name: str
    argv: tuple[str, ...]
    long_argv: tuple[str, ...]
    about: str

    @property
    def executable(self) -> str:
        return self.argv[0]

    def command(self, prompt: str, prompt_file: Path, extra: Sequence[str] = ()) -> list[str]:
        """The command for one task; `extra` (the words after `--`) goes at the end."""
        words = self.argv if _fits(prompt) else self.long_argv
        filled = {PROMPT: prompt, PROMPT_FILE: str(prompt_file)}
        return [filled.get(word, word) for word in words] + list(extra)

    def reads_stdin(self, prompt: str) -> bool:
        """Whether the command takes the prompt on stdin. When it does not, stdin must stay
        empty: claude and codex add piped input to the prompt, which would say it twice."""
        return not _fits(prompt) and PROMPT_FILE not in self.long_argv

    def missing(self) -> str | None:
        """Why this preset cannot run here, or None."""
        if shutil.which(self.executable) is None:
            return f"preset {self.name!r} needs {self.executable!r} on PATH ({self.about})"
        return None


def _fits(prompt: str) -> bool:
    return len(prompt.encode()) <= MAX_PROMPT_ARG_BYTES


PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in (
        # -p prints the answer and exits; edits are accepted, other tools follow the user's
        # settings (add e.g. `--allowedTools "Bash(git:*)"` after `--`). Without a prompt
        # argument, -p reads it from stdin.
        Preset(
            "claude",
            ("claude", "-p", PROMPT, "--permission-mode", "acceptEdits", "--output-format", "text"),
            ("claude", "-p", "--permission-mode", "acceptEdits", "--output-format", "text"),
            "Claude Code, npm install -g @anthropic-ai/claude-code",
        ),
        # `codex exec` is the non-interactive mode; its default sandbox is read-only, so the
        # workspace is made writable. `-` reads the prompt from stdin.
        Preset(
            "codex",
            ("codex", "exec", "--sandbox", "workspace-write", PROMPT),
            ("codex", "exec", "--sandbox", "workspace-write", "-"),
            "Codex CLI, npm install -g @openai/codex",
        ),
        # -p runs one prompt headless; auto_edit approves file edits. Piped stdin is added to
        # the -p prompt, which carries the long prompt.
        Preset(
            "gemini",
            ("gemini", "--approval-mode", "auto_edit", "-p", PROMPT),
            (
                "gemini",
                "--approval-mode",
                "auto_edit",
                "-p",
                "Do the task described in the text above.",
            ),
            "Gemini CLI, npm install -g @google/gemini-cli",
        ),
        # --message runs one instruction and exits; --yes-always answers its confirmations.
        Preset(
            "aider",
            ("aider", "--yes-always", "--message", PROMPT),
            ("aider", "--yes-always", "--message-file", PROMPT_FILE),
            "aider, python -m pip install aider-install && aider-install",
        ),
    )
}
