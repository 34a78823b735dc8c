"""What the planner asks the shell to do. The shell applies them in order and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class CreateJob:
    """Create this Job; if it already exists (same deterministic name) adopt it."""

    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class DeleteJob:
    """Delete a Job and its pods (background propagation), e.g. on cancel or an orphan."""

    name: str
    reason: str


@dataclass(frozen=True)
class SetJobTTL:
    """The result of this Job is recorded: let the TTL controller remove it after `seconds`."""

    name: str
    seconds: int


@dataclass(frozen=True)
class ClaimIdempotencyKey:
    """Atomically create the claim object (create-or-conflict); a conflict is observed next time."""

    name: str
    agent_ref: str
    key: str


@dataclass(frozen=True)
class EmitEvent:
    """A Kubernetes Event on the AgentRun (docs/concepts.md#events)."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class DeleteRun:
    """`spec.ttlSecondsAfterFinished` has passed since the run finished: delete the AgentRun."""

    uid: str


@dataclass(frozen=True)
class Requeue:
    """Reconcile again after this many seconds even if nothing changes (backoff, timeouts)."""

    after_seconds: float


Action = CreateJob | DeleteJob | SetJobTTL | ClaimIdempotencyKey | EmitEvent | DeleteRun | Requeue
