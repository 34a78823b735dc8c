"""Small models shared by several kinds: object references, Job references, conditions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import NAME_MAX, ApiModel, StatusModel, Timestamp

ConditionStatus = Literal["True", "False", "Unknown"]


class ObjectRef(ApiModel):
    """Reference to an object of a known kind in the same namespace."""

    name: str = Field(
        min_length=1, max_length=NAME_MAX, description="Name of the object in the same namespace."
    )


class JobRef(StatusModel):
    """Reference to a batch/v1 Job created for an attempt."""

    name: str = Field(description="Job name.")
    uid: str | None = Field(
        default=None, description="Job UID, to tell a recreated Job of the same name apart."
    )


class Condition(StatusModel):
    """A standard Kubernetes condition (metav1.Condition shape)."""

    type: str = Field(description="Condition type, e.g. InvalidSpec, Duplicate, Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="CamelCase machine-readable reason.")
    message: str | None = Field(default=None, description="Human-readable detail.")
    last_transition_time: Timestamp | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(
        default=None, description="metadata.generation the condition is for."
    )


class SystemPromptRef(ApiModel):
    """A key of a Secret or ConfigMap holding a system prompt."""

    kind: Literal["Secret", "ConfigMap"] = Field(description="Secret or ConfigMap.")
    name: str = Field(min_length=1, max_length=NAME_MAX, description="Its name, in the run's namespace.")
    key: str = Field(min_length=1, max_length=NAME_MAX, description="The key holding the prompt text.")


class SecretKeyRef(ApiModel):
    """A Secret (and optionally one of its keys) in the same namespace."""

    name: str = Field(min_length=1, max_length=NAME_MAX, description="Secret name.")
    key: str | None = Field(default=None, max_length=NAME_MAX, description="The key to read.")


class ConfigMapKeyRef(ApiModel):
    """A ConfigMap (and optionally one of its keys) in the same namespace."""

    name: str = Field(min_length=1, max_length=NAME_MAX, description="ConfigMap name.")
    key: str | None = Field(default=None, max_length=NAME_MAX, description="The key to read.")
