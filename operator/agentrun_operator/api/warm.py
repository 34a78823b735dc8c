"""Warm iterations (`loop.warm`): a loop's iterations reuse one live pod while they succeed
(docs/concepts.md#warm-iterations). The model mirrors its CRD rules (`rules`) with the same message."""

from __future__ import annotations

from typing import Final

from pydantic import Field, field_validator

from . import rules
from .base import ApiModel

DEFAULT_WARM_IDLE_SECONDS: Final = 300
MAX_WARM_IDLE_SECONDS: Final = 3600


class LoopWarm(ApiModel):
    """One pod runs the loop's iterations one after the other; the operator still decides each."""

    enabled: bool = Field(
        default=True,
        description=(
            "true: the pod that ran an iteration runs the next one too, told by the operator, instead "
            "of a new Job and pod each time (a failed attempt, a pod that ended or a changed pod spec "
            "starts a new pod). Needs the workload's command and /bin/sh in its image."
        ),
    )
    idle_seconds: int = Field(
        default=DEFAULT_WARM_IDLE_SECONDS,
        description=(
            f"How long the pod waits for the next iteration, 1..{MAX_WARM_IDLE_SECONDS} (default "
            f"{DEFAULT_WARM_IDLE_SECONDS}), after its last one was recorded; then it ends, and the next "
            "iteration starts a new pod."
        ),
        json_schema_extra=rules.validations(rules.WARM_IDLE_SECONDS),
    )

    @field_validator("idle_seconds")
    @classmethod
    def _idle(cls, value: int) -> int:
        """Mirror of the CRD rule."""
        if not 1 <= value <= MAX_WARM_IDLE_SECONDS:
            raise ValueError(rules.WARM_IDLE_SECONDS.message)
        return value
