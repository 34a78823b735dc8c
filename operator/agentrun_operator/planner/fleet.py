"""What the alerts need to know about all watched runs at once, as three numbers with no run in them.

The operator's metrics carry no run names (a label per run is a series per run, and Tekton's once
grew to a million series), so "a run has made no progress for an hour" is exported as the longest
such time over all runs; the alert says that one exists, and `kubectl get agentruns` (sorted by the
`updatedAt` column) says which (docs/operations.md#monitoring). Computed from the cache's raw
objects at each resync: parsing every status into the API models there would cost more than the rest
of the resync.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentrun_operator.planner.context import TERMINAL_RUN_PHASES

STATUS_SIZE_WARNING = "StatusSizeWarning"
AWAITING_APPROVAL = "AwaitingApproval"


@dataclass(frozen=True)
class FleetGauges:
    """`no_progress_max`: over unfinished runs that wait for nobody, the longest time since one's
    status last changed; `approval_wait_max`: the longest wait of an approval gate; `near_budget`:
    runs whose status is over 80 % of its budget. Seconds; 0 when no run qualifies."""

    no_progress_max: float = 0.0
    approval_wait_max: float = 0.0
    near_budget: int = 0


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _steps(steps: Any) -> Iterator[Mapping[str, Any]]:
    """Every step status at any depth (a group's or a switch's children under `steps`)."""
    for step in steps if isinstance(steps, list) else ():
        if isinstance(step, Mapping):
            yield step
            yield from _steps(step.get("steps"))


def summarize(runs: Iterable[Mapping[str, Any]], now: datetime) -> FleetGauges:
    """The gauges for `runs` (AgentRun objects as the API server serves them) at `now` (UTC, aware).

    A run makes progress whenever its status changes (`status.updatedAt`; its creation before any
    write). A run that waits on purpose does not count as stuck: a gate awaiting approval (that wait
    is the second gauge's), or a retry or next iteration scheduled for later (`nextRetryAt`,
    `loop.nextIterationAt`) until that time has come.
    """
    no_progress = approval = 0.0
    near = 0
    for run in runs:
        status = run.get("status") or {}
        conditions = status.get("conditions") or []
        if any(c.get("type") == STATUS_SIZE_WARNING and c.get("status") == "True" for c in conditions):
            near += 1
        if status.get("phase") in TERMINAL_RUN_PHASES:
            continue
        progressed = _time(status.get("updatedAt")) or _time(
            (run.get("metadata") or {}).get("creationTimestamp")
        )
        waiting = False
        for step in _steps((status.get("workflow") or {}).get("steps")):
            if step.get("phase") == AWAITING_APPROVAL:
                waiting = True
                since = _time(step.get("startedAt")) or progressed
                if since is not None:
                    approval = max(approval, (now - since).total_seconds())
            for due in (step.get("nextRetryAt"), (step.get("loop") or {}).get("nextIterationAt")):
                at = _time(due)
                if at is not None and (progressed is None or at > progressed):
                    progressed = at  # waiting on purpose until then
        if not waiting and progressed is not None:
            no_progress = max(no_progress, (now - progressed).total_seconds())
    return FleetGauges(
        no_progress_max=max(no_progress, 0.0), approval_wait_max=max(approval, 0.0), near_budget=near
    )
