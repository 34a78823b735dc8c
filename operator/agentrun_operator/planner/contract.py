"""An ImplementationSpec's `contract`, applied as the original controller applies it
(docs/api.md#implementation-contract).

The run's parameters become the task's *metadata*:

1. every parameter whose value is not blank, with surrounding whitespace trimmed;
2. the built-in mappings (`BUILTIN_MAPPINGS`, e.g. `repo` → `repository`), then the contract's
   `mappings`, in order: each copies `from` to `to` when `from` has a value and `to` has none;
3. the task fills what is still missing: `repository` and `issueNumber` from a github source's
   `externalId` written `owner/name#number`, `issueTitle` from `summary`, `issueBody` from `text`,
   `issueUrl` and `url` from `source.url`, `prompt` from `text` (else `summary`);
4. `requiredKeys` (trimmed, first occurrence kept) missing from the metadata are the missing keys
   (InvalidSpec, reason MissingRequiredMetadata, before any Job).

The metadata is what the pods get as the task's metadata (run.json); the run's own parameters are
not changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from agentrun_operator.api.implementation import ImplementationFields

BUILTIN_MAPPINGS: Final[tuple[tuple[str, str], ...]] = (
    ("repo", "repository"),
    ("issueRepository", "repository"),
    ("issue", "issueNumber"),
    ("issueId", "issueNumber"),
    ("issue_id", "issueNumber"),
    ("issue_number", "issueNumber"),
    ("title", "issueTitle"),
    ("body", "issueBody"),
    ("url", "issueUrl"),
    ("baseBranch", "base"),
    ("base_ref", "base"),
    ("baseRef", "base"),
    ("headBranch", "head"),
    ("head_ref", "head"),
    ("headRef", "head"),
    ("workflowStage", "stage"),
    ("codexStage", "stage"),
)
"""The mappings the original applies to every task before its contract's own."""


@dataclass(frozen=True)
class ContractCheck:
    """The task's metadata and its contract's keys."""

    metadata: dict[str, str]
    required_keys: tuple[str, ...]
    missing_keys: tuple[str, ...]


def _apply(metadata: dict[str, str], mappings: tuple[tuple[str, str], ...]) -> None:
    for source, target in mappings:
        value = metadata.get(source)
        if value and not metadata.get(target):
            metadata[target] = value


def _fill(metadata: dict[str, str], key: str, value: str | None) -> None:
    if value and not metadata.get(key):
        metadata[key] = value


def task_metadata(task: ImplementationFields | None, parameters: Mapping[str, str]) -> dict[str, str]:
    """Steps 1-3 of the module docstring: the metadata a task's run gives it."""
    metadata = {key: value.strip() for key, value in parameters.items() if value.strip()}
    _apply(metadata, BUILTIN_MAPPINGS)
    if task is None:
        return metadata
    contract = task.contract
    own = tuple(
        (m.from_.strip(), m.to.strip())
        for m in (contract.mappings or [] if contract is not None else [])
        if m.from_.strip() and m.to.strip()
    )
    _apply(metadata, own)
    source = task.source
    if source is not None and source.provider == "github" and source.external_id:
        repository, _, number = source.external_id.strip().partition("#")
        if (
            repository.strip()
            and number.strip()
            and not (metadata.get("repository") and metadata.get("issueNumber"))
        ):
            _fill(metadata, "repository", repository.strip())
            _fill(metadata, "issueNumber", number.strip())
    source_url = source.url if source is not None else None
    _fill(metadata, "issueTitle", task.summary)
    _fill(metadata, "issueBody", task.text)
    _fill(metadata, "issueUrl", source_url)
    _fill(metadata, "url", metadata.get("issueUrl"))
    _fill(metadata, "prompt", task.text or task.summary)
    return metadata


def contract_check(task: ImplementationFields, parameters: Mapping[str, str]) -> ContractCheck:
    """The metadata, the contract's required keys and those the metadata lacks."""
    metadata = task_metadata(task, parameters)
    keys: list[str] = []
    for key in task.contract.required_keys or [] if task.contract is not None else []:
        key = key.strip()
        if key and key not in keys:
            keys.append(key)
    missing = tuple(k for k in keys if not metadata.get(k))
    return ContractCheck(metadata, tuple(keys), missing)
