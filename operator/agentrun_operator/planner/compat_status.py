"""Status fields of the original API that a run records before its first Job (docs/api.md#status):
`specHash`, `systemPromptHash` and `contract{requiredKeys, missingKeys}`. Deterministic from the run
and the referenced objects, so recording them again on the next reconcile changes nothing."""

from __future__ import annotations

import hashlib
import json

from agentrun_operator.api.status import ContractStatus
from agentrun_operator.planner.compat import step_tasks
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.contract import contract_check
from agentrun_operator.planner.validate import resolve_references
from agentrun_operator.resolution import effective_parameters


def _sha256(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def record(ctx: PlanContext) -> None:
    """Set the three fields from the run as it is (before its first Job)."""
    status, run = ctx.status, ctx.run
    status.spec_hash = _sha256(json.dumps(run.spec.to_dict(), sort_keys=True, separators=(",", ":")))
    refs = resolve_references(run, ctx.observed).refs
    defaults = refs.agent.defaults if refs.agent is not None else None
    prompt = defaults.system_prompt if defaults is not None else None
    status.system_prompt_hash = _sha256(prompt) if prompt is not None else None
    required: list[str] = []
    missing: list[str] = []
    for node, _, task in step_tasks(run, refs):
        if task is None or task.contract is None:
            continue
        check = contract_check(task, effective_parameters(run, node.step))
        required += [k for k in check.required_keys if k not in required]
        missing += [k for k in check.missing_keys if k not in missing]
    status.contract = (
        ContractStatus(required_keys=required, missing_keys=missing or None) if required else None
    )
