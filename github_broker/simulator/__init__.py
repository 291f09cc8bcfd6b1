"""Local GitHub REST API simulator that unmodified PyGithub talks to over real HTTP.

Standalone dev tool: it imports nothing else from github_broker.
"""

from __future__ import annotations

import logging

from .faults import FaultRule, Faults
from .messages import ApiError, NotFound
from .ratelimit import RateLimiter
from .seed import DEMO_SEED_PATH, apply_seed, generate_issues, load_seed
from .server import Simulator
from .state import SimState
from .stats import Stats

logger = logging.getLogger(__name__)

__all__ = [
    "DEMO_SEED_PATH",
    "ApiError",
    "FaultRule",
    "Faults",
    "NotFound",
    "RateLimiter",
    "SimState",
    "Simulator",
    "Stats",
    "apply_seed",
    "generate_issues",
    "load_seed",
]
