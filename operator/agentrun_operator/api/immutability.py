"""The operator-side twin of the CRD's transition rules: which spec changes are not allowed.

The apiserver enforces these at admission; the operator re-checks on update events (a CRD applied
without rules, or an old object) so a changed spec can never silently alter a running workflow.
"""

from __future__ import annotations

from .agentrun import AgentRunSpec
from .rules import CANCEL_STICKY, immutable_field, immutable_presence

MUTABLE_SPEC_FIELDS = frozenset({"cancel"})


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
    return problems
