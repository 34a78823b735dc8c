"""What to do when a run or a step stops at run time: every stop reason's fix and its section in
docs/troubleshooting.md (`#<reason in lower case>`), appended to the stop message in one format,
`message (fix: …; see docs/troubleshooting.md#<reason>)` -- the runtime counterpart of an admission
problem's `(value: …; fix: …; see docs/…#anchor)` (problem.py).

The normal ends of a step (`LoopConditionFalse`, `LoopMaxIterationsReached` as a success, an
approval, a cancel) need no fix and get none; every other stop does (`needs_remedy`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from agentrun_operator.planner.context import MAX_MESSAGE_CHARS, clip

TROUBLESHOOTING: Final = "docs/troubleshooting.md"

_ATTEMPT_FAILED: Final = (
    "read the failed attempt's whole log (the `agentrun logs` command above) and fix its cause; raise "
    "`retries` or `timeoutSeconds` if the failure is transient or the work slow"
)

REMEDIES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "StepFailed": _ATTEMPT_FAILED,
        "LoopIterationFailed": _ATTEMPT_FAILED,
        "LoopConditionError": "make every iteration write one JSON object (at most 4 KiB) to "
        "$AGENTRUN_LOOP_CONTROL_PATH, guard optional fields in CEL with has(...), or choose "
        "`onMissing`/`onInvalid: stop` to end the loop successfully instead",
        "LoopBudgetExhausted": "raise `loop.budget` (maxTokens, maxCostUSD), make the attempts cheaper, or "
        "set `onBudgetExhausted: Succeed` if reaching the budget is an acceptable end",
        "LoopStalled": "find why the iterations stopped changing `loop.stall.progress` (their logs and "
        "files), raise `loop.stall.window`, or report a finer progress measure",
        "LoopMaxIterationsReached": "raise `maxIterations` (within the operator's cap), make the loop "
        "converge sooner, or set `onMaxIterations: Succeed`",
        "LoopItemsExceedMaxIterations": "raise `maxIterations` (within the operator's cap) or make "
        "`loop.items` return fewer items",
        "WhenConditionError": "fix the `when` expression; guard optional fields with has(...) "
        "(`agentrun validate` checks it compiles)",
        "SwitchNoMatch": "add a case with this value or a `default` to the switch (docs/concepts.md#switch)",
        "SwitchExpressionError": "fix `switch.expression`; guard optional fields with has(...)",
        "ApprovalRejected": "address the reviewer's reason and create a new AgentRun",
        "ApprovalTimedOut": "decide the gate within `approval.timeoutSeconds` (`agentrun approve|reject`), "
        "raise it, or set `onTimeout: Approve`",
        "WorkflowTimedOut": "raise `spec.workflow.timeoutSeconds` or make the steps faster, and create a "
        "new AgentRun",
        "GoalTokenBudgetExhausted": "raise `spec.goal.tokenBudget` or make the work cheaper (the usage in "
        "status shows where it went), and create a new AgentRun",
        "JobRefused": "correct the field the API server names and create a new AgentRun",
        "StatusRefused": "correct the field the API server names (or the policy that refuses the write) "
        "and create a new AgentRun",
        "IdempotencyKeyInUse": "wait for the run holding the key and read its result, or use a new "
        "`idempotencyKey`",
        "IdempotencyKeyCompleted": "read the result of the run that holds the key, or use a new "
        "`idempotencyKey` to run the work again",
    }
)
"""The fix of every runtime stop reason; its docs anchor is the reason in lower case."""

_HAS_REMEDY: Final = re.compile(r"fix: .*see docs/[\w-]+\.md#[\w-]+")


def docs_of(reason: str) -> str:
    """`docs/troubleshooting.md#<reason in lower case>`: the section about a stop reason."""
    return f"{TROUBLESHOOTING}#{reason.lower()}"


def needs_remedy(phase: str, reason: str | None) -> bool:
    """Whether a stop tells the user what to do: every failure, and a loop that succeeded although
    what its iterations reported was unusable (`onInvalid: stop`)."""
    if reason is None or reason not in REMEDIES:
        return False
    return phase == "Failed" or reason == "LoopConditionError"


def with_remedy(reason: str, message: str, *, fix: str | None = None, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`message (fix: …; see docs/troubleshooting.md#<reason>)` within `limit` characters -- the message
    is cut, never the remedy. A message that already carries a fix and an anchor (a failed child's,
    or each InvalidSpec problem's) is kept as it is."""
    if _HAS_REMEDY.search(message):
        return clip(message, limit)
    remedy = f" (fix: {fix or REMEDIES[reason]}; see {docs_of(reason)})"
    return clip(message, max(limit - len(remedy), 16)) + remedy
