"""Maintainers steer running work: `actions.py` (revoke, reassign, note, retry; pause, stop,
resume an agent; pause a repository or the broker: the one use case behind the admin API, the
CLI verbs, the dashboard's forms and `commands/`, the `/broker …` comments on GitHub)."""
