"""The models' statement of the CRD's transition rules: which spec changes are not allowed.

The API server enforces these rules (generated from `rules.py` into the CRD): a forbidden update is
refused and never stored, so `metadata.generation` does not move and the operator never sees it. The
operator does not check again on its own (it keeps no copy of the spec a run started with); this
function exists so the unit tests can show, case by case, that the models and the CRD rules agree
(`tests/fixtures/invalid_agentruns.py`; the integration tests send the same cases to a real API
server). See docs/api.md#immutability.
"""

from __future__ import annotations

from .agentrun import AgentRunSpec
from .rules import APPROVALS_APPEND_ONLY, APPROVALS_STICKY, CANCEL_STICKY, immutable_field, immutable_presence

MUTABLE_SPEC_FIELDS = frozenset({"cancel", "approvals"})


def immutability_violations(old: AgentRunSpec, new: AgentRunSpec) -> list[str]:
    """Messages (`spec.field: ...`) for every forbidden change from `old` to `new`; empty when allowed."""
    old_d = old.model_dump(by_alias=True, exclude_none=True)
    new_d = new.model_dump(by_alias=True, exclude_none=True)
    problems: list[str] = []
    fields = [f.alias or name for name, f in AgentRunSpec.model_fields.items()]
    frozen = [f for f in fields if f not in MUTABLE_SPEC_FIELDS]
    for key in frozen:
        if key in old_d and key in new_d and old_d[key] != new_d[key]:
            problems.append(f"spec.{key}: {immutable_field(key).message}")
    if any((key in old_d) != (key in new_d) for key in frozen):
        problems.append(f"spec: {immutable_presence(frozen).message}")
    if old.cancel is not None and new.cancel is None:
        problems.append(f"spec.cancel: {CANCEL_STICKY.message}")
    if old.approvals is not None and new.approvals is None:
        problems.append(f"spec.approvals: {APPROVALS_STICKY.message}")
    elif (
        old.approvals is not None
        and new.approvals is not None
        and new.approvals[: len(old.approvals)] != old.approvals
    ):
        problems.append(f"spec.approvals: {APPROVALS_APPEND_ONLY.message}")
    return problems
