"""The lease signing key the broker makes for itself when none is configured: kept in a file
(never in Redis: a signed token is how a lease is proven after Redis lost its data, so its key
must outlive that loss), created once, readable by its owner alone."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from pathlib import Path

import yaml

#: Where the broker keeps state of its own (the generated signing key), unless
#: GITHUB_BROKER_STATE_DIR says otherwise.
STATE_ENV = "GITHUB_BROKER_STATE_DIR"
#: The generated key file's name in that directory.
KEYS_FILE = "signing_keys.yaml"


def default_keys_file() -> Path:
    """`$GITHUB_BROKER_STATE_DIR/signing_keys.yaml`, else under `$XDG_STATE_HOME` (or
    `~/.local/state`) `/github-broker/`."""
    explicit = os.environ.get(STATE_ENV)
    if explicit:
        return Path(explicit) / KEYS_FILE
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "github-broker" / KEYS_FILE


def read_or_create(path: Path) -> dict[str, str]:
    """The keys of `path` (key id -> secret); a missing file is created first with one fresh
    key. ValueError naming the file and the fix when it can be neither read nor made."""
    try:
        return _read_or_create(path)
    except OSError as e:
        raise ValueError(
            f"lease signing keys file {path}: {e.strerror or e}; make its directory writable, "
            f"set {STATE_ENV} to one that is, or configure leases.signing_keys"
        ) from e


def _read_or_create(path: Path) -> dict[str, str]:
    """Several processes starting at once agree: the file appears whole (a link of a finished
    temporary file) or not at all, and the one that loses the race reads it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        kid = time.strftime("k%Y%m%d", time.gmtime())
        text = yaml.safe_dump({kid: secrets.token_urlsafe(32)})
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".signing-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(temp, 0o600)
            with contextlib.suppress(FileExistsError):  # another process made it first
                os.link(temp, path)
        finally:
            os.unlink(temp)
    loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"signing keys file {path}: map each key id to its secret")
    return {str(kid): str(secret) for kid, secret in loaded.items()}
