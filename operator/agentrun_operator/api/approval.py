"""Approval gates: a step kind that runs no Job and waits for a person (`approval`), and the decisions
people append to `spec.approvals` (`agentrun approve|reject`). docs/concepts.md#approval-gates.

Each model mirrors its CRD rules (`rules`) with the same message; `spec.approvals` is append-only,
which the API server enforces with a transition rule (docs/api.md#approvals).
"""

from __future__ import annotations

import re
from typing import Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from . import rules
from .base import DNS_LABEL_MAX, ApiModel

MAX_APPROVAL_INPUTS: Final = 20
MAX_APPROVALS: Final = 1000
MAX_INPUT_VALUE: Final = 1024
MAX_APPROVAL_MESSAGE: Final = 4096
MAX_REASON: Final = 1024
MAX_STEP_PATH: Final = 512
_INPUT_NAME_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

OnApprovalTimeout = Literal["Fail", "Approve"]
Decision = Literal["Approved", "Rejected"]


class ApprovalInput(ApiModel):
    """A value the approver gives with the decision; the gate's control `outputs.<name>`."""

    name: str = Field(
        min_length=1,
        max_length=DNS_LABEL_MAX,
        description="Identifier (CEL reads it as steps.<gate>.control.outputs.<name>).",
        json_schema_extra=rules.validations(rules.APPROVAL_INPUT_NAME),
    )
    required: bool = Field(default=False, description="An approval must give it (a rejection need not).")
    default: str | None = Field(
        default=None, max_length=MAX_INPUT_VALUE, description="The value when the approver gives none."
    )
    description: str | None = Field(default=None, max_length=1024, description="Shown to the approver.")

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        """Mirror of the CRD rule."""
        if not _INPUT_NAME_RE.match(value):
            raise ValueError(rules.APPROVAL_INPUT_NAME.message)
        return value


class StepApproval(ApiModel):
    """Wait for a person's decision instead of running a Job (an approval gate)."""

    model_config = ConfigDict(
        json_schema_extra=rules.validations(rules.APPROVAL_INPUTS_UNIQUE, rules.APPROVAL_TIMEOUT_APPROVE)
    )

    message: str = Field(
        min_length=1,
        max_length=MAX_APPROVAL_MESSAGE,
        description="What the approver is asked, shown to them.",
    )
    inputs: list[ApprovalInput] | None = Field(
        default=None,
        max_length=MAX_APPROVAL_INPUTS,
        description="Values the approver may (or, if required, must) give with an approval.",
    )
    timeout_seconds: int | None = Field(
        default=None, ge=1, description="Stop waiting after this many seconds (then onTimeout)."
    )
    on_timeout: OnApprovalTimeout = Field(
        default="Fail", description="When timeoutSeconds passes: Fail (default) or Approve (with defaults)."
    )

    @model_validator(mode="after")
    def _rules(self) -> StepApproval:
        """Mirrors of the CRD rules."""
        names = [i.name for i in self.inputs or []]
        if len(set(names)) != len(names):
            raise ValueError(rules.APPROVAL_INPUTS_UNIQUE.message)
        if self.on_timeout == "Approve" and any(i.required for i in self.inputs or []):
            raise ValueError(rules.APPROVAL_TIMEOUT_APPROVE.message)
        return self

    def outputs(self, given: dict[str, str] | None) -> dict[str, str]:
        """The gate's control outputs: every input's default, overlaid with what was given."""
        out = {i.name: i.default for i in self.inputs or [] if i.default is not None}
        out.update(given or {})
        return out


class ApprovalDecision(ApiModel):
    """One decision about one waiting gate; `spec.approvals` only ever grows (append-only)."""

    model_config = ConfigDict(json_schema_extra=rules.validations(rules.REJECT_NEEDS_REASON))

    step: str = Field(
        min_length=1,
        max_length=MAX_STEP_PATH,
        description="The gate's path as logs name it, e.g. develop/sign-off (no iterations).",
    )
    iteration: int = Field(
        default=1,
        ge=1,
        description="The iteration of the loop body holding the gate (the innermost one); 1 when none.",
    )
    decision: Decision = Field(description="Approved or Rejected.")
    inputs: dict[str, str] | None = Field(
        default=None,
        description="Values of the gate's declared inputs (approvals only).",
        json_schema_extra={
            "maxProperties": MAX_APPROVAL_INPUTS,
            "additionalProperties": {"type": "string", "maxLength": MAX_INPUT_VALUE},
        },
    )
    reason: str | None = Field(
        default=None, max_length=MAX_REASON, description="Why; required for a rejection."
    )

    @model_validator(mode="after")
    def _reason(self) -> ApprovalDecision:
        """Mirror of the CRD rule: a rejection must say why (the next attempt reads it)."""
        if self.decision == "Rejected" and not self.reason:
            raise ValueError(rules.REJECT_NEEDS_REASON.message)
        return self
