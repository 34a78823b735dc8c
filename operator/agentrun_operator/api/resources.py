"""The supporting kinds: Agent, AgentProvider and ImplementationSpec.

They are deliberately minimal (docs/design.md#api): enough to launch an agent CLI with a task, nothing more.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints

from .agentrun import InlineImplementation
from .base import (
    API_VERSION,
    MAX_ACCEPTANCE_CRITERIA,
    MAX_COMMAND_ARGS,
    MAX_ENV,
    MAX_IMPLEMENTATION_TEXT,
    ApiModel,
    ApiVersion,
    StatusModel,
)
from .common import Condition, ObjectRef
from .workload import EnvVar

__all__ = [
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
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Standard conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class AgentProviderSpec(ApiModel):
    """How to launch an agent CLI. $(VAR) in command/args is expanded from the pod's environment."""

    image: str = Field(min_length=1, max_length=1024, description="Container image with the agent CLI.")
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


class AgentDefaults(ApiModel):
    """Defaults for steps that run this Agent and do not set the value themselves."""

    timeout_seconds: int | None = Field(default=None, ge=0, description="Per-attempt timeout, 0 = none.")
    retries: int | None = Field(default=None, ge=0, le=100, description="Retries per iteration.")


class AgentSpec(ApiModel):
    """An agent: a provider plus environment and step defaults."""

    provider_ref: ObjectRef | None = Field(
        default=None, description="The AgentProvider that says how to launch the agent CLI."
    )
    env: list[EnvVar] | None = Field(
        default=None, max_length=MAX_ENV, description="Extra environment, over the provider's."
    )
    defaults: AgentDefaults | None = Field(
        default=None, description="Defaults for steps run with this Agent."
    )


class ImplementationSpecSpec(ApiModel):
    """A reusable task description."""

    text: str = Field(
        max_length=MAX_IMPLEMENTATION_TEXT, description="The task for the agent (at most 128 KiB)."
    )
    summary: str | None = Field(default=None, max_length=1024, description="One-line summary of the task.")
    acceptance_criteria: list[Annotated[str, StringConstraints(max_length=4096)]] | None = Field(
        default=None, max_length=MAX_ACCEPTANCE_CRITERIA, description="Checks the result must pass."
    )


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
