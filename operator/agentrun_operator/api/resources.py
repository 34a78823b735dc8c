"""The supporting kinds: Agent, AgentProvider and ImplementationSpec.

They take every field of the original v1alpha1 API (docs/migration.md), plus our own image/command form
of a provider and `defaults.retries`.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, model_validator

from . import rules
from .agentrun import MAX_SYSTEM_PROMPT, InlineImplementation
from .base import (
    API_VERSION,
    MAX_COMMAND_ARGS,
    MAX_ENV,
    MAX_NAME_LIST,
    MAX_PATH_LENGTH,
    NAME_MAX,
    ApiModel,
    ApiVersion,
    StatusModel,
    Timestamp,
)
from .common import Condition, ObjectRef, SystemPromptRef
from .implementation import MAX_URL, ImplementationFields
from .workload import EnvVar, ResourceRequirements

DEFAULT_RUNNER_BINARY: Final = "/usr/local/bin/agent-runner"
MAX_RETRIES: Final = 100
MAX_INPUT_FILES: Final = 64
MAX_ARTIFACTS: Final = 50

__all__ = [
    "DEFAULT_RUNNER_BINARY",
    "Agent",
    "AgentDefaults",
    "AgentProvider",
    "AgentProviderSpec",
    "AgentSpec",
    "ImplementationSpec",
    "ImplementationSpecSpec",
    "InlineImplementation",
    "SimpleStatus",
]


class SimpleStatus(StatusModel):
    """Status of the supporting kinds; reserved for readiness conditions."""

    observed_generation: int | None = Field(default=None, description="metadata.generation last observed.")
    updated_at: Timestamp | None = Field(default=None, description="When the status was last written.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class InputFile(ApiModel):
    """A file written into the agent's container before it starts (runner contract)."""

    path: str = Field(
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="Absolute path of the file in the container; {{ ... }} templates are rendered.",
    )
    content: str = Field(description="The file's content; {{ ... }} templates are rendered.")


class OutputArtifact(ApiModel):
    """A file the agent leaves, reported in the run's status.artifacts."""

    name: str = Field(min_length=1, max_length=NAME_MAX, description="The artifact's name.")
    path: str | None = Field(
        default=None, max_length=MAX_PATH_LENGTH, description="Absolute path of the file in the container."
    )
    key: str | None = Field(default=None, max_length=1024, description="Storage key, passed through.")
    url: str | None = Field(
        default=None, max_length=MAX_URL, description="Where it can be fetched, passed through."
    )


class SecretEnv(ApiModel):
    """An environment variable of the agent's container taken from a Secret key."""

    name: str = Field(min_length=1, max_length=NAME_MAX, description="Variable name.")
    secret_name: str = Field(
        min_length=1, max_length=NAME_MAX, description="The Secret, in the run's namespace."
    )
    key: str = Field(min_length=1, max_length=NAME_MAX, description="The Secret's key.")
    optional: bool | None = Field(
        default=None, description="When true, a missing Secret or key leaves the variable unset."
    )


class ServiceAccountToken(ApiModel):
    """A projected service account token mounted into the agent's container."""

    audience: str = Field(min_length=1, max_length=NAME_MAX, description="The token's audience.")
    expiration_seconds: int = Field(ge=600, le=3600, description="Token lifetime in seconds (600..3600).")
    mount_path: str = Field(
        min_length=1, max_length=MAX_PATH_LENGTH, description="Absolute path the token is mounted at."
    )


class ProviderWorkload(ApiModel):
    """Workload defaults of a provider, under the run's and the step's workload."""

    image: str | None = Field(default=None, max_length=1024, description="Container image with the runner.")
    resources: ResourceRequirements | None = Field(
        default=None, description="CPU/memory requests and limits of the container."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=NAME_MAX,
        description="Service account of the pod; an Agent's security.allowedServiceAccounts may restrict it.",
    )
    service_account_token: ServiceAccountToken | None = Field(
        default=None, description="A projected token (audience, expirationSeconds, mountPath)."
    )


class ProviderHealth(ApiModel):
    """How the provider reacts to capacity failures of its runs (passed through)."""

    capacity_failure_policy: Literal["degrade", "block"] | None = Field(
        default=None, description="degrade or block; recorded, not interpreted by this operator."
    )


class AgentProviderSpec(ApiModel):
    """How to launch an agent: either `image` + `command`/`args`/`env` ($(VAR) expanded from the pod's
    environment), or the runner contract: `binary` run with `argsTemplate`/`envTemplate` rendered
    (docs/api.md#agentprovider)."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.PROVIDER_COMMAND_OR_BINARY))

    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Container image with the agent CLI (else workload.image, the run's, or the operator's).",
    )
    command: list[str] | None = Field(
        default=None, max_length=MAX_COMMAND_ARGS, description="Entrypoint, e.g. [codex, exec]."
    )
    args: list[str] | None = Field(
        default=None,
        max_length=MAX_COMMAND_ARGS,
        description="Arguments; $(VAR) is expanded from the environment.",
    )
    env: list[EnvVar] | None = Field(
        default=None, max_length=MAX_ENV, description="Environment of the agent CLI (core EnvVar)."
    )
    binary: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description=f"Runner contract: the program the container runs (default {DEFAULT_RUNNER_BINARY}).",
    )
    args_template: list[str] | None = Field(
        default=None, max_length=MAX_COMMAND_ARGS, description="Runner contract: args, {{ ... }} rendered."
    )
    env_template: dict[str, str] | None = Field(
        default=None,
        description="Runner contract: environment variables, values {{ ... }} rendered.",
        json_schema_extra={"maxProperties": MAX_ENV},
    )
    input_files: list[InputFile] | None = Field(
        default=None,
        max_length=MAX_INPUT_FILES,
        description="Files written into the container (path, content).",
    )
    output_artifacts: list[OutputArtifact] | None = Field(
        default=None,
        max_length=MAX_ARTIFACTS,
        description="Files the agent leaves, reported in status.artifacts.",
    )
    secret_env: list[SecretEnv] | None = Field(
        default=None, max_length=MAX_ENV, description="Environment variables from Secret keys."
    )
    adapter: dict[str, Any] | None = Field(
        default=None,
        description="Free-form runner configuration, given to the runner in agent-runner.json.",
    )
    workload: ProviderWorkload | None = Field(
        default=None,
        description="Workload defaults: image, resources, serviceAccountName, serviceAccountToken.",
    )
    health: ProviderHealth | None = Field(
        default=None, description="Capacity failure policy (recorded, not interpreted)."
    )

    @model_validator(mode="after")
    def _one_form(self) -> AgentProviderSpec:
        """Mirror of the CRD rule."""
        if self.command is not None and self.binary is not None:
            raise ValueError(rules.PROVIDER_COMMAND_OR_BINARY.message)
        return self

    @property
    def uses_runner(self) -> bool:
        """True for the runner contract: `binary` set, or no `image` of our own form (the original's)."""
        return self.binary is not None or (self.image is None and self.command is None)

    @property
    def runner_binary(self) -> str:
        """The program of the runner contract: `binary`, else the default."""
        return self.binary if self.binary is not None else DEFAULT_RUNNER_BINARY


class AgentSecurity(ApiModel):
    """What runs of this Agent may use; an absent list allows everything."""

    allowed_secrets: list[str] | None = Field(
        default=None,
        max_length=MAX_NAME_LIST,
        description="Secrets a run's spec.secrets may name.",
    )
    allowed_service_accounts: list[str] | None = Field(
        default=None,
        max_length=MAX_NAME_LIST,
        description="Service accounts a run's pods may use (workload.serviceAccountName).",
    )
    allowed_implementation_source_providers: list[str] | None = Field(
        default=None,
        max_length=MAX_NAME_LIST,
        description="Task source providers (github, linear, manual, custom) a run's task may come from.",
    )


class AgentDefaults(ApiModel):
    """Defaults for steps that run this Agent and do not set the value themselves."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(
            rules.DEFAULTS_SYSTEM_PROMPT_ONE_OF, rules.DEFAULTS_RETRIES_ONE_OF
        )
    )

    timeout_seconds: int | None = Field(default=None, ge=0, description="Per-attempt timeout, 0 = none.")
    retries: int | None = Field(default=None, ge=0, le=MAX_RETRIES, description="Retries per iteration.")
    retry_limit: int | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description=f"The original API's name of retries (used as retries, at most {MAX_RETRIES}).",
    )
    system_prompt: str | None = Field(
        default=None,
        max_length=MAX_SYSTEM_PROMPT,
        description="System prompt of the agent, given to the pod as a file (AGENTRUN_SYSTEM_PROMPT_PATH).",
    )
    system_prompt_ref: SystemPromptRef | None = Field(
        default=None, description="System prompt from a Secret or ConfigMap key (instead of systemPrompt)."
    )

    @model_validator(mode="after")
    def _rules(self) -> AgentDefaults:
        """Mirrors of the CRD rules."""
        if self.system_prompt is not None and self.system_prompt_ref is not None:
            raise ValueError(rules.DEFAULTS_SYSTEM_PROMPT_ONE_OF.message)
        if self.retries is not None and self.retry_limit is not None:
            raise ValueError(rules.DEFAULTS_RETRIES_ONE_OF.message)
        return self

    @property
    def effective_retries(self) -> int | None:
        """`retries`, else `retryLimit` (capped at the operator's bound), else None."""
        if self.retries is not None:
            return self.retries
        return None if self.retry_limit is None else min(self.retry_limit, MAX_RETRIES)


class AgentSpec(ApiModel):
    """An agent: a provider plus environment, security allow lists and step defaults."""

    provider_ref: ObjectRef | None = Field(
        default=None, description="The AgentProvider that says how to launch the agent CLI."
    )
    env: list[EnvVar] | None = Field(
        default=None, max_length=MAX_ENV, description="Extra environment, over the provider's."
    )
    defaults: AgentDefaults | None = Field(
        default=None, description="Defaults for steps run with this Agent."
    )
    config: dict[str, Any] | None = Field(
        default=None, description="Free-form agent configuration (template context agent.config)."
    )
    security: AgentSecurity | None = Field(
        default=None, description="Allow lists for secrets, service accounts and task sources."
    )
    vcs_ref: ObjectRef | None = Field(
        default=None, description="VersionControlProvider used when the run and its task name none."
    )
    memory_ref: ObjectRef | None = Field(
        default=None, description="A Memory; accepted and passed on, not interpreted (docs/api.md#memoryref)."
    )


class ImplementationSpecSpec(ImplementationFields):
    """A reusable task description."""


class _Object(ApiModel):
    model_config = ConfigDict(extra="ignore")

    api_version: ApiVersion = Field(default=API_VERSION, description=API_VERSION)
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    status: SimpleStatus | None = Field(default=None, description="Observed state.")


class AgentProvider(_Object):
    """An AgentProvider object."""

    kind: Literal["AgentProvider"] = Field(default="AgentProvider", description="AgentProvider")
    spec: AgentProviderSpec = Field(description="Desired state.")


class Agent(_Object):
    """An Agent object."""

    kind: Literal["Agent"] = Field(default="Agent", description="Agent")
    spec: AgentSpec = Field(description="Desired state.")


class ImplementationSpec(_Object):
    """An ImplementationSpec object."""

    kind: Literal["ImplementationSpec"] = Field(
        default="ImplementationSpec", description="ImplementationSpec"
    )
    spec: ImplementationSpecSpec = Field(description="Desired state.")
