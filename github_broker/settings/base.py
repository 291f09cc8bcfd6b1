"""What every section shares: frozen, no unknown fields; where defaults live; the env prefix."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
)

#: Where the embedded defaults live; the sandbox runs on these alone.
DEFAULTS_DIR = Path(__file__).parent.parent / "defaults"
ENV_PREFIX = "GITHUB_BROKER_"
#: Agent ids become GitHub labels (at most 50 characters) and parts of Redis keys.
AGENT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,49}$")


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
