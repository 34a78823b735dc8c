"""What the planner asks the shell to do. The shell applies them in order and nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from agentrun_operator import naming


@dataclass(frozen=True)
class Where:
    """The step, iteration and attempt an action is about (the operator's log fields).

    `step` is the step's path in the tree (`develop/review`; a top-level step's name); `path` the
    same with the iteration of every looping ancestor (`develop/iteration 2/review`), None when it is
    `step` (a top-level step). `iteration` and `attempt` are 1-based; 0 means "not started yet"
    (e.g. `LoopStarted`).
    """

    step: str
    iteration: int
    attempt: int
    path: str | None = None


@dataclass(frozen=True)
class CreateJob:
    """Create this Job; if it already exists (same deterministic name) adopt it.

    `companions` are created first, each adopted when it exists by name (the runner contract's
    ConfigMap, whose name is a hash of its data: docs/api.md#runner-contract)."""

    manifest: dict[str, Any]
    companions: tuple[dict[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def warm_secret(self) -> str | None:
        """A warm loop's Job mounts the run's warm key: the name of that Secret, which the shell makes
        (with a new random key) or adopts before the Job (docs/design.md#warm-pod); None otherwise."""
        template = (self.manifest.get("spec") or {}).get("template") or {}
        if naming.LABEL_WARM not in (template.get("metadata") or {}).get("labels", {}):
            return None
        for volume in (template.get("spec") or {}).get("volumes", []):
            secret = volume.get("secret") or {}
            if volume.get("name") == naming.WARM_KEY_VOLUME and secret.get("secretName"):
                return str(secret["secretName"])
        return None

    @property
    def where(self) -> Where:
        """Read back from the Job's labels and annotations, which the Job builder set from the planned
        attempt (a nested step's path is in its `naming.ANNOTATION_STEP` annotation)."""
        meta = self.manifest["metadata"]
        labels = meta["labels"]
        path = (meta.get("annotations") or {}).get(naming.ANNOTATION_STEP)
        return Where(
            naming.tree_path(path) if path else str(labels[naming.LABEL_STEP]),
            int(naming.job_iteration(labels) or 1),
            int(labels[naming.LABEL_ATTEMPT]),
            path,
        )


@dataclass(frozen=True)
class WarmCommand:
    """Tell a warm pod's supervisor (docs/design.md#warm-channel) to `start` iteration `id` with `env`,
    that the result of `id` is recorded (`ack`), or to end (`stop`). Sent after the status that
    records why is committed; each is idempotent, so a plan made again sends it again harmlessly."""

    verb: Literal["start", "ack", "stop"]
    pod: str
    ip: str
    id: str
    env: tuple[tuple[str, str], ...] = ()
    where: Where | None = None


@dataclass(frozen=True)
class DeleteJob:
    """Delete a Job and its pods (background propagation), e.g. on cancel or an orphan.

    With `grace_seconds` (an immediate cancel) the Job's pods are deleted first with that grace
    period, selected by the Job's `uid`: the garbage collector deletes a Job's pods with their own
    grace period (Kubernetes' default 30 s unless the run asked), which a `main` that ignores SIGTERM
    would live out (docs/design.md#grace-period)."""

    name: str
    reason: str
    where: Where | None = None
    grace_seconds: int | None = None
    uid: str | None = None
    foreground: bool = False
    """Foreground propagation: the Job stays, being deleted, until the garbage collector has deleted
    its pods, so they stay in the run's view and hold the one-Job gate until they are gone (a warm
    Job's pod runs between attempts: its retry must not start beside it)."""


@dataclass(frozen=True)
class SetJobTTL:
    """The result of this Job is recorded: let the TTL controller remove it after `seconds` (None:
    remove the TTL a warm Job was created with, pod GC keeps it: planner/podgc.py)."""

    name: str
    seconds: int | None
    where: Where | None = None


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
    where: Where | None = None  # None for an Event about the whole run
    fold: bool = False
    """Routine progress of a warm loop (its hand-over, its decision): folds into the run's series
    even when its reason is a decision's, and a reconcile of only such Events is held, not posted
    at once (docs/operator.md#events)."""


@dataclass(frozen=True)
class DeleteRun:
    """`spec.ttlSecondsAfterFinished` has passed since the run finished: delete the AgentRun."""

    uid: str


@dataclass(frozen=True)
class Requeue:
    """Reconcile again after this many seconds even if nothing changes (backoff, timeouts)."""

    after_seconds: float


Action = (
    CreateJob | DeleteJob | SetJobTTL | ClaimIdempotencyKey | EmitEvent | DeleteRun | Requeue | WarmCommand
)
