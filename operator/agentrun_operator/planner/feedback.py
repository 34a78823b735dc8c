"""Feedback to the next attempt: `AGENTRUN_PREVIOUS` tells every iteration pod what the attempt and
the iteration before it did, so a retry does not start blind (docs/control-file.md#previous).

`{"attempt": {attempt, reason, exitCode, message} | null, "iteration": {index, phase, control} | null}`,
compact JSON of at most 4 KiB: `attempt` is the previous attempt of this iteration (null on attempt
1), `iteration` the previous iteration of the loop the pod runs in (its own, else the nearest loop
body's; null in iteration 1 and outside loops). Why an attempt failed is kept in the step's status
(`lastFailure`) when it fails, because the failed Job and its pod may be gone (a TTL, a node) by the
time its retry starts after the backoff.
"""

from __future__ import annotations

import json
from typing import Any, Final

from agentrun_operator.api import AttemptFailure
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.observed import ObservedJob
from agentrun_operator.planner.state import StepView

MAX_PREVIOUS_BYTES: Final = 4096
"""The bound of AGENTRUN_PREVIOUS (compact JSON, UTF-8)."""

MAX_TAIL_BYTES: Final = 1536
"""How much of the end of main's termination message the failure keeps (errors come last)."""

REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_VANISHED: Final = "JobVanished"
REASON_DELETED: Final = "JobDeleted"
REASON_POD_FAILED: Final = "PodFailed"
REASON_REPORTER_BLIND: Final = "ReporterCannotSeeMain"
"""The pod shares no PID namespace: its reporter could never see `main` end (it refused to start it)."""
REASON_REPORTER_LOST: Final = "ReporterEndedBeforeMain"
"""The reporter ended before it was ready, so `main`'s gate stays shut and it never starts."""


def tail(text: str, limit: int) -> str:
    """The last `limit` bytes of `text` (whole characters), with `…` in front when cut."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return "…" + data[len(data) - limit + 3 :].decode(errors="ignore")


def failure_of(
    ctx: PlanContext, attempt: int, job: ObservedJob | None, cause: str, reason: str | None
) -> AttemptFailure:
    """What the next attempt is told about a failed one: the reason, main's exit code, and the cause
    with the tail (not the head) of main's termination message."""
    exit_code: int | None = None
    message = cause
    if job is not None and reason is None and job.outcome == REASON_DEADLINE:
        reason = REASON_DEADLINE
    if job is not None and reason is None:
        for pod in ctx.observed.pods_of(job.name):
            if pod.main_exit_code == 0:  # the work ended well, the pod did not (the cause says why)
                reason = reason or pod.reason or REASON_POD_FAILED
                break
            if pod.main_exit_code is None and not pod.main_reason:
                continue
            exit_code = pod.main_exit_code
            reason = reason or pod.main_reason or "Error"
            message = f"main container exited with code {exit_code}"
            message += f" ({pod.main_reason})" if pod.main_reason else ""
            if pod.main_message and pod.main_message.strip():
                message += f": {tail(pod.main_message.strip(), MAX_TAIL_BYTES)}"
            break
    return AttemptFailure(
        attempt=attempt, reason=reason or REASON_POD_FAILED, exit_code=exit_code, message=message
    )


def _size(doc: dict[str, Any]) -> int:
    return len(json.dumps(doc, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())


def bounded(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` within MAX_PREVIOUS_BYTES: first the previous control goes (AGENTRUN_PREVIOUS_CONTROL
    has it whole), then the failure message is cut to its tail; `truncated` lists what was cut."""
    if _size(doc) <= MAX_PREVIOUS_BYTES:
        return doc
    doc = json.loads(json.dumps(doc))
    cut: list[str] = []
    iteration, attempt = doc.get("iteration"), doc.get("attempt")
    if iteration is not None and iteration.get("control") is not None:
        iteration["control"] = None
        cut.append("iteration.control")
    doc["truncated"] = cut
    if _size(doc) > MAX_PREVIOUS_BYTES and attempt is not None and attempt.get("message"):
        cut.append("attempt.message")
        over = _size(doc) - MAX_PREVIOUS_BYTES
        message = str(attempt["message"])
        attempt["message"] = tail(message, max(len(message.encode()) - over - 8, 16))
        while _size(doc) > MAX_PREVIOUS_BYTES and len(attempt["message"]) > 2:  # escapes counted twice
            attempt["message"] = tail(attempt["message"], len(attempt["message"].encode()) // 2)
    return doc


def _previous_iteration(step: StepView, iteration: int) -> dict[str, Any] | None:
    """The iteration before this one of the loop the pod runs in (its own, else the nearest body's)."""
    view: StepView | None = step
    while view is not None:
        loop = view.loop
        if loop is not None:
            index = iteration if view is step else view.iteration
            if index <= 1:
                return None
            record = next((r for r in loop.iterations if r.index == index - 1), None)
            phase = record.phase if record is not None else "Succeeded"  # only a success goes on
            return {"index": index - 1, "phase": phase, "control": loop.last_control}
        view = view.parent
    return None


def previous(step: StepView, iteration: int, attempt: int) -> dict[str, Any]:
    """AGENTRUN_PREVIOUS of the pod of `attempt` of `iteration` (see the module docstring)."""
    failure = step.st.last_failure
    last: dict[str, Any] | None = None
    if attempt > 1 and failure is not None:
        last = {
            "attempt": failure.attempt,
            "reason": failure.reason,
            "exitCode": failure.exit_code,
            "message": failure.message,
        }
    return bounded({"attempt": last, "iteration": _previous_iteration(step, iteration)})
