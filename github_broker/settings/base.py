"""What every section shares: frozen, no unknown fields; where defaults live; the env prefix."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
)

from github_broker.models import AGENT_ID_PATTERN

#: Where the embedded defaults live; the sandbox runs on these alone.
DEFAULTS_DIR = Path(__file__).parent.parent / "defaults"
ENV_PREFIX = "GITHUB_BROKER_"
#: Agent ids become GitHub labels (at most 50 characters) and parts of Redis keys.
AGENT_ID_RE = re.compile(AGENT_ID_PATTERN)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
