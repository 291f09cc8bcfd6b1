"""Configuration: `broker.yaml` + `agents.yml`, overridden by environment variables.

Precedence, highest first: environment (`GITHUB_BROKER_<SECTION>__<FIELD>`), the config
directory's files, the defaults embedded in the package. Secrets (GitHub token, agent and
admin tokens) come from the environment or from files named in the config, never from
the YAML itself being committed with them.

Sections by what they configure: `connections` (GitHub, Redis), `work` (polling, leases,
reviews, failures, progress, budgets), `checks` (CI and mergeability of the broker's PRs),
`issues` (repositories, roles, labels, bodies), `server` (HTTP server, webhooks, commands,
audit), `planning` (dependencies and sub-issues, GitHub's Priority field and issue types);
`root` holds `Settings`, `loading` reads
the config directory, `messages` words a refused configuration.
"""

from github_broker.settings.base import AGENT_ID_RE, DEFAULTS_DIR, ENV_PREFIX
from github_broker.settings.checks import ChecksSettings
from github_broker.settings.connections import GitHubSettings, RedisSettings
from github_broker.settings.issues import BodyPatterns, LabelNames, Repository, Role, label_clash
from github_broker.settings.loading import default_config_dir, load_settings
from github_broker.settings.people import MaintainerEntry, SignInSettings
from github_broker.settings.planning import DependencySettings, PlanningSettings
from github_broker.settings.root import Settings
from github_broker.settings.server import (
    AuditSettings,
    CommandSettings,
    ServerSettings,
    WebhookSettings,
)
from github_broker.settings.work import (
    BudgetSettings,
    FailureSettings,
    LeaseSettings,
    PollSettings,
    ProgressSettings,
    ReviewSettings,
    SteeringSettings,
)

__all__ = [
    "AGENT_ID_RE",
    "DEFAULTS_DIR",
    "ENV_PREFIX",
    "AuditSettings",
    "BodyPatterns",
    "BudgetSettings",
    "ChecksSettings",
    "CommandSettings",
    "DependencySettings",
    "FailureSettings",
    "GitHubSettings",
    "LabelNames",
    "LeaseSettings",
    "MaintainerEntry",
    "PlanningSettings",
    "PollSettings",
    "ProgressSettings",
    "RedisSettings",
    "Repository",
    "ReviewSettings",
    "Role",
    "ServerSettings",
    "Settings",
    "SignInSettings",
    "SteeringSettings",
    "WebhookSettings",
    "default_config_dir",
    "label_clash",
    "load_settings",
]
