"""`Settings`: every section, the rules across sections, environment over files."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from github_broker.settings.base import AGENT_ID_RE, ENV_PREFIX
from github_broker.settings.checks import ChecksSettings
from github_broker.settings.connections import GitHubSettings, RedisSettings
from github_broker.settings.issues import BodyPatterns, LabelNames, Repository, Role, label_clash
from github_broker.settings.people import SignInSettings
from github_broker.settings.planning import DependencySettings, PlanningSettings
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

_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class Settings(BaseSettings):
    """Everything the broker needs; built once per process (or per test) and passed down."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    #: `owner/name` strings or mappings; the environment takes `a/b,c/d` or JSON.
    repositories: Annotated[list[Repository], NoDecode] = []
    priority_mode: Literal["strict", "best_effort"] = "strict"
    #: Whether issues skipped for their body (no branch, no deliverables, bad branch) hold
    #: the strict bucket at their priority; by default only work someone can take does.
    bucket_counts_unassignable: bool = False
    #: Whether issues that wait on a person (reviewed and awaiting merge or new feedback,
    #: needs-human, a budget reached, held by a maintainer) still hold the strict bucket at
    #: their priority: the stricter rule, nothing lower until the PR is merged. By default
    #: they do not, so agents never idle because a person is slow.
    bucket_holds_for_people: bool = False
    github: GitHubSettings = GitHubSettings()
    redis: RedisSettings = RedisSettings()
    poll: PollSettings = PollSettings()
    leases: LeaseSettings = LeaseSettings()
    failures: FailureSettings = FailureSettings()
    progress: ProgressSettings = ProgressSettings()
    budgets: BudgetSettings = BudgetSettings()
    steering: SteeringSettings = SteeringSettings()
    audit: AuditSettings = AuditSettings()
    labels: LabelNames = LabelNames()
    review: ReviewSettings = ReviewSettings()
    checks: ChecksSettings = ChecksSettings()
    body: BodyPatterns = BodyPatterns()
    server: ServerSettings = ServerSettings()
    webhooks: WebhookSettings = WebhookSettings()
    commands: CommandSettings = CommandSettings()
    dependencies: DependencySettings = DependencySettings()
    planning: PlanningSettings = PlanningSettings()
    signin: SignInSettings = SignInSettings()
    agents: list[Role] = []

    @field_validator("repositories", mode="before")
    @classmethod
    def _repo_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                value = json.loads(text)
            else:
                value = [part.strip() for part in text.split(",") if part.strip()]
        if not isinstance(value, list):
            return value
        out = []
        for item in value:
            if isinstance(item, str):
                if not _REPO_RE.match(item):
                    raise ValueError(f"{item!r} is not of the form owner/name")
                owner, name = item.split("/")
                out.append({"owner": owner, "name": name})
            else:
                out.append(item)
        return out

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        names = [r.full_name for r in self.repositories]
        if len(set(names)) != len(names):
            raise ValueError(f"repositories lists a repository twice: {names}")
        if self.repositories:
            self.server.resolved_maintainers(set(names))
        roles = [a.role for a in self.agents]
        if len(set(roles)) != len(roles):
            raise ValueError(f"agents.yml lists a role twice: {roles}")
        clashing = sorted(
            agent
            for agent in self.server.resolved_agent_tokens().values()
            if label_clash(agent, self.labels, roles)
        )
        if clashing:
            raise ValueError(
                f"agent ids {clashing} are also labels the broker relies on (roles, priorities, "
                "in-progress, ...), compared case-insensitively as GitHub does; the agent id "
                "becomes a label that is removed after each task, so give those agents other ids"
            )
        unknown = sorted(set(self.planning.type_roles.values()) - set(roles))
        if unknown and roles:
            raise ValueError(
                f"planning.type_roles maps issue types to {unknown}, not roles of agents.yml "
                f"({', '.join(roles)}): name a configured role"
            )
        malformed = sorted(
            agent
            for agent in self.server.resolved_agent_tokens().values()
            if not AGENT_ID_RE.match(agent)
        )
        if malformed:
            raise ValueError(
                f"agent ids {malformed} are not usable as GitHub labels: use 1-50 characters "
                "from A-Z a-z 0-9 . _ -, starting with a letter or digit"
            )
        return self

    @property
    def roles(self) -> list[str]:
        return [a.role for a in self.agents]

    def label_clash(self, agent_id: str) -> str | None:
        """The label `agent_id` would collide with on GitHub, or None."""
        return label_clash(agent_id, self.labels, self.roles)

    def repository(self, full_name: str) -> Repository | None:
        return next((r for r in self.repositories if r.full_name == full_name), None)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the files, which arrive as init kwargs from load_settings().
        return env_settings, init_settings
