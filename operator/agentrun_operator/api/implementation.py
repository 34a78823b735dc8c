"""The task fields shared by an ImplementationSpec and a run's (or a step's) inline implementation.

Names, types and limits follow the original v1alpha1 API (docs/migration.md#what-you-change): the same
`text`, `summary`, `description`, `acceptanceCriteria`, `labels`, `source`, `vcsRef` and `contract`
in both places, so a task moves between an ImplementationSpec and `implementation.inline` unchanged.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field

from .base import MAX_ACCEPTANCE_CRITERIA, MAX_IMPLEMENTATION_TEXT, MAX_NAME_LIST, ApiModel
from .common import ObjectRef

SourceProvider = Literal["github", "linear", "manual", "custom"]
MAX_SUMMARY: Final = 1024
MAX_REQUIRED_KEYS: Final = 50
MAX_MAPPINGS: Final = 100
MAX_MAPPING_KEY: Final = 256
MAX_URL: Final = 2048


class ImplementationSource(ApiModel):
    """Where the task came from (provenance; recorded, not fetched)."""

    provider: SourceProvider = Field(
        description=(
            "github, linear, manual or custom; an Agent's security.allowedImplementationSourceProviders "
            "may restrict it."
        )
    )
    external_id: str | None = Field(
        default=None, description="The task's id in the provider, e.g. an issue number or PROJ-123."
    )
    url: str | None = Field(default=None, description="Link to the task in the provider.")


class ContractMapping(ApiModel):
    """One parameter mapping of a contract: the run's parameter `from` is also given as `to`."""

    from_: str = Field(
        alias="from", max_length=MAX_MAPPING_KEY, description="Parameter (or dotted path) to read."
    )
    to: str = Field(max_length=MAX_MAPPING_KEY, description="Parameter name it is also given as.")


class ImplementationContract(ApiModel):
    """What the task needs from the run's parameters (docs/api.md#implementation-contract)."""

    required_keys: list[str] | None = Field(
        default=None,
        max_length=MAX_REQUIRED_KEYS,
        description="Parameters every run of this task must set; a missing one is InvalidSpec.",
    )
    mappings: list[ContractMapping] | None = Field(
        default=None,
        max_length=MAX_MAPPINGS,
        description="Parameters copied to another name before requiredKeys are checked (from -> to).",
    )


class ImplementationFields(ApiModel):
    """The fields of a task, shared by ImplementationSpec.spec and implementation.inline."""

    text: str = Field(
        max_length=MAX_IMPLEMENTATION_TEXT, description="The task for the agent (at most 128 KiB)."
    )
    summary: str | None = Field(
        default=None, max_length=MAX_SUMMARY, description="One-line summary of the task."
    )
    description: str | None = Field(
        default=None,
        max_length=MAX_IMPLEMENTATION_TEXT,
        description="Longer description of the task (at most 128 KiB).",
    )
    acceptance_criteria: list[str] | None = Field(
        default=None, max_length=MAX_ACCEPTANCE_CRITERIA, description="Checks the result must pass."
    )
    labels: list[str] | None = Field(
        default=None, max_length=MAX_NAME_LIST, description="Free labels of the task (at most 256)."
    )
    source: ImplementationSource | None = Field(
        default=None, description="Where the task came from (provider, externalId, url)."
    )
    vcs_ref: ObjectRef | None = Field(
        default=None, description="VersionControlProvider of the task's repository (after the run's own)."
    )
    contract: ImplementationContract | None = Field(
        default=None, description="Parameters the task requires, and parameter mappings."
    )
