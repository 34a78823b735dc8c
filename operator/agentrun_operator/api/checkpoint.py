"""A loop's checkpoints (`loop.checkpoint`) and a run resumed from another run's checkpoint
(`spec.resumeFrom`): loops that can undo (docs/concepts.md#checkpoints). Each model mirrors its CRD
rules (`rules`) with the same message."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, StringConstraints, field_validator

from . import rules
from .base import ApiModel

CheckpointMode = Literal["None", "Files"]
OnFailedAttempt = Literal["Keep", "Restore"]
DEFAULT_CHECKPOINT_KEEP: Final = 10
MAX_CHECKPOINT_KEEP: Final = 100
MAX_CHECKPOINT_EXCLUDES: Final = 32
MAX_EXCLUDE_LENGTH: Final = 512
DNS_SUBDOMAIN_MAX: Final = 253


class LoopCheckpoint(ApiModel):
    """A checkpoint of the state volume at every iteration's start, kept on the volume itself."""

    mode: CheckpointMode = Field(
        default="None",
        description=(
            "Files: before each iteration's main starts, its pod records the state volume's files in "
            "an object store on the volume (.agentrun/checkpoints; cost grows with what changed). "
            "None (default): no checkpoints."
        ),
    )
    on_failed_attempt: OnFailedAttempt = Field(
        default="Keep",
        description=(
            "Restore: a retry first puts the volume back to its iteration's start (files written, "
            "deleted or created by the failed attempt undone). Keep (default): a retry sees what the "
            "failed attempt left."
        ),
    )
    keep: int = Field(
        default=DEFAULT_CHECKPOINT_KEEP,
        description=f"Checkpoints kept per loop, 1..{MAX_CHECKPOINT_KEEP} (older ones are pruned).",
        json_schema_extra=rules.validations(rules.CHECKPOINT_KEEP),
    )
    exclude: list[Annotated[str, StringConstraints(min_length=1, max_length=MAX_EXCLUDE_LENGTH)]] | None = (
        Field(
            default=None,
            max_length=MAX_CHECKPOINT_EXCLUDES,
            description=(
                "Paths relative to the state volume's mountPath that are neither recorded nor restored "
                "(each with everything under it), e.g. a cache directory."
            ),
            json_schema_extra={
                **rules.validations(rules.CHECKPOINT_EXCLUDE_RELATIVE),
                "x-kubernetes-list-type": "set",
            },
        )
    )

    @field_validator("keep")
    @classmethod
    def _keep(cls, value: int) -> int:
        """Mirror of the CRD rule: at least the iteration's own checkpoint, at most 100."""
        if not 1 <= value <= MAX_CHECKPOINT_KEEP:
            raise ValueError(rules.CHECKPOINT_KEEP.message)
        return value

    @field_validator("exclude")
    @classmethod
    def _relative(cls, value: list[str] | None) -> list[str] | None:
        """Mirror of the CRD rule: a path inside the volume, not above it or absolute."""
        for entry in value or []:
            if not relative_inside(entry):
                raise ValueError(rules.CHECKPOINT_EXCLUDE_RELATIVE.message)
        if value is not None and len(set(value)) != len(value):
            raise ValueError("loop.checkpoint.exclude lists a path twice; list each path once.")
        return value

    @property
    def enabled(self) -> bool:
        return self.mode != "None"


def relative_inside(path: str) -> bool:
    """True for a relative path that stays inside its root (no leading '/', no '..' component)."""
    return not path.startswith("/") and ".." not in path.split("/")


MIN_CANDIDATES: Final = 2
MAX_CANDIDATES: Final = 8
MAX_SELECT_LENGTH: Final = 4096


class LoopCandidates(ApiModel):
    """Best-of-N: every iteration runs `count` candidates at once, each on its own copy of the
    iteration's start checkpoint; `select` picks the one whose files the loop keeps
    (docs/concepts.md#candidates)."""

    count: int = Field(
        description=f"Candidates per iteration, {MIN_CANDIDATES}..{MAX_CANDIDATES}: one pod each, at once.",
        json_schema_extra=rules.validations(rules.CANDIDATES_COUNT),
    )
    select: str = Field(
        min_length=1,
        max_length=MAX_SELECT_LENGTH,
        description=(
            "CEL giving the winner's index (an int) from `candidates`: the candidates whose main "
            "succeeded, each {index, control} with its control file's JSON. E.g. the highest score: "
            "candidates.filter(c, candidates.all(o, o.control.score <= c.control.score))[0].index"
        ),
    )

    @field_validator("count")
    @classmethod
    def _count(cls, value: int) -> int:
        """Mirror of the CRD rule."""
        if not MIN_CANDIDATES <= value <= MAX_CANDIDATES:
            raise ValueError(rules.CANDIDATES_COUNT.message)
        return value


class ResumeFrom(ApiModel):
    """Start this run from another run's checkpoint: its workspace is the source run's state at the
    end of iteration `iteration` of its checkpointed loop (docs/concepts.md#resume)."""

    run: str = Field(
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        description="The source AgentRun's name (same namespace); its loop must have had loop.checkpoint.",
    )
    iteration: int = Field(
        description="The source loop's iteration whose end state this run starts from (1 or more).",
        json_schema_extra=rules.validations(rules.RESUME_ITERATION),
    )
    step: str | None = Field(
        default=None,
        min_length=1,
        max_length=DNS_SUBDOMAIN_MAX,
        description="The looping step (its name); default: the first step with loop.checkpoint.",
    )

    @field_validator("iteration")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError(rules.RESUME_ITERATION.message)
        return value
