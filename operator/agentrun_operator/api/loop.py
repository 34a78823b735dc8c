"""A step's `loop`: how many times it runs, while or until what, what it keeps and collects, and its
budget (docs/concepts.md#loops). Each model mirrors its CRD rules (`rules`) with the same message.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal, get_args

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from . import rules
from .base import (
    DNS_LABEL_MAX,
    MAX_CEL_LENGTH,
    MAX_ITERATIONS_SCHEMA,
    MAX_LOOP_INTERVAL_SECONDS,
    MAX_PATH_LENGTH,
    MAX_VOLUME_NAMES,
    ApiModel,
)
from .checkpoint import LoopCandidates, LoopCheckpoint
from .warm import LoopWarm

DEFAULT_CONTROL_PATH: Final = "/workspace/.agentrun/loop-control.json"
DEFAULT_OUTPUT_EXPRESSION: Final = "iteration.last.control.outputs"
_OUTPUT_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

ConditionType = Literal["cel"]
SourceType = Literal["file"]
OnMissing = Literal["stop", "fail"]
OnInvalid = Literal["stop", "fail"]
OnMaxIterations = Literal["Succeed", "Fail"]
OnBudgetExhausted = Literal["Succeed", "Fail"]
OnStall = Literal["Fail", "Succeed"]
MAX_STALL_WINDOW: Final = 100
LoopStopReason = Literal[
    "LoopMaxIterationsReached",
    "LoopConditionFalse",
    "LoopConditionError",
    "LoopIterationFailed",
    "LoopCancelled",
    "LoopItemsExceedMaxIterations",
    "LoopBudgetExhausted",
    "LoopStalled",
]
LOOP_STOP_REASONS: Final[tuple[str, ...]] = get_args(LoopStopReason)


class LoopConditionSource(ApiModel):
    """Where a conditional loop reads the control payload an iteration leaves behind."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.SOURCE_PATH_ABSOLUTE))

    type: SourceType = Field(default="file", description="Only file in v1alpha1.")
    path: str = Field(
        default=DEFAULT_CONTROL_PATH,
        min_length=1,
        max_length=MAX_PATH_LENGTH,
        description="Absolute path of the JSON control file inside the iteration's container.",
    )
    on_missing: OnMissing = Field(
        default="stop",
        description="When the iteration wrote no (new) control file: stop the loop or fail it.",
    )
    on_invalid: OnInvalid = Field(
        default="fail",
        description="When the payload is not a JSON object, too large, or the CEL fails: stop or fail.",
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        """Mirror of the CRD rule: relative paths have no meaning in a container."""
        if not value.startswith("/"):
            raise ValueError(rules.SOURCE_PATH_ABSOLUTE.message)
        return value


class LoopCondition(ApiModel):
    """When to run another iteration, decided by CEL over the last iteration's control payload."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.CONDITION_ONE_OF))

    type: ConditionType = Field(default="cel", description="Only cel in v1alpha1.")
    expression: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description="CEL; another iteration runs while it is true. Exclusive with until.",
    )
    until: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description="CEL; the loop stops once it is true. Exclusive with expression.",
    )
    source: LoopConditionSource = Field(
        default_factory=LoopConditionSource,
        description="Where the control payload is read from.",
        json_schema_extra={"default": {}},
    )

    @model_validator(mode="after")
    def _one_of(self) -> LoopCondition:
        """Mirror of the CRD rule: a condition needs exactly one direction."""
        if (self.expression is None) == (self.until is None):
            raise ValueError(rules.CONDITION_ONE_OF.message)
        return self


class LoopState(ApiModel):
    """Volumes that carry mutable state from one iteration to the next."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.STATE_REQUIRED_NEEDS_VOLUMES))

    required: bool = Field(
        default=False,
        description="When true, the listed volumes must resolve to pvc volumes before any Job runs.",
    )
    volume_names: list[Annotated[str, StringConstraints(min_length=1, max_length=63)]] | None = Field(
        default=None,
        max_length=MAX_VOLUME_NAMES,
        description="Names of effective workload volumes (step's, else run's) that hold the state.",
        json_schema_extra={
            **rules.validations(rules.STATE_VOLUME_NAMES_UNIQUE),
            "x-kubernetes-list-type": "set",
        },
    )

    @field_validator("volume_names")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        """Mirror of the CRD rule (also a list-type set)."""
        if value is not None and len(set(value)) != len(value):
            raise ValueError(rules.STATE_VOLUME_NAMES_UNIQUE.message)
        return value

    @model_validator(mode="after")
    def _required_needs_volumes(self) -> LoopState:
        """Mirror of the CRD rule: required state with no volume is a contradiction."""
        if self.required and not self.volume_names:
            raise ValueError(rules.STATE_REQUIRED_NEEDS_VOLUMES.message)
        return self


class LoopOutput(ApiModel):
    """Collect one value per successful iteration into a list later steps read as `outputs.<name>`."""

    name: str = Field(
        min_length=1,
        max_length=DNS_LABEL_MAX,
        description="Name of the collected list: outputs.<name> in CEL, a key of AGENTRUN_OUTPUTS in pods.",
        json_schema_extra=rules.validations(rules.OUTPUT_NAME),
    )
    expression: str = Field(
        default=DEFAULT_OUTPUT_EXPRESSION,
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description="CEL evaluated after each successful iteration; its value is appended to the list.",
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        """Mirror of the CRD rule: CEL reads it as outputs.<name>."""
        if not _OUTPUT_NAME_RE.match(value):
            raise ValueError(rules.OUTPUT_NAME.message)
        return value


class LoopBudget(ApiModel):
    """Upper bounds of the usage a loop's iterations report (`usage` in the control file)."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.BUDGET_POSITIVE))

    max_tokens: int | None = Field(
        default=None, description="Stop once input + output tokens reach this many (> 0)."
    )
    max_cost_usd: float | None = Field(
        default=None, alias="maxCostUSD", description="Stop once the cost in USD reaches this much (> 0)."
    )

    @model_validator(mode="after")
    def _positive(self) -> LoopBudget:
        """Mirror of the CRD rule: an empty or non-positive budget could never let an iteration run."""
        if (self.max_tokens is None and self.max_cost_usd is None) or any(
            v is not None and v <= 0 for v in (self.max_tokens, self.max_cost_usd)
        ):
            raise ValueError(rules.BUDGET_POSITIVE.message)
        return self


class LoopStall(ApiModel):
    """Stop a loop that stopped making progress: the last `window` progress values are all equal."""

    progress: str = Field(
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description=(
            "CEL evaluated after each successful iteration (any JSON value), e.g. "
            "iteration.last.control.outputs.remaining."
        ),
    )
    window: int = Field(
        default=3,
        description=f"How many equal values in a row mean a stall, 2..{MAX_STALL_WINDOW} (default 3).",
        json_schema_extra=rules.validations(rules.STALL_WINDOW),
    )
    on_stall: OnStall = Field(
        default="Fail", description="When the loop stalls (LoopStalled): Fail (default) or Succeed."
    )

    @field_validator("window")
    @classmethod
    def _window(cls, value: int) -> int:
        """Mirror of the CRD rule: one value is always equal to itself, so a window needs two."""
        if not 2 <= value <= MAX_STALL_WINDOW:
            raise ValueError(rules.STALL_WINDOW.message)
        return value


class StepLoop(ApiModel):
    """Run the step repeatedly: a fixed count, while a condition holds, or once per item."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(
            rules.LOOP_MAX_ITERATIONS, rules.CANDIDATES_NEED_CHECKPOINT, rules.WARM_EXCLUSIVE
        )
    )

    max_iterations: int = Field(
        description="Upper bound of iterations, 1..1000 (and at most the operator's cap, default 20).",
        json_schema_extra={"minimum": 1, "maximum": MAX_ITERATIONS_SCHEMA},
    )
    condition: LoopCondition | None = Field(
        default=None, description="Conditional loop; without it the loop runs exactly maxIterations times."
    )
    items: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_CEL_LENGTH,
        description="CEL giving a list: one iteration per item (forEach), evaluated once at loop start.",
    )
    on_max_iterations: OnMaxIterations = Field(
        default="Succeed",
        description="Outcome when a conditional loop reaches maxIterations: Succeed or Fail.",
    )
    state: LoopState | None = Field(default=None, description="Volumes that carry state between iterations.")
    output: LoopOutput | None = Field(
        default=None, description="Collect a value per successful iteration as outputs.<name>."
    )
    budget: LoopBudget | None = Field(
        default=None, description="Token and cost bounds over the usage the iterations report."
    )
    on_budget_exhausted: OnBudgetExhausted | None = Field(
        default=None,
        description="When the budget stops the loop (LoopBudgetExhausted): Fail (default) or Succeed.",
    )
    stall: LoopStall | None = Field(
        default=None,
        description="Stop the loop (LoopStalled) once its progress value repeats window times in a row.",
    )
    checkpoint: LoopCheckpoint | None = Field(
        default=None,
        description=(
            "Checkpoints of the state volume at each iteration's start: a retry can start from its "
            "iteration's start state, a new run can resume from an iteration's end."
        ),
    )
    candidates: LoopCandidates | None = Field(
        default=None,
        description=(
            "Best-of-N: each iteration runs count candidates at once on copies of its start "
            "checkpoint; select picks the winner, whose files the next iteration starts from. Needs "
            "checkpoint.mode: Files."
        ),
    )
    warm: LoopWarm | None = Field(
        default=None,
        description=(
            "Warm iterations: the pod that ran an iteration runs the next one too (one Job and pod for "
            "a run of successful iterations), told by the operator; each iteration is still decided "
            "and recorded as any other. Off without it."
        ),
    )
    interval_seconds: int = Field(
        default=0,
        description=(
            "Seconds between an iteration's end and the next iteration's start, "
            f"0..{MAX_LOOP_INTERVAL_SECONDS} (default 0: at once); no pod runs while the loop waits "
            "(status loop.nextIterationAt)."
        ),
        json_schema_extra=rules.validations(rules.LOOP_INTERVAL),
    )

    @field_validator("max_iterations")
    @classmethod
    def _range(cls, value: int) -> int:
        """Mirror of the CRD's minimum/maximum, with the human message."""
        if not 1 <= value <= MAX_ITERATIONS_SCHEMA:
            raise ValueError(rules.LOOP_MAX_ITERATIONS.message)
        return value

    @model_validator(mode="after")
    def _candidates_need_checkpoint(self) -> StepLoop:
        """Mirror of the CRD rule: candidates start from, and are kept as, checkpoints."""
        if self.candidates is not None and (self.checkpoint is None or self.checkpoint.mode != "Files"):
            raise ValueError(rules.CANDIDATES_NEED_CHECKPOINT.message)
        return self

    @model_validator(mode="after")
    def _warm_exclusive(self) -> StepLoop:
        """Mirror of the CRD rule: checkpoints and candidates are made by a new pod before `main`."""
        if self.warm_enabled and (
            self.candidates is not None or (self.checkpoint is not None and self.checkpoint.enabled)
        ):
            raise ValueError(rules.WARM_EXCLUSIVE.message)
        return self

    @property
    def warm_enabled(self) -> bool:
        return self.warm is not None and self.warm.enabled

    @field_validator("interval_seconds")
    @classmethod
    def _interval(cls, value: int) -> int:
        """Mirror of the CRD rule: a negative wait has no meaning, a wait over a day is a schedule."""
        if not 0 <= value <= MAX_LOOP_INTERVAL_SECONDS:
            raise ValueError(rules.LOOP_INTERVAL.message)
        return value
