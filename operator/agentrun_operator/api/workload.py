"""Container-level models shared by AgentRun, Agent and AgentProvider: env, resources, volumes.

The Kubernetes core types are mirrored only as deep as a user needs to write them; deeper or
rarely used corners are kept free-form (`x-kubernetes-preserve-unknown-fields`) so new upstream
fields pass through instead of being pruned.
"""

from __future__ import annotations

import re
from typing import Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from . import rules
from .base import (
    DNS_LABEL_MAX,
    DNS_LABEL_PATTERN,
    MAX_COMMAND_ARGS,
    MAX_ENV,
    MAX_TOLERATIONS,
    MAX_VOLUMES,
    NAME_MAX,
    ApiModel,
    Quantity,
)

VolumeType = Literal["pvc", "emptyDir", "secret"]
StorageMedium = Literal["", "Memory"]

_DNS_LABEL_RE: Final = re.compile(DNS_LABEL_PATTERN)

_PRESERVE: dict[str, Any] = {"x-kubernetes-preserve-unknown-fields": True}


class KeySelector(ApiModel):
    """A key of a ConfigMap or Secret (core `ConfigMapKeySelector` / `SecretKeySelector`)."""

    name: str = Field(
        max_length=NAME_MAX, description="Name of the ConfigMap or Secret, in the run's namespace."
    )
    key: str = Field(max_length=NAME_MAX, description="The key whose value becomes the variable's value.")
    optional: bool | None = Field(
        default=None, description="When true, a missing object or key leaves the variable unset."
    )


class FieldRef(ApiModel):
    """A field of the pod (core `ObjectFieldSelector`), e.g. metadata.name."""

    field_path: str = Field(max_length=NAME_MAX, description="Path of the pod field, e.g. metadata.name.")
    api_version: str | None = Field(
        default=None, max_length=NAME_MAX, description="API version the path is written in (default v1)."
    )


class ResourceFieldRef(ApiModel):
    """A container resource (core `ResourceFieldSelector`), e.g. limits.memory."""

    resource: str = Field(
        max_length=NAME_MAX, description="The resource, e.g. limits.cpu or requests.memory."
    )
    container_name: str | None = Field(
        default=None, max_length=NAME_MAX, description="Container whose resource is read (default: this one)."
    )
    divisor: Quantity | None = Field(default=None, description="Unit the value is expressed in (default 1).")


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from (core `EnvVarSource`).

    Unknown keys are kept (and passed to the pod) so newer Kubernetes sources keep working.
    """

    model_config = ConfigDict(extra="allow", json_schema_extra=_PRESERVE)

    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod, e.g. metadata.name.")
    resource_field_ref: ResourceFieldRef | None = Field(
        default=None, description="A resource limit or request of the container."
    )


class EnvVar(ApiModel):
    """One environment variable (core `EnvVar`)."""

    name: str = Field(min_length=1, max_length=NAME_MAX, description="Variable name.")
    value: str | None = Field(
        default=None, description="Literal value; $(VAR) references to earlier variables are expanded."
    )
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a ConfigMap, Secret, pod field or resource instead."
    )


class ResourceRequirements(ApiModel):
    """CPU/memory requests and limits (core `ResourceRequirements`)."""

    limits: dict[str, Quantity] | None = Field(
        default=None, description="Maximum resources, e.g. {cpu: '2', memory: 4Gi}."
    )
    requests: dict[str, Quantity] | None = Field(
        default=None, description="Resources reserved for scheduling, e.g. {cpu: 500m, memory: 1Gi}."
    )


class Toleration(ApiModel):
    """A pod toleration (core `Toleration`)."""

    key: str | None = Field(
        default=None, max_length=NAME_MAX, description="Taint key; empty with Exists = all."
    )
    operator: str | None = Field(default=None, description="Equal (default) or Exists.")
    value: str | None = Field(default=None, description="Taint value to match with operator Equal.")
    effect: str | None = Field(
        default=None, description="NoSchedule, PreferNoSchedule or NoExecute; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


class WorkloadVolume(ApiModel):
    """A volume mounted into the step's container; `pvc` volumes carry state between loop iterations."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(
            rules.VOLUME_PVC_CLAIM, rules.VOLUME_SECRET_NAME, rules.VOLUME_MOUNT_PATH
        )
    )

    name: str = Field(
        max_length=DNS_LABEL_MAX,
        description=(
            "Volume name: a DNS label (it names the pod's volume), unique in the workload; "
            "loop.state.volumeNames refers to it."
        ),
        json_schema_extra=rules.validations(rules.VOLUME_NAME),
    )
    type: VolumeType = Field(description="pvc (persistent, shared by iterations), emptyDir or secret.")
    mount_path: str = Field(max_length=4096, description="Absolute path the volume is mounted at.")
    read_only: bool | None = Field(default=None, description="Mount read-only (default false).")
    claim_name: str | None = Field(
        default=None, max_length=NAME_MAX, description="PersistentVolumeClaim name; required for type pvc."
    )
    secret_name: str | None = Field(
        default=None, max_length=NAME_MAX, description="Secret name; required for type secret."
    )
    size_limit: Quantity | None = Field(default=None, description="Size limit of an emptyDir, e.g. 1Gi.")
    medium: StorageMedium | None = Field(
        default=None, description="emptyDir medium: '' (node disk, default) or Memory (tmpfs)."
    )

    @model_validator(mode="after")
    def _check(self) -> WorkloadVolume:
        """Mirror of the CRD's volume rules."""
        if self.type == "pvc" and self.claim_name is None:
            raise ValueError(rules.VOLUME_PVC_CLAIM.message)
        if self.type == "secret" and self.secret_name is None:
            raise ValueError(rules.VOLUME_SECRET_NAME.message)
        return self

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        """Mirror of the CRD rule: the name becomes the pod's volume name, which must be a DNS label
        (an empty or upper-case name would pass admission here and be refused on the Job create)."""
        if not _DNS_LABEL_RE.fullmatch(value):
            raise ValueError(rules.VOLUME_NAME.message)
        return value

    @field_validator("mount_path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """Mirror of the CRD rule: a relative mount path has no meaning in a container."""
        if not value.startswith("/"):
            raise ValueError(rules.VOLUME_MOUNT_PATH.message)
        return value


class Workload(ApiModel):
    """What runs in a step's pod. A step's workload overrides the run's field by field."""

    image: str | None = Field(default=None, max_length=1024, description="Container image.")
    command: list[str] | None = Field(
        default=None, max_length=MAX_COMMAND_ARGS, description="Entrypoint; $(VAR) is expanded from the env."
    )
    args: list[str] | None = Field(
        default=None, max_length=MAX_COMMAND_ARGS, description="Arguments; $(VAR) is expanded from the env."
    )
    env: list[EnvVar] | None = Field(
        default=None,
        max_length=MAX_ENV,
        description="Extra environment variables (core EnvVar, incl. valueFrom).",
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="CPU/memory requests and limits of the container."
    )
    volumes: list[WorkloadVolume] | None = Field(
        default=None,
        max_length=MAX_VOLUMES,
        description="Volumes to mount; a step's list replaces the run's list as a whole.",
        json_schema_extra={
            **rules.validations(rules.VOLUME_NAMES_UNIQUE),
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=NAME_MAX,
        description="Service account of the pod; without it no API token is mounted.",
    )
    node_selector: dict[str, str] | None = Field(
        default=None, description="Node labels the pod must be scheduled on."
    )
    tolerations: list[Toleration] | None = Field(
        default=None, max_length=MAX_TOLERATIONS, description="Taints the pod tolerates."
    )

    @field_validator("volumes")
    @classmethod
    def _unique_volumes(cls, value: list[WorkloadVolume] | None) -> list[WorkloadVolume] | None:
        """Mirror of the CRD's unique-name rule (which is also a list-map key)."""
        if value is not None:
            names = [v.name for v in value]
            if len(set(names)) != len(names):
                raise ValueError(rules.VOLUME_NAMES_UNIQUE.message)
        return value
